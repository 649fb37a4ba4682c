"""Held-out frozen evaluation: its metrics against a hand-made case, the float32 cast, the callback end to
end on the debug config, and its resume (the statistics: test_paired.py; the report's table:
test_report_heldout.py)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import TINY
from test_paired import newcombe_by_hand
from test_transfer import MemoryLogger

from callbacks.heldout import HeldOutEval, cast_weights, check_disjoint, heldout_metrics
from callbacks.stream_checkpoint import STATE_FILE, load_state
from datamodules import TaskStreamDataModule
from lit_ascent.cli import main
from lit_ascent.envs import ScriptedEnv
from lit_ascent.models import load_policy
from lit_ascent.module import OaTTTModule
from lit_ascent.objectives import Distillation
from lit_ascent.results import paired
from lit_ascent.rollout import RolloutConfig
from lit_ascent.trajectory import Task

DEBUG = str(Path(__file__).resolve().parents[1] / "configs" / "debug.yaml")


class OffsetScriptedEnv(ScriptedEnv):
    """ScriptedEnv whose task ids start at ``first`` (task-100, ...): a held-out set disjoint from the stream."""

    def __init__(self, num_tasks: int = 4, episode_steps: int = 2, verify_every: int = 2, first: int = 100):
        super().__init__(num_tasks, episode_steps, verify_every)
        self.first = first

    def tasks(self) -> list[Task]:
        return [Task(self.name, f"task-{self.first + k}") for k in range(self.num_tasks)]


def records(outcomes: str, model: str = "adapted", tasks_seen: int = 8) -> list[dict]:
    """Held-out records from a string of 1/0 outcomes, task k = 'h<k>'."""
    return [{"model": model, "tasks_seen": tasks_seen, "task_index": k, "task_id": f"h{k}", "verified": v == "1",
             "turns": 3 if v == "1" else 5, "invalid": 0 if v == "1" else 1} for k, v in enumerate(outcomes)]


def test_heldout_metrics_against_a_hand_made_case():
    # 12 tasks: both solve h0-h2, only adapted h3-h7 (5), only initial h8 (1), neither h9-h11
    adapted, initial = records("111111110000"), records("111000001000", "initial", 0)
    m = heldout_metrics(adapted, initial)
    assert m["heldout/success_rate"] == pytest.approx(8 / 12)
    assert m["heldout/initial_success_rate"] == pytest.approx(4 / 12)
    assert m["heldout/turns"] == pytest.approx((8 * 3 + 4 * 5) / 12)
    assert m["heldout/invalid_rate"] == pytest.approx(4 / (8 * 3 + 4 * 5))
    assert (m["heldout/only_adapted"], m["heldout/only_initial"]) == (5.0, 1.0)
    # exact McNemar on 6 discordant tasks: 2 * P(Binomial(6, 1/2) <= 1) = 2 * 7 / 64
    assert m["heldout/mcnemar_p"] == pytest.approx(14 / 64) == paired.mcnemar_exact_p(5, 1)
    assert (m["heldout/diff_low"], m["heldout/diff_high"]) == pytest.approx(newcombe_by_hand(3, 5, 1, 3), abs=1e-12)
    assert set(heldout_metrics(adapted, [])) == {"heldout/success_rate", "heldout/turns", "heldout/invalid_rate"}


def test_disjointness_names_the_argument():
    stream = [Task("scripted", "task-1"), Task("scripted", "task-2")]
    check_disjoint([Task("scripted", "task-100"), Task("other", "task-1")], stream)
    with pytest.raises(ValueError, match=r"heldout\.env.*task-2"):
        check_disjoint([Task("scripted", "task-2")], stream)


@pytest.mark.parametrize("kwargs, name", [({"num_tasks": 0}, "num_tasks"), ({"every_n_tasks": -1}, "every_n_tasks"),
                                          ({"batch_size": 0}, "batch_size"), ({"dtype": "fp32"}, "dtype"),
                                          ({"filename": "a/b.jsonl"}, "filename")])
def test_bad_arguments_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=rf"heldout\.{name}"):
        HeldOutEval(ScriptedEnv(), **kwargs)


# -- the float32 cast -------------------------------------------------------------------------------
def test_cast_weights_is_exact_and_keeps_the_parameter_objects():
    torch.manual_seed(0)
    policy = load_policy(replace(TINY, dtype="bfloat16"))
    model = policy.model
    before = {n: (p, p.dtype, p.detach().clone()) for n, p in model.named_parameters()}
    assert {p.dtype for _, p in model.named_parameters()} == {torch.bfloat16, torch.float32}  # base bf16, LoRA fp32
    with cast_weights(model, torch.float32):
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert all(b.dtype == torch.float32 for b in model.buffers() if b.is_floating_point())
    with cast_weights(model, torch.float16):  # narrowing: the originals are kept aside
        assert all(p.dtype == torch.float16 for p in model.parameters())
    for name, p in model.named_parameters():
        obj, dtype, value = before[name]
        assert p is obj and p.dtype == dtype and torch.equal(p, value)


# -- the callback ------------------------------------------------------------------------------------
def stream_trainer(tmp_path, heldout, num_tasks=3, dtype="float32", logger=None):
    llm = replace(TINY, dtype=dtype)
    module = OaTTTModule(llm=llm, objective=Distillation(chunk_size=64),
                         rollout=RolloutConfig(max_turns=2, max_new_tokens=8))
    data = TaskStreamDataModule(ScriptedEnv(num_tasks=num_tasks, episode_steps=2, verify_every=1), seed=0)
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, logger=logger or MemoryLogger(), callbacks=[heldout],
                        default_root_dir=str(tmp_path), enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, log_every_n_steps=1)
    trainer.fit(module, datamodule=data)
    return trainer, module


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_callback_records_metrics_and_one_initial_evaluation(tmp_path):
    heldout = HeldOutEval(OffsetScriptedEnv(num_tasks=5), num_tasks=3, every_n_tasks=2, batch_size=2)
    logger = MemoryLogger()
    trainer, module = stream_trainer(tmp_path, heldout, logger=logger)
    lines = read_lines(tmp_path / "heldout.jsonl")
    assert [(r["model"], r["tasks_seen"]) for r in lines] == \
        [("initial", 0)] * 3 + [("adapted", 2)] * 3 + [("adapted", 3)] * 3
    assert [r["task_id"] for r in lines[:3]] == [t.task_id for t in heldout.tasks]
    assert all(r["task_id"].startswith("task-10") and {"verified", "turns", "invalid"} <= set(r) for r in lines)
    assert [s for s, _ in logger.logged("heldout/success_rate")] == [2, 3]
    assert [s for s, _ in logger.logged("heldout/initial_success_rate")] == [0, 2, 3]
    for key in ("heldout/turns", "heldout/invalid_rate", "heldout/only_adapted", "heldout/only_initial",
                "heldout/mcnemar_p", "heldout/diff_low", "heldout/diff_high"):
        assert len(logger.logged(key)) == 2, key
    assert module.counters["updates"] >= 1
    state = heldout.state_dict()
    assert state["initial"] == lines[:3] and state["offset"] == (tmp_path / "heldout.jsonl").stat().st_size


def test_bfloat16_policy_is_evaluated_in_float32_and_restored_bit_for_bit(tmp_path, monkeypatch):
    import callbacks.heldout as heldout_module

    seen = []

    def spy(policy, *args, **kwargs):
        seen.append({p.dtype for p in policy.model.parameters()})
        return evaluate(policy, *args, **kwargs)

    evaluate = heldout_module.evaluate
    monkeypatch.setattr(heldout_module, "evaluate", spy)
    heldout = HeldOutEval(OffsetScriptedEnv(num_tasks=2), batch_size=2)
    trainer, module = stream_trainer(tmp_path, heldout, num_tasks=2, dtype="bfloat16")
    assert seen == [{torch.float32}] * 2  # the initial model, then the adapted one at the end
    policy, optimizer = module.policy, trainer.optimizers[0]
    before = {n: (p, p.dtype, p.detach().clone()) for n, p in policy.model.named_parameters()}
    heldout._tasks_seen += 1  # a further evaluation point
    heldout.evaluate(trainer, module)
    for name, p in policy.model.named_parameters():
        obj, dtype, value = before[name]
        assert p is obj and p.dtype == dtype and torch.equal(p, value), name
    assert {torch.bfloat16} <= {p.dtype for p in policy.model.parameters()}
    held = [p for group in optimizer.param_groups for p in group["params"]]
    assert len(held) == len(policy.trainable_parameters())
    assert all(a is b for a, b in zip(held, policy.trainable_parameters()))


def test_disabled_by_default(tmp_path):
    heldout = HeldOutEval()
    stream_trainer(tmp_path, heldout, num_tasks=2)
    assert not (tmp_path / "heldout.jsonl").exists() and heldout.state_dict() == {}


# -- the config overlays and the CLI ---------------------------------------------------------------
CONFIGS = Path(DEBUG).parent


def parsed_heldout(*configs: str, extra: tuple[str, ...] = ()) -> tuple[HeldOutEval, object]:
    args = [a for c in configs for a in ("--config", str(CONFIGS / c))] + list(extra)
    cli = main(args, run=False)
    found = [c for c in cli.trainer.callbacks if isinstance(c, HeldOutEval)]
    assert len(found) == 1  # always present, once
    return found[0], cli


def test_heldout_is_off_unless_configured():
    heldout, _ = parsed_heldout("debug.yaml")
    assert heldout.env is None and not heldout.enabled


def test_textcraft_overlay_splits_the_goals_into_stream_and_heldout():
    from lit_ascent.envs.textcraft import TextCraftEnv

    heldout, cli = parsed_heldout("textcraft/ascent.yaml", "heldout/textcraft.yaml")
    stream_env = cli.datamodule.env.inner
    assert isinstance(heldout.env, TextCraftEnv) and isinstance(stream_env, TextCraftEnv)
    assert (stream_env.partition, heldout.env.partition) == ("stream", "heldout")
    assert stream_env.heldout_size == heldout.env.heldout_size == heldout.num_tasks == 64
    assert (stream_env.depths, stream_env.split) == (heldout.env.depths, heldout.env.split) == ((2,), "eval")
    settings = (heldout.batch_size, heldout.dtype, heldout.every_n_tasks, heldout.include_initial)
    assert settings == (8, "float32", 0, True)
    assert heldout.env._game is None and stream_env._game is None  # nothing built at parse time
    methods = parsed_heldout("textcraft/ascent.yaml", "heldout/textcraft.yaml", "methods/rft.yaml")[0]
    assert methods.env.partition == "heldout"  # a method overlay keeps the held-out settings


def test_alfworld_overlay_holds_out_valid_unseen():
    from lit_ascent.envs.alfworld import ALFWorldEnv

    heldout, cli = parsed_heldout("alfworld/ascent.yaml", "heldout/alfworld.yaml")
    assert isinstance(heldout.env, ALFWorldEnv) and heldout.env.split == "valid_unseen"
    assert cli.datamodule.env.inner.split == "valid_seen"
    assert heldout.num_tasks is None and heldout.env._tasks is None  # all 134 games, listed lazily


def test_cli_rejects_a_bad_value_naming_the_argument(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--config", DEBUG, "--heldout.batch_size", "0"], run=False)
    assert exit_.value.code == 2 and "heldout.batch_size" in capsys.readouterr().err


# -- the debug config through the CLI ------------------------------------------------------------
HELDOUT_ENV = json.dumps({"class_path": "test_heldout.OffsetScriptedEnv", "init_args": {"num_tasks": 3}})


def debug_args(tmp_path, *extra: str) -> list[str]:
    return ["fit", "--config", DEBUG, "--trainer.logger.init_args.save_dir", str(tmp_path),
            "--trainer.enable_progress_bar", "false", "--report.verbose", "false",
            "--adapter_checkpoint.every_n_tasks", "0", "--model.rollout.max_new_tokens", "6", *extra]


def test_debug_config_end_to_end_and_stream_unchanged(tmp_path):
    main(debug_args(tmp_path / "plain"))
    main(debug_args(tmp_path / "heldout", "--heldout.env", HELDOUT_ENV, "--heldout.batch_size", "2"))
    run = tmp_path / "heldout" / "debug" / "version_0"
    lines = read_lines(run / "heldout.jsonl")
    assert [(r["model"], r["tasks_seen"]) for r in lines] == [("initial", 0)] * 3 + [("adapted", 4)] * 3
    # the held-out evaluation leaves the stream exactly as it would have been
    plain = read_lines(tmp_path / "plain" / "debug" / "version_0" / "experience.jsonl")
    with_heldout = read_lines(run / "experience.jsonl")
    keys = ("task_id", "verified", "actions", "updates", "loss")
    assert [{k: r[k] for k in keys} for r in with_heldout] == [{k: r[k] for k in keys} for r in plain]


def test_debug_config_refuses_a_heldout_set_that_overlaps_the_stream(tmp_path):
    with pytest.raises(ValueError, match=r"heldout\.env"):
        main(debug_args(tmp_path, "--heldout.env", "lit_ascent.envs.ScriptedEnv"))


def test_initial_log_reuses_an_earlier_runs_initial_records_instead_of_playing_them(tmp_path, monkeypatch):
    import callbacks.heldout as heldout_module

    main(debug_args(tmp_path / "first", "--heldout.env", HELDOUT_ENV, "--heldout.batch_size", "2"))
    first = read_lines(tmp_path / "first" / "debug" / "version_0" / "heldout.jsonl")
    played = []
    evaluate = heldout_module.evaluate
    monkeypatch.setattr(heldout_module, "evaluate", lambda *a, **kw: played.append(1) or evaluate(*a, **kw))
    log = tmp_path / "first" / "debug" / "version_0" / "heldout.jsonl"
    main(debug_args(tmp_path / "second", "--heldout.env", HELDOUT_ENV, "--heldout.batch_size", "2",
                    "--heldout.initial_log", str(log)))
    second = read_lines(tmp_path / "second" / "debug" / "version_0" / "heldout.jsonl")
    assert played == [1]  # the adapted model only: the initial model's records came from the log
    assert second == first  # the same records, the initial ones copied, the adapted ones played again


def test_initial_log_of_other_tasks_or_without_initial_records_fails_naming_the_option(tmp_path):
    main(debug_args(tmp_path / "first", "--heldout.env", HELDOUT_ENV, "--heldout.batch_size", "2"))
    log = str(tmp_path / "first" / "debug" / "version_0" / "heldout.jsonl")
    with pytest.raises(ValueError, match=r"heldout\.initial_log .*2 held-out tasks"):
        main(debug_args(tmp_path / "fewer", "--heldout.env", HELDOUT_ENV, "--heldout.num_tasks", "2",
                        "--heldout.initial_log", log))
    with pytest.raises(ValueError, match=r"heldout\.initial_log: no file"):
        main(debug_args(tmp_path / "none", "--heldout.env", HELDOUT_ENV, "--heldout.initial_log", log + ".missing"))
    with pytest.raises(ValueError, match=r"heldout\.initial_log is set but heldout\.include_initial is false"):
        HeldOutEval(ScriptedEnv(), include_initial=False, initial_log=log)


class CrashAt(L.Callback):
    """Raises at the start of stream task ``index`` while $HELDOUT_TEST_CRASH is set (a crash mid-stream)."""

    def __init__(self, index: int = 2):
        self.index = index

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        import os

        if os.environ.get("HELDOUT_TEST_CRASH") and batch[0].index == self.index:
            raise RuntimeError("crash")


@pytest.mark.filterwarnings("ignore:Total length of")  # resumed after its last task: no batch left, on purpose
def test_resume_keeps_the_initial_outcomes_and_drops_records_after_the_checkpoint(tmp_path, monkeypatch):
    crash = json.dumps([{"class_path": "callbacks.VerificationGate"},
                        {"class_path": "test_heldout.CrashAt", "init_args": {"index": 3}}])
    # 4 tasks, a point after task 3 (checkpointed with it) and one at the end (after the last checkpoint)
    args = debug_args(tmp_path, "--heldout.env", HELDOUT_ENV, "--heldout.every_n_tasks", "3",
                      "--heldout.batch_size", "2", "--trainer.callbacks", crash)
    monkeypatch.setenv("HELDOUT_TEST_CRASH", "1")
    with pytest.raises(RuntimeError, match="crash"):
        main(args)
    path = tmp_path / "debug" / "version_0" / "heldout.jsonl"
    assert [(r["model"], r["tasks_seen"]) for r in read_lines(path)] == [("initial", 0)] * 3 + [("adapted", 3)] * 3
    with open(path, "a") as f:  # records the checkpoint does not cover (and a torn line) must go
        f.write(json.dumps(records("1")[0] | {"tasks_seen": 99}) + '\n{"model": "ad')
    monkeypatch.delenv("HELDOUT_TEST_CRASH")
    main([*args, "--ckpt_path", "last"])
    lines = read_lines(path)
    assert [(r["model"], r["tasks_seen"]) for r in lines] == \
        [("initial", 0)] * 3 + [("adapted", 3)] * 3 + [("adapted", 4)] * 3
    # the checkpoint after the last task (saved before the end-of-stream point) covers the first 6 records only
    offset = load_state(path.parent / STATE_FILE)["callbacks"]["HeldOutEval"]["offset"]
    assert offset == len("".join(path.read_text().splitlines(keepends=True)[:6]).encode())
    main([*args, "--ckpt_path", "last"])  # a finished stream: nothing to redo, the end-of-stream records stay
    assert read_lines(path) == lines
