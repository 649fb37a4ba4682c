"""Comparison report (table + plots) and the comparison runner's bookkeeping."""
from __future__ import annotations

import gzip
import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from callbacks.stream_checkpoint import STATE_FILE
from lit_ascent.results import compare, paired, report, run_archive, update_stats

# method -> seed -> per task (task_id, verified, turns, invalid), in stream order
STREAMS = {
    "base": {
        "seed0": [("a", 1, 5, 1), ("b", 0, 10, 3), ("c", 1, 4, 0), ("d", 0, 10, 2)],
        "seed1": [("b", 0, 10, 2), ("a", 1, 6, 0), ("d", 1, 3, 0), ("c", 0, 10, 4)],
    },
    "ascent": {
        "seed0": [("a", 1, 3, 0), ("b", 1, 7, 1), ("c", 1, 4, 0), ("d", 0, 10, 1)],
        "seed1": [("b", 1, 6, 0), ("a", 1, 7, 0), ("d", 1, 2, 1), ("c", 1, 5, 0)],
    },
}


def records_of(stream, drift=0.1) -> list[dict]:
    """ExperienceLog-format records (the fields the report reads, plus a few it ignores)."""
    return [{"task_index": i, "env": "scripted", "task_id": tid, "verified": bool(v), "turns": turns,
             "invalid": inv, "actions": [], "valid": [], "tokens": 10, "error": None,
             "diagnostics/first_token_entropy": 3.0 - 0.1 * i, "diagnostics/drift_kl": drift * i,
             "updates": int(v), "loss": {}, "timings": {}}
            for i, (tid, v, turns, inv) in enumerate(stream)]


@pytest.fixture
def runs_root(tmp_path) -> Path:
    root = tmp_path / "compare"
    for method, seeds in STREAMS.items():
        for seed, stream in seeds.items():
            folder = root / method / seed
            folder.mkdir(parents=True)
            lines = [json.dumps(r) for r in records_of(stream, 0.0 if method == "base" else 0.1)]
            (folder / "experience.jsonl").write_text("\n".join(reversed(lines)) + "\n")  # order restored by index
    return root


def by_hand(method: str, seed: str) -> dict[str, float]:
    """The table's numbers for one run, computed directly from STREAMS."""
    s, base = STREAMS[method][seed], STREAMS["base"][seed]
    half = s[len(s) // 2:]
    base_solved = {t: turns for t, v, turns, _ in base if v}
    both = [(turns, base_solved[t]) for t, v, turns, _ in s if v and t in base_solved]
    return {"success": sum(x[1] for x in s) / len(s), "second_half_success": sum(x[1] for x in half) / len(half),
            "mean_turns": sum(x[2] for x in s) / len(s), "invalid_rate": sum(x[3] for x in s) / sum(x[2] for x in s),
            "fewer_turns_share": sum(m < b for m, b in both) / len(both)}


def test_table_matches_hand_computation(runs_root):
    table = report.comparison_table(report.load_runs(runs_root))
    assert list(table) == ["base", "ascent"]
    assert table["ascent"]["summary"]["mean_score"] is None  # the scripted env only verifies
    for key in by_hand("ascent", "seed0"):
        per_seed = [by_hand("ascent", seed)[key] for seed in ("seed0", "seed1")]
        mean, std, n = table["ascent"]["summary"][key]
        assert n == 2
        assert mean == pytest.approx(statistics.fmean(per_seed))
        assert std == pytest.approx(abs(per_seed[0] - per_seed[1]) / math.sqrt(2))  # sample std of two
    assert table["base"]["summary"]["fewer_turns_share"] is None
    # spot values: ascent success 3/4 and 4/4; invalid 2/24 and 1/20; fewer turns 1/2 on both seeds
    assert table["ascent"]["per_seed"]["seed1"]["success"] == pytest.approx(1.0)
    assert table["ascent"]["per_seed"]["seed0"]["invalid_rate"] == pytest.approx(2 / 24)
    assert table["ascent"]["summary"]["fewer_turns_share"][:2] == pytest.approx((0.5, 0.0))


def test_markdown_row(runs_root):
    md = report.markdown_table(report.comparison_table(report.load_runs(runs_root)))
    assert "| ascent | 2 | 4 | 87.5 ± 17.7 | 75.0 ± 35.4 | 5.5 ± 0.7 | 6.7 ± 2.4 | 50.0 ± 0.0 |" in md
    base_row = next(line for line in md.splitlines() if line.startswith("| base |"))
    assert base_row.startswith("| base | 2 | 4 | 50.0 ± 0.0 | 50.0 ± 0.0 |")
    assert base_row.endswith("| - |")  # no fewer-turns share against itself
    assert "score" not in md  # no run has a graded environment


def test_graded_runs_get_a_mean_score_column(runs_root):
    runs = report.load_runs(runs_root)
    for seeds in runs.values():  # WebShop-like: a solved task scored 1.0, a failed one 0.5 (task "d": no score)
        for records in seeds.values():
            for r in records:
                r["score"] = 1.0 if r["verified"] else (None if r["task_id"] == "d" else 0.5)
    table = report.comparison_table(runs)
    assert table["base"]["per_seed"]["seed0"]["mean_score"] == pytest.approx((1 + 0.5 + 1 + 0) / 4)
    md = report.markdown_table(table)
    assert md.splitlines()[0].endswith("| score (mean reward x 100) |")
    # base seed0 (1 + 0.5 + 1 + 0) / 4, seed1 (0.5 + 1 + 1 + 0.5) / 4: mean 0.6875, sample std 0.125 / sqrt(2)
    assert next(line for line in md.splitlines() if line.startswith("| base |")).endswith("| 68.8 ± 8.8 |")


def test_equal_means_format_alike_despite_float_noise():
    # 9/40 and 8/40 against 10/40 and 7/40: both mean 21.25%, computed as 21.250000000000004 and 21.25
    pairs = ([9 / 40, 8 / 40], [10 / 40, 7 / 40])
    cells = {report.format_cell(report.mean_std(rates), 100.0).split(" ± ")[0] for rates in pairs}
    assert cells == {"21.2"}


def test_a_run_still_in_progress_is_listed_not_averaged(runs_root, tmp_path):
    partial = runs_root / "rft" / "seed0"
    partial.mkdir(parents=True)
    (partial / "experience.jsonl").write_text(json.dumps(records_of(STREAMS["ascent"]["seed0"])[0]) + "\n")
    complete, unfinished = report.split_unfinished(report.load_runs(runs_root))
    assert unfinished == {"rft/seed0": (1, 4)} and set(complete) == {"base", "ascent"}
    files = report.write_report(runs_root, tmp_path / "out")
    text = files["table"].read_text()
    assert "| rft |" not in text and "Unfinished, left out: `rft/seed0` (1 of 4 tasks)." in text
    cut, kept = report.common_prefix(report.load_runs(runs_root))
    assert kept == {"seed0": 1, "seed1": 4}
    assert [len(cut[m]["seed0"]) for m in ("base", "ascent", "rft")] == [1, 1, 1] and len(cut["base"]["seed1"]) == 4
    text = report.main([str(runs_root), "--out", str(tmp_path / "prefix"), "--common-prefix"])["table"].read_text()
    assert "| rft | 1 | 1 |" in text and "first 1 tasks of seed0, 4 tasks of seed1" in text


def test_fewer_turns_share_edge_cases():
    mine = records_of([("a", 1, 3, 0), ("b", 0, 9, 0)])
    assert report.fewer_turns_share(mine, records_of([("a", 0, 5, 0), ("b", 1, 4, 0)])) is None
    assert report.fewer_turns_share(mine, records_of([("a", 1, 3, 0)])) == 0.0  # equal turns are not fewer


def test_running_success_and_curves(runs_root):
    assert report.running_success(records_of(STREAMS["base"]["seed0"])) == pytest.approx([1, 1 / 2, 2 / 3, 2 / 4])
    curves = report.method_curves(report.load_runs(runs_root), None)
    x, y, n = curves["ascent"]
    assert x == [0, 1, 2, 3]
    assert n == 2  # seeds averaged, shown in the legend
    assert y == pytest.approx([1.0, 1.0, 1.0, (3 / 4 + 1) / 2])
    drift = report.method_curves(report.load_runs(runs_root), "diagnostics/drift_kl")["ascent"][1]
    assert drift == pytest.approx([0.0, 0.1, 0.2, 0.3])


def test_write_report_files(runs_root, tmp_path):
    files = report.main([str(runs_root), "--out", str(tmp_path / "out")])
    for name in ("running_success", "first_token_entropy", "drift_kl"):
        assert files[name].suffix == ".png" and files[name].stat().st_size > 1000
        assert files[name].read_bytes()[:4] == b"\x89PNG"
    numbers = json.loads(files["numbers"].read_text())
    assert numbers["ascent"]["per_seed"]["seed0"]["success"] == pytest.approx(0.75)
    assert "| ascent |" in files["table"].read_text()


def test_report_without_runs_fails(tmp_path):
    with pytest.raises(FileNotFoundError, match="experience.jsonl"):
        report.write_report(tmp_path, tmp_path / "out")


def test_finished_runs_are_archived_and_outlive_the_run_folder(runs_root, tmp_path):
    out = tmp_path / "results"
    for method in ("base", "ascent"):  # seed1 of both is finished; seed0 runs have no marker (in progress)
        (runs_root / method / "seed1" / compare.MARKER).write_text("{}")
    before = json.loads(report.write_report(runs_root, out)["numbers"].read_text())
    assert sorted(p.relative_to(out / "runs").as_posix() for p in (out / "runs").rglob("*.gz")) == \
        ["ascent/seed1.jsonl.gz", "base/seed1.jsonl.gz"]
    assert run_archive.read_records(out / "runs" / "ascent" / "seed1.jsonl.gz") == \
        report.load_runs(runs_root)["ascent"]["seed1"]
    shutil.rmtree(runs_root)  # a new machine: only the committed report folder is left
    after = json.loads(report.write_report(runs_root, out)["numbers"].read_text())
    assert after["ascent"]["per_seed"] == {"seed1": before["ascent"]["per_seed"]["seed1"]}
    assert after["ascent"]["per_seed"]["seed1"]["success"] == pytest.approx(1.0)


def test_merge_runs_prefers_the_longer_log_then_the_live_one():
    a, b, c = records_of([("a", 1, 3, 0)]), records_of([("a", 0, 9, 0), ("b", 1, 2, 0)]), records_of([("a", 0, 5, 0)])
    merged = run_archive.merge_runs({"m": {"s0": b, "s1": a}, "n": {"s0": a}}, {"m": {"s0": a, "s1": c}})
    assert merged == {"m": {"s0": b, "s1": c}, "n": {"s0": a}}


def test_previous_per_seed_figures_enter_the_summary_only(runs_root, tmp_path):
    old = report.comparison_table({m: {"seed7": seeds["seed0"]} for m, seeds in report.load_runs(runs_root).items()})
    (tmp_path / "old.json").write_text(json.dumps(old))
    shutil.rmtree(runs_root / "ascent" / "seed1")
    files = report.main([str(runs_root), "--out", str(tmp_path / "out"), "--previous", str(tmp_path / "old.json")])
    table = json.loads(files["numbers"].read_text())
    assert sorted(table["ascent"]["per_seed"]) == ["seed0", "seed7"] and sorted(table["base"]["per_seed"]) == \
        ["seed0", "seed1", "seed7"]
    mean, _, n = table["ascent"]["summary"]["success"]
    assert (mean, n) == (pytest.approx(0.75), 2)  # seed0 here and the same stream as seed7 in the old report
    text = files["table"].read_text()
    assert "carried over from" in text and "base seed7, ascent seed7" in text
    assert "seed7" not in files["per_task"].read_text()


# ---- the comparison runner ---------------------------------------------------------------


def test_plan_and_command(tmp_path):
    specs = compare.plan(["base", "rft", "jsd"], [0, 1], tmp_path)
    assert [(s.method, s.seed) for s in specs[:3]] == [("base", 0), ("rft", 0), ("jsd", 0)]
    assert [(c.parent.name, c.name) for c in specs[2].configs] == [("ablations", "jsd.yaml")]
    assert specs[4].run_dir == tmp_path / "rft" / "seed1"
    cmd = compare.train_command(specs[4], Path("configs/debug.yaml"), [Path("x.yaml")], num_tasks=5)
    i = cmd.index("--trainer.logger.init_args.version")
    assert cmd[i + 1] == "seed1" and cmd[cmd.index("--data.seed") + 1] == "1"
    assert cmd.index("x.yaml") < cmd.index(str(specs[4].configs[0]))  # extras before the method
    assert "--data.seed" not in compare.train_command(specs[4], Path("e.yaml"), [], None, fixed_stream=True)
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        compare.plan(["nope"], [0], tmp_path)
    stacked = compare.plan(["procedural+memory_floor"], [2], tmp_path)[0]  # a method, then an ablation, one row
    assert stacked.run_dir == tmp_path / "procedural+memory_floor" / "seed2"
    cmd = compare.train_command(stacked, Path("e.yaml"), [Path("x.yaml")], None)
    overlays = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--config"]
    assert [Path(c).name for c in overlays] == ["e.yaml", "x.yaml", "procedural.yaml", "memory_floor.yaml"]
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        compare.plan(["procedural+nope"], [0], tmp_path)


def test_command_puts_the_run_in_its_folder(tmp_path):
    from lit_ascent.cli import main

    spec = compare.plan(["rft"], [3], tmp_path)[0]
    cmd = compare.train_command(spec, compare.REPO / "configs/debug.yaml", [], num_tasks=2)
    cli = main(cmd[3:], run=False)
    assert Path(cli.trainer.log_dir) == spec.run_dir
    assert cli.config.seed_everything == 3 and cli.datamodule.seed == 3 and cli.datamodule.num_tasks == 2


def fake_train(n: int, rc: int) -> list[str]:
    """A stand-in for train.py: writes n records into the run folder given by the logger flags, exits rc."""
    code = ("import sys, pathlib; a = sys.argv; d = pathlib.Path(a[1]) / a[2] / a[3]; "
            f"(d / 'experience.jsonl').write_text('{{}}\\n' * {n}); sys.exit({rc})")
    return [sys.executable, "-c", code]


def test_runner_marks_finished_and_skips(tmp_path, monkeypatch):
    def command(spec, *args, **kw):  # "rft" crashes after one task
        run = spec.run_dir
        return fake_train(*((2, 0) if spec.method != "rft" else (1, 1))) + [str(run.parent.parent), run.parent.name,
                                                                             run.name]

    monkeypatch.setattr(compare, "train_command", command)
    specs = compare.plan(["base", "rft"], [0], tmp_path)
    stale = specs[0].run_dir / "stale.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("from an interrupted run")
    result = compare.run_matrix(specs, Path("env.yaml"), [], num_tasks=2)
    assert [s.method for s in result["done"]] == ["base"] and [s.method for s in result["failed"]] == ["rft"]
    assert not stale.exists()  # an unfinished run restarts from scratch
    marker = json.loads((specs[0].run_dir / compare.MARKER).read_text())
    assert marker["records"] == 2 and marker["seed"] == 0
    assert not (specs[1].run_dir / compare.MARKER).exists()  # crashed: not finished
    again = compare.run_matrix(specs, Path("env.yaml"), [], num_tasks=2)
    assert [s.method for s in again["skipped"]] == ["base"]
    assert compare.is_finished(specs[1].run_dir, 1) and not compare.is_finished(specs[1].run_dir, None)
    (specs[1].run_dir / STATE_FILE).write_bytes(b"")  # a full log with a checkpoint: continued, not skipped
    assert not compare.is_finished(specs[1].run_dir, 1)


def test_runner_skips_cells_the_report_archive_holds(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(compare, "run_one", lambda spec, cmd, n: ran.append(spec.method) or True)
    archive = tmp_path / "report" / "runs"
    path = run_archive.archived_path(archive, "base", "seed0")
    path.parent.mkdir(parents=True)
    path.write_bytes(gzip.compress(b"".join(json.dumps(r).encode() + b"\n" for r in records_of(STREAMS["base"]["seed0"]))))
    specs = compare.plan(["base", "rft"], [0], tmp_path / "runs")
    result = compare.run_matrix(specs, Path("env.yaml"), [], num_tasks=4, archive=archive)
    assert [s.method for s in result["skipped"]] == ["base"] and ran == ["rft"]
    ran.clear()
    compare.run_matrix(specs, Path("env.yaml"), [], num_tasks=5, archive=archive)  # a longer stream: not the same cell
    assert ran == ["base", "rft"]


def test_runner_continues_a_cell_from_its_stream_checkpoint(tmp_path, monkeypatch):
    seen = []

    def command(spec, *args, **kw):
        run = spec.run_dir
        return fake_train(3, 0) + [str(run.parent.parent), run.parent.name, run.name]

    def record(cmd, **kw):
        seen.append(cmd)
        return real_run(cmd, **kw)

    real_run = compare.subprocess.run
    monkeypatch.setattr(compare, "train_command", command)
    monkeypatch.setattr(compare.subprocess, "run", record)
    spec = compare.plan(["base"], [0], tmp_path)[0]
    spec.run_dir.mkdir(parents=True)
    (spec.run_dir / STATE_FILE).write_bytes(b"checkpoint of task 2")
    (spec.run_dir / "train.log").write_text("first sitting\n")
    result = compare.run_matrix([spec], Path("env.yaml"), [], num_tasks=3)
    assert result["done"] == [spec]
    assert seen[0][-2:] == ["--ckpt_path", str(spec.run_dir)]
    assert (spec.run_dir / STATE_FILE).is_file()  # the folder was kept, not deleted
    assert (spec.run_dir / "train.log").read_text().startswith("first sitting")
    assert json.loads((spec.run_dir / compare.MARKER).read_text())["resumed"] is True


def test_resume_command_is_accepted_by_the_cli(tmp_path):
    from lit_ascent.cli import main

    spec = compare.plan(["rft"], [1], tmp_path)[0]
    spec.run_dir.mkdir(parents=True)
    (spec.run_dir / STATE_FILE).write_bytes(b"")
    cmd = compare.resume_command(spec, compare.train_command(spec, compare.REPO / "configs/debug.yaml", [], 2))
    with pytest.raises(ValueError, match=f"{spec.run_dir / STATE_FILE}.* is not a readable stream checkpoint"):
        main(cmd[2:])  # the CLI takes --ckpt_path and reads this cell's (here empty) checkpoint
    assert compare.resume_command(compare.plan(["base"], [0], tmp_path)[0], cmd) is None


def test_paired_counts_and_mcnemar_match_hand_computation(runs_root):
    # seed0: ascent solves a, b, c and base a, c; seed1: ascent solves all four, base a, d
    rows = {(r["method"], r["seed"]): r for r in paired.paired_rows(report.load_runs(runs_root))}
    assert set(rows) == {("ascent", "seed0"), ("ascent", "seed1"), ("ascent", "pooled")}
    counts = {key: tuple(rows[key][k] for k in ("both", "only_method", "only_base", "neither")) for key in rows}
    assert counts == {("ascent", "seed0"): (2, 1, 0, 1), ("ascent", "seed1"): (2, 2, 0, 0),
                      ("ascent", "pooled"): (4, 3, 0, 1)}
    # two-sided exact McNemar: 2 * P(Binomial(b + c, 1/2) <= min(b, c)), at most 1
    assert [rows[("ascent", s)]["p"] for s in ("seed0", "seed1", "pooled")] == pytest.approx([1.0, 2 / 4, 2 / 8])
    assert paired.mcnemar_exact_p(1, 9) == pytest.approx(2 * (1 + 10) / 2 ** 10) == paired.mcnemar_exact_p(9, 1)
    assert paired.mcnemar_exact_p(0, 0) == 1.0 and paired.mcnemar_exact_p(3, 3) == 1.0
    assert paired.mcnemar_exact_p(0, 6) == pytest.approx(2 / 64)


def test_per_task_matrix_and_short_ids(runs_root, tmp_path):
    assert paired.short_ids(["j/seen/A-1/t1/game", "j/seen/B-2/t2/game"]) == {
        "j/seen/A-1/t1/game": "A-1/t1", "j/seen/B-2/t2/game": "B-2/t2"}
    assert paired.short_ids(["oak door", "acacia plate"]) == {"oak door": "oak door", "acacia plate": "acacia plate"}
    assert paired.short_ids(["x/y"]) == {"x/y": "x/y"}
    files = report.write_report(runs_root, tmp_path / "out")
    matrix = files["per_task"].read_text()
    assert "| # | task | base | ascent |" in matrix  # base first, then the other methods
    seed1 = matrix.split("## seed1")[1]
    assert "| 0 | b | - | 6 |" in seed1 and "| 2 | d | 3 | 2 |" in seed1 and "| 3 | c | - | 5 |" in seed1
    assert "| ascent | pooled | 4 | 3 | 0 | 1 | 0.25 |" in files["table"].read_text()


def test_update_stats_match_hand_computation(runs_root, tmp_path):
    records = [
        {"updates": 1, "loss": {"loss/nll": 0.5, "loss/total": 0.7}, "timings": {"update_s": 2.0},
         "diagnostics/drift_kl": 0.0, "diagnostics/first_token_entropy": 1.0,
         "update": {"update/absorbed_fraction": 0.5}, "diagnostics/repeat_action_rate": 0.25,
         "diagnostics/longest_action_run": 2.0, "diagnostics/action_kl": 0.0, "diagnostics/action_changes": 0.0},
        {"updates": 0, "loss": {}, "timings": {"update_s": 0.0},
         "diagnostics/drift_kl": 0.3, "diagnostics/first_token_entropy": None, "update": {},
         "diagnostics/repeat_action_rate": 0.75, "diagnostics/longest_action_run": 6.0,
         "diagnostics/action_kl": 0.02, "diagnostics/action_changes": 3.0},
        {"updates": 2, "loss": {"loss/divergence": 0.2}, "timings": {"update_s": 4.0},
         "diagnostics/drift_kl": 0.1, "diagnostics/first_token_entropy": 3.0,
         "update": {"update/absorbed_fraction": 0.1}},
        {"updates": 1, "loss": {"loss/kl": 9.0}, "timings": {}, "diagnostics/first_token_entropy": 0.5},
    ]
    # loss/total before the divergence; a record with neither total, divergence nor NLL gives no loss
    assert update_stats.objective_loss({"loss/nll": 0.5, "loss/total": 0.7}) == 0.7
    assert update_stats.objective_loss({"loss/kl": 9.0}) is None
    assert update_stats.update_stats(records) == pytest.approx({
        "updates": 4, "loss_min": 0.2, "loss_max": 0.7, "update_s": 3.0, "drift_max": 0.3,
        "entropy_median": 1.0, "entropy_max": 3.0, "absorbed_mean": 0.3, "action_kl_max": 0.02,
        "action_changes_max": 3.0, "repeat_rate_mean": 0.5, "longest_run_max": 6.0})
    assert update_stats.update_stats([{"updates": 0}]) == {
        "updates": 0, "loss_min": None, "loss_max": None, "update_s": None, "drift_max": None,
        "entropy_median": None, "entropy_max": None, "absorbed_mean": None, "action_kl_max": None,
        "action_changes_max": None, "repeat_rate_mean": None, "longest_run_max": None}
    # the fixture: one update per solved task (base seed0 solves 2), drift 0 for base and 0.1 * index otherwise,
    # entropy 3.0 - 0.1 * index, no loss and no timings logged
    table = report.write_report(runs_root, tmp_path / "out")["table"].read_text()
    assert "| base | seed0 | 2 | - | - | 0 | 2.85 / 3 | - | - / - | - / - |" in table
    assert "| ascent | seed1 | 4 | - | - | 0.3 | 2.85 / 3 | - | - / - | - / - |" in table


def test_archived_logs_are_not_git_ignored():
    """runs/ (scratch) is ignored, the archive inside a report folder must not be, or it never gets committed."""
    if not (compare.REPO / ".git").exists():
        pytest.skip("not a git checkout")
    check = ["git", "-C", str(compare.REPO), "check-ignore", "-q"]
    assert subprocess.run([*check, "runs/compare/base/seed0/experience.jsonl"]).returncode == 0
    assert subprocess.run([*check, "docs/results/any_bench/runs/base/seed0.jsonl.gz"]).returncode == 1
