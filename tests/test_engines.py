"""Engine contract: every engine gives the episode the reference ``hf`` engine gives (float32), uses the
weights as they are when an episode starts, and keeps the rollout's stop and budget rules."""
from __future__ import annotations

import pytest
import torch

from lit_ascent.bench.engines import perturb
from lit_ascent.engines import ENGINES, close_engines, engine_for
from lit_ascent.engines.fused import FusedDecoder, FusedWeights, check_supported
from lit_ascent.engines.hf import IncrementalDecoder
from lit_ascent.envs import ScriptedEnv
from lit_ascent.rollout import RolloutConfig, rollout

IN_PROCESS = ["fused"]  # compared with hf on every run; vllm: tests/test_engine_vllm.py (its own environment)


def _perturb(model, seed: int | None, scale: float = 0.5) -> None:
    """An 'update': new non-zero LoRA B matrices, large enough to change a tiny model's tokens
    (seed None: zero, the fresh adapter)."""
    perturb(model, scale if seed is not None else 0.0, seed or 0)


def _episode(policy, env, engine, **cfg):
    cfg = RolloutConfig(**{"max_turns": 4, "max_new_tokens": 12, **cfg}, engine=engine)
    return rollout(policy.model, policy.tokenizer, env, env.tasks()[1], cfg)


def _same(a, b) -> None:
    assert a.token_ids == b.token_ids
    assert a.roles == b.roles and a.turn_ids == b.turn_ids
    assert [(t.text, t.action, t.valid, t.span) for t in a.turns] == [(t.text, t.action, t.valid, t.span) for t in b.turns]
    assert a.verified == b.verified


@pytest.mark.parametrize("engine", IN_PROCESS)
@pytest.mark.parametrize("stop_after_action", [True, False])
def test_engine_episode_equals_the_reference_before_and_after_an_update(policy, engine, stop_after_action):
    policy.model.eval()
    env = ScriptedEnv(num_tasks=2, episode_steps=6, verify_every=1)
    runs = []
    for seed in (None, 1, 2):  # the base, then two updates: the engine must never decode with stale weights
        if seed is not None:
            _perturb(policy.model, seed)
        ref = _episode(policy, env, "hf", stop_after_action=stop_after_action)
        got = _episode(policy, env, engine, stop_after_action=stop_after_action)
        _same(got, ref)
        runs.append(ref.token_ids)
    assert runs[0] != runs[1] != runs[2]  # the updates changed the episodes, so the comparison saw them
    close_engines(policy.model)


@pytest.mark.parametrize("engine", IN_PROCESS)
def test_engine_follows_a_disabled_adapter(policy, engine):
    policy.model.eval()
    _perturb(policy.model, 3)
    env = ScriptedEnv(num_tasks=2, episode_steps=6, verify_every=1)
    adapted = _episode(policy, env, engine)
    with policy.model.disable_adapter():
        base = _episode(policy, env, engine)
        _same(base, _episode(policy, env, "hf"))
    assert base.token_ids != adapted.token_ids
    _same(_episode(policy, env, engine), adapted)


@pytest.mark.parametrize("engine", ["hf", *IN_PROCESS])
def test_engine_stop_rules_and_budget(policy, engine):
    """Stop id included (closed), budget respected, should_stop cut after the token that triggers it."""
    policy.model.eval()
    _perturb(policy.model, 7)  # varied tokens, so a stop id can sit inside the output
    eng = engine_for(engine, policy.model)
    prompt = policy.tokenizer("<|im_start|>user\nhello<|im_end|>\n", add_special_tokens=False).input_ids
    dec = eng.decoder(set())
    dec.extend(prompt)
    free, closed = dec.generate(10)
    assert len(free) == 10 and not closed
    k = next(i for i in range(1, 10) if free[i] not in free[:i])
    dec = eng.decoder({free[k]})
    dec.extend(prompt)
    assert dec.generate(10) == (free[:k + 1], True)
    dec = eng.decoder(set())
    dec.extend(prompt)
    assert dec.generate(10, should_stop=lambda out: len(out) == 6) == (free[:6], False)
    # turns continue the same sequence: a second call after new ids equals one uninterrupted sequence
    dec = eng.decoder(set())
    dec.extend(prompt)
    first, _ = dec.generate(3)
    dec.extend(prompt[:5])
    second, _ = dec.generate(4)
    ref = IncrementalDecoder(policy.model, set())
    ref.extend(prompt + first[:-1])
    ref.generate(1)
    ref.extend(prompt[:5])
    assert second == ref.generate(4)[0]
    close_engines(policy.model)


def test_fused_logits_match_the_reference_on_long_prefill_and_decode(policy):
    policy.model.eval()
    _perturb(policy.model, 4, scale=0.05)
    ids = torch.randint(0, 250, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    ref, got = IncrementalDecoder(policy.model, set()), FusedDecoder(FusedWeights(policy.model), set())
    for dec in (ref, got):
        dec.trace = []
        dec.extend(ids)
        dec.generate(20)
    torch.testing.assert_close(torch.stack(got.trace), torch.stack(ref.trace), atol=1e-4, rtol=1e-4)


def _tiny(kind: str):
    import transformers

    cfg_cls = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
               "gemma": transformers.GemmaConfig}[kind]
    extra = {"qwen2": {}, "qwen3": {"head_dim": 8}, "gemma": {"head_dim": 8}}[kind]
    cfg = cfg_cls(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False, **extra)
    torch.manual_seed(0)
    lm = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a missed one would show
        for name, p in lm.named_parameters():
            if "norm" in name or "bias" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return lm


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_fused_runs_other_supported_families(kind):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_tiny(kind), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    _perturb(model, 5, scale=0.1)
    model.eval()
    ids = list(range(3, 60))
    ref, got = IncrementalDecoder(model, set()), FusedDecoder(FusedWeights(model), set())
    for dec in (ref, got):
        dec.trace = []
        dec.extend(ids)
        dec.generate(8)
    torch.testing.assert_close(torch.stack(got.trace), torch.stack(ref.trace), atol=1e-4, rtol=1e-4)


def test_fused_refuses_an_unsupported_model_naming_it():
    with pytest.raises(ValueError, match="model type 'gemma'.*engine: hf"):
        check_supported(_tiny("gemma"))


def test_fused_folds_again_only_after_the_weights_changed(policy):
    policy.model.eval()
    env = ScriptedEnv(num_tasks=2, episode_steps=6, verify_every=1)
    eng = engine_for("fused", policy.model)
    folds = lambda: eng.perf.get("folds", 0)  # noqa: E731
    _episode(policy, env, "fused")
    _episode(policy, env, "fused")
    assert folds() == 1
    _perturb(policy.model, 6)
    ep = _episode(policy, env, "fused")
    assert folds() == 2 and ep.timings["engine_folds"] == 1
    close_engines(policy.model)


def test_unknown_engine_fails_at_parse_time_naming_the_option():
    with pytest.raises(ValueError, match="rollout.engine must be one of"):
        RolloutConfig(engine="llamacpp")
    assert set(ENGINES) == {"hf", "fused", "vllm"}


def test_prompt_lookup_copies_what_followed_the_latest_match():
    from lit_ascent.engines.fused import prompt_lookup

    ids = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert prompt_lookup(ids, k=2, limit=10) == [7, 8]  # the latest earlier "1 2 3" wins
    assert prompt_lookup(ids, k=5, limit=3) == [7, 8, 5]  # the budget caps the draft
    assert prompt_lookup([4, 5, 6, 4], k=3, limit=3) == [5, 6, 4]  # 1-gram fallback
    assert prompt_lookup([4, 5, 6], k=3, limit=3) == []
    assert prompt_lookup(ids, k=3, limit=0) == []


@pytest.mark.parametrize("lookup", [0, 2, 8])
def test_prompt_lookup_keeps_the_greedy_tokens_in_fewer_forwards(policy, lookup):
    from lit_ascent.engines.fused import FusedDecoder, FusedWeights

    policy.model.eval()
    _perturb(policy.model, 8, scale=0.05)
    prompt = list(range(40, 80)) * 3  # a repetitive context, as an agent's history is
    weights = FusedWeights(policy.model)
    ref = FusedDecoder(weights, set(), lookup=0)
    got = FusedDecoder(weights, set(), lookup=lookup)
    calls = []
    step = got.rows.step
    got.rows.step = lambda *a: calls.append(1) or step(*a)
    for dec in (ref, got):
        dec.extend(prompt)
    assert got.generate(30) == ref.generate(30)
    got.extend([5, 6])  # the next turn continues from the kept ids only
    ref.extend([5, 6])
    assert got.generate(12) == ref.generate(12)
    assert (len(calls) < 42) == (lookup > 0)


def test_fused_rows_accept_drops_the_unused_tail_of_a_chain(policy, monkeypatch):
    """A turn that ends inside a step's chain of tokens (a stop id among verified drafts) keeps only
    its tokens: the next step continues from them, never from the dropped tail."""
    from lit_ascent.engines import fused

    policy.model.eval()
    weights = FusedWeights(policy.model)
    prompt = list(range(40, 80))
    ref = fused.FusedRows(weights, 1)  # no drafts: one greedy token per step
    ref.start(0, prompt)
    greedy = [ref.step()[0][0] for _ in range(12)]
    # an oracle draft: the greedy continuation itself, so every draft token is kept
    monkeypatch.setattr(fused, "prompt_lookup", lambda ids, k, limit: greedy[len(ids) - len(prompt):][:min(k, limit)])
    rows = fused.FusedRows(weights, 2, lookup=4)
    rows.start(1, prompt)
    assert rows.step({1: 20}) == {1: greedy[:5]}  # 4 drafts verified, plus the token after them
    rows.accept(1, 2)
    assert rows.history[1] == prompt + greedy[:2] and rows.unfed[1] == [greedy[1]]
    assert rows.caches[1].seen == len(prompt) + 1
    assert rows.step({1: 20}) == {1: greedy[2:7]}
    assert rows.step({1: 3}) == {1: greedy[7:10]}  # a limit of 3: a draft of 2 at most
    rows.release(1)
    assert rows.step() == {}


def test_an_engine_that_cannot_run_the_model_fails_the_run_at_start_up(monkeypatch):
    from lit_ascent.module import OaTTTModule
    from tests.conftest import TINY

    monkeypatch.setattr("lit_ascent.engines.fused.SUPPORTED", ("qwen2",))
    module = OaTTTModule(llm=TINY, rollout=RolloutConfig(engine="fused"))
    with pytest.raises(ValueError, match="fused cannot run this model: model type 'llama'"):
        module.configure_model()


def test_fused_folds_a_float32_adapter_into_bfloat16_weights():
    """PEFT keeps LoRA weights in float32 over a bf16 base; the folded weights stay bf16 and the
    logits stay close to the reference's (bf16 rounds differently: closeness, not equality)."""
    from dataclasses import replace

    from lit_ascent.models import load_policy
    from tests.conftest import TINY

    policy = load_policy(replace(TINY, dtype="bfloat16"))
    policy.model.eval()
    _perturb(policy.model, 9, scale=0.05)
    weights = FusedWeights(policy.model)
    assert weights.layers[0].qkv[0].dtype == torch.bfloat16
    ids = list(range(40, 120))
    ref, got = IncrementalDecoder(policy.model, set()), FusedDecoder(weights, set())
    for dec in (ref, got):
        dec.trace = []
        dec.extend(ids)
        dec.generate(6)
    torch.testing.assert_close(torch.stack(got.trace), torch.stack(ref.trace), atol=0.1, rtol=0.05)
