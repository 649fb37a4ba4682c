"""Held-out frozen evaluation: the paired statistics against hand-made cases and published values,
the float32 cast, the callback end to end on the debug config, its resume, and the report's table."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import TINY
from test_report import records_of
from test_transfer import MemoryLogger

from callbacks.heldout import HeldOutEval, cast_weights, check_disjoint, heldout_metrics
from callbacks.stream_checkpoint import STATE_FILE, load_state
from datamodules import TaskStreamDataModule
from lit_ascent.results import paired, report, run_archive
from lit_ascent.cli import main
from lit_ascent.envs import ScriptedEnv
from lit_ascent.models import load_policy
from lit_ascent.module import OaTTTModule
from lit_ascent.objectives import Distillation
from lit_ascent.rollout import RolloutConfig
from lit_ascent.trajectory import Task

DEBUG = str(Path(__file__).resolve().parents[1] / "configs" / "debug.yaml")
Z = 1.959964


class OffsetScriptedEnv(ScriptedEnv):
    """ScriptedEnv whose task ids start at ``first`` (task-100, ...): a held-out set disjoint from the stream."""

    def __init__(self, num_tasks: int = 4, episode_steps: int = 2, verify_every: int = 2, first: int = 100):
        super().__init__(num_tasks, episode_steps, verify_every)
        self.first = first

    def tasks(self) -> list[Task]:
        return [Task(self.name, f"task-{self.first + k}") for k in range(self.num_tasks)]


# -- the statistics -----------------------------------------------------------------------------
def wilson_by_hand(s: int, n: int) -> tuple[float, float]:
    """The two roots in p of (s/n - p)^2 = z^2 p (1 - p) / n (the score test's acceptance limits)."""
    q = s / n
    a, b, c = 1 + Z * Z / n, -(2 * q + Z * Z / n), q * q
    root = math.sqrt(b * b - 4 * a * c)
    return (-b - root) / (2 * a), (-b + root) / (2 * a)


def newcombe_by_hand(a: int, b: int, c: int, d: int) -> tuple[float, float]:
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    (l1, u1), (l2, u2) = wilson_by_hand(a + b, n), wilson_by_hand(a + c, n)
    cross = a * d - b * c
    cross = max(cross - n / 2, 0) if cross > 0 else cross
    phi = cross / math.sqrt((a + b) * (c + d) * (a + c) * (b + d))
    lower = p1 - p2 - math.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    upper = p1 - p2 + math.sqrt((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2)
    return lower, upper


@pytest.mark.parametrize("s,n", [(81, 263), (15, 148), (1, 29), (7, 64), (64, 64)])
def test_wilson_interval_is_the_score_test_inversion(s, n):
    assert paired.wilson_interval(s, n) == pytest.approx(wilson_by_hand(s, n), abs=1e-12)


def test_wilson_interval_published_values_and_limits():
    # Newcombe (1998a), Stat. Med. 17:857, Table I, method 3 (score, no continuity correction)
    published = {(81, 263): (0.2553, 0.3662), (15, 148): (0.0624, 0.1605), (0, 20): (0.0, 0.1611),
                 (1, 29): (0.0061, 0.1718)}
    for (s, n), interval in published.items():
        assert paired.wilson_interval(s, n) == pytest.approx(interval, abs=5e-5)
    assert paired.wilson_interval(0, 20)[1] == pytest.approx(Z * Z / (20 + Z * Z))  # closed form at s = 0
    assert paired.wilson_interval(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize("counts", [(20, 9, 3, 32), (5, 1, 7, 51), (30, 2, 2, 30), (0, 4, 1, 59)])
def test_paired_interval_against_the_formula_by_hand(counts):
    low, high = paired.paired_difference_interval(*counts)
    assert (low, high) == pytest.approx(newcombe_by_hand(*counts), abs=1e-12)
    a, b, c, d = counts
    assert low <= (b - c) / sum(counts) <= high
    # the method and the base swapped: the interval is mirrored
    assert paired.paired_difference_interval(a, c, b, d) == pytest.approx((-high, -low), abs=1e-12)


def test_paired_interval_published_values():
    # Newcombe (1998b), Stat. Med. 17:2635, method 10, his examples (a, b, c, d)
    published = {(36, 12, 2, 0): (0.0569, 0.3404), (18, 12, 2, 18): (0.0562, 0.3290), (53, 0, 0, 1): (-0.0729, 0.0729)}
    for counts, interval in published.items():
        assert paired.paired_difference_interval(*counts) == pytest.approx(interval, abs=5e-5)
    assert paired.paired_phi(10, 0, 0, 0) == 0.0  # an empty margin: phi = 0
    assert paired.paired_difference_interval(0, 0, 0, 0) == (-1.0, 1.0)


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


# -- the report ---------------------------------------------------------------------------------------
def test_report_heldout_table_against_hand_made_records(tmp_path):
    root, out = tmp_path / "compare", tmp_path / "out"
    initial = records("11000000", "initial", 0)
    heldout = {  # method -> seed -> adapted outcomes at the end (and an earlier point that must be ignored)
        "base": {"seed0": "11000000", "seed1": "11000000"},
        "ascent": {"seed0": "11110000", "seed1": "10111000"},
    }
    for method, seeds in heldout.items():
        for seed, outcomes in seeds.items():
            run = root / method / seed
            run.mkdir(parents=True)
            (run / "experience.jsonl").write_text(json.dumps(records_of([("s0", 1, 2, 0)])[0]) + "\n")
            lines = initial + records("00000000", tasks_seen=4) + records(outcomes, tasks_seen=8)
            (run / run_archive.HELDOUT_NAME).write_text("".join(json.dumps(r) + "\n" for r in lines))
    (root / "ascent" / "seed0" / run_archive.MARKER).write_text("{}")
    files = report.write_report(root, out)
    rows = {r["method"]: r for r in json.loads(files["heldout"].read_text())}
    # ascent: seed0 both h0 h1, only adapted h2 h3; seed1 both h0, only adapted h2 h3 h4, only initial h1
    a = rows["ascent"]
    assert (a["both"], a["only_method"], a["only_base"], a["neither"]) == (3, 5, 1, 7)
    assert a["p"] == pytest.approx(paired.mcnemar_exact_p(5, 1)) and a["diff"] == pytest.approx(4 / 16)
    assert (a["diff_low"], a["diff_high"]) == pytest.approx(newcombe_by_hand(3, 5, 1, 7), abs=1e-12)
    assert a["success"][:2] == pytest.approx([(4 / 8 + 4 / 8) / 2, 0.0])
    assert a["initial_success"][:2] == pytest.approx([2 / 8, 0.0]) and a["tasks_seen"] == [8]
    assert (rows["base"]["only_method"], rows["base"]["only_base"], rows["base"]["p"]) == (0, 0, 1.0)
    table = files["table"].read_text()
    assert "Held-out evaluation (frozen, end of stream)" in table
    # the stream's paired table gains the difference: 2 of 2 solved by both, Wilson lower bound of 2/2 = 0.342
    assert "| ascent | pooled | 2 | 0 | 0 | 0 | 1 | +0.0 [-65.8, +65.8] |" in table
    assert f"| ascent | 2 | 8 | 8 | 50.0 ± 0.0 | 25.0 ± 0.0 | 0 | 3 | 5 | 1 | 7 | {14 / 64:.3g} |" in table
    # the finished run's records are archived beside its log and read back without the run folder
    assert (out / "runs" / "ascent" / "seed0.heldout.jsonl.gz").is_file()
    assert set(run_archive.load_archive(out / "runs")["ascent"]) == {"seed0"}
    assert set(run_archive.load_archive(out / "runs", run_archive.HELDOUT_SUFFIX)["ascent"]) == {"seed0"}


def test_report_pairs_a_run_without_its_initial_row_with_the_base_run_of_its_seed(tmp_path):
    root = tmp_path / "compare"
    heldout = {  # method -> seed -> (initial outcomes or None, adapted outcomes at the end)
        "base": {"seed0": (None, "1100"), "seed1": (None, "1010")},
        "ascent": {"seed0": (None, "1110"), "seed1": (None, "0011"), "seed2": (None, "1111")},
        "rft": {"seed0": ("0000", "1000")},
    }
    for method, seeds in heldout.items():
        for seed, (initial, adapted) in seeds.items():
            run = root / method / seed
            run.mkdir(parents=True)
            (run / "experience.jsonl").write_text(json.dumps(records_of([("s0", 1, 2, 0)])[0]) + "\n")
            lines = (records(initial, "initial", 0) if initial else []) + records(adapted, tasks_seen=4)
            (run / run_archive.HELDOUT_NAME).write_text("".join(json.dumps(r) + "\n" for r in lines))
    rows = {r["method"]: r for r in json.loads(report.write_report(root, tmp_path / "out")["heldout"].read_text())}
    # ascent seed0 vs base seed0 (1100): both h0 h1, only adapted h2, neither h3; seed1 vs 1010: both h2, only
    # adapted h3, only base h0, neither h1; seed2 has no base run of its seed: no initial row, no pairs
    a = rows["ascent"]
    assert a["initial_from_base"] == 2 and a["seeds"] == 3
    assert (a["both"], a["only_method"], a["only_base"], a["neither"]) == (3, 2, 1, 2)
    assert a["initial_success"][:2] == pytest.approx([0.5, 0.0])
    # a run with its own initial row keeps it; the base is never paired with itself
    assert rows["rft"]["initial_from_base"] == 0 and rows["rft"]["only_method"] == 1
    assert rows["base"]["initial_from_base"] == 0 and "p" not in rows["base"]
