"""The cycles report against hand-made runs: per-cycle means, the SGS share, per-cycle pairs, the archive."""
from __future__ import annotations

import gzip
import json
import shutil

import pytest

from lit_ascent.results import cycles_report


def write_run(root, method, seed, solved, pi, kept=None, finished=True):
    """A run whose cycle c deployed tasks t0..t3 solving ``solved[c]`` (a string of 0/1) and probed t0, t1
    with outcomes ``pi[c]``; ``kept[c]``: (selected, steps, invalid share of the selected) per update."""
    run = root / method / seed
    run.mkdir(parents=True)
    cycles, tasks = [], []
    for c, (deployed, probed) in enumerate(zip(solved, pi)):
        row = {"cycle": c, "deployed/success_rate": deployed.count("1") / 4, "probe/pi_success": probed.count("1") / 2,
               "deployed/invalid_rate": 0.5, "diagnostics/action_kl": 0.01 * c,
               "diagnostics/first_token_entropy": 1.0, "diagnostics/repeat_action_rate": 0.1}
        if kept and c < len(kept):
            row |= {"resail/selected_steps": kept[c][0], "resail/steps": kept[c][1],
                    "resail/selected_invalid_share": kept[c][2]}
        cycles.append(row)
        tasks += [{"cycle": c, "kind": "deployed", "task_id": f"t{i}", "verified": s == "1", "actions": ["get x"]}
                  for i, s in enumerate(deployed)]
        tasks += [{"cycle": c, "kind": "probe", "task_id": f"t{i}", "verified": s == "1", "actions": ["get x"]}
                  for i, s in enumerate(probed)]
    (run / "cycles.jsonl").write_text("".join(json.dumps(r) + "\n" for r in cycles))
    (run / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tasks))
    if finished:
        (run / "adapter").mkdir()


def test_cycle_table_pairs_and_archive_against_hand_counts(tmp_path):
    root, out = tmp_path / "runs", tmp_path / "report"
    write_run(root, "sdpo", "seed0", ["1100", "1000"], ["11", "10"])
    write_run(root, "sdpo", "seed1", ["1000", "0000"], ["10", "00"])
    write_run(root, "sdpo_resail", "seed0", ["1100", "1110"], ["11", "11"], kept=[(1.0, 20.0, 1.0)])
    write_run(root, "sdpo_resail", "seed1", ["1000", "1100"], ["10", "11"], kept=[(3.0, 20.0, 0.0)])
    write_run(root, "sdpo_resail", "seed2", ["1000"], ["10"], finished=False)
    (root / "sdpo" / "seed0" / "cycles.log").write_text("evaluate: 4/4 episodes, 2 verified\n")
    files = cycles_report.write_cycles_report(root, out, ["sdpo_resail:sdpo"])
    assert gzip.decompress((out / "runs" / "sdpo" / "seed0.cycles.log.gz").read_bytes()).startswith(b"evaluate: 4/4")
    rows = {(r["method"], r["cycle"]): r for r in json.loads(files["numbers"].read_text())}
    assert rows["sdpo", 1]["deployed/success_rate"][:2] == pytest.approx([0.125, 0.125 * 2 ** 0.5])
    assert rows["sdpo_resail", 0]["sgs_kept"][0] == pytest.approx((0.05 + 0.15) / 2)
    assert rows["sdpo_resail", 1]["sgs_kept"] is None and rows["sdpo", 0]["sgs_kept"] is None  # no SGS metrics
    assert rows["sdpo_resail", 0]["resail/selected_invalid_share"][0] == pytest.approx(0.5)
    assert rows["sdpo", 0]["resail/selected_invalid_share"] is None  # not logged: "-"
    assert rows["sdpo_resail", 1]["seeds"] == 2  # seed2 unfinished: left out
    text = files["table"].read_text()
    assert "Unfinished, left out: `sdpo_resail/seed2`." in text
    # cycle 1, pooled: both solved t0 (seed0); only resail: seed0 t1, t2 and seed1 t0, t1; only sdpo: none
    assert "| sdpo_resail | cycle 1, pooled | 1 | 4 | 0 | 3 | 0.125 |" in text
    assert "| sdpo_resail | cycle 0, pooled | 3 | 0 | 0 | 5 | 1 |" in text  # identical cycle-0 deployments
    assert all(files[name].is_file() for name in cycles_report.PLOTS)
    # sdpo cycle 1 vs 0, pooled: seed0 1100 -> 1000, seed1 1000 -> 0000: both 1, only after 0, only before 2
    assert "| sdpo after 1 | pooled | 1 | 0 | 2 | 5 | 0.5 |" in text

    shutil.rmtree(root)  # runs/ gone (a new machine): the archive alone gives the same report
    from_archive = cycles_report.write_cycles_report(root, out, ["sdpo_resail:sdpo"])
    assert from_archive["table"].read_text() == text.replace("\nUnfinished, left out: `sdpo_resail/seed2`.", "")


def test_a_bad_pair_or_no_run_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="cycles.jsonl"):
        cycles_report.write_cycles_report(tmp_path / "none", tmp_path / "out")
    write_run(tmp_path / "runs", "sdpo", "seed0", ["1"], ["1"])
    with pytest.raises(ValueError, match="oel"):
        cycles_report.write_cycles_report(tmp_path / "runs", tmp_path / "out", ["sdpo:oel"])


def test_unfinished_runs_are_included_on_request_and_archived_apart(tmp_path):
    root, out = tmp_path / "runs", tmp_path / "report"
    write_run(root, "sdpo", "seed0", ["1100", "1000", "0000"], ["11", "10", "10"], finished=False)
    write_run(root, "sdpo_resail", "seed0", ["1100"], ["11"], finished=False)
    write_run(root, "sdpo_resail", "seed1", [], [], finished=False)  # no cycle finished yet
    write_run(root, "sdpo", "seed1", ["1111"], ["11"], finished=False)  # behind seed0: left out of its change rows
    (root / "sdpo" / "seed0" / "cycles.log").write_text("distil: 1/10 updates\n")
    files = cycles_report.write_cycles_report(root, out, ["sdpo_resail:sdpo"], include_unfinished=True)
    text = files["table"].read_text()
    assert "Unfinished, rows of cycles 0-2 included: `sdpo/seed0`." in text
    assert "Unfinished, rows of cycles 0-0 included: `sdpo_resail/seed0`." in text
    assert "Unfinished, left out: `sdpo_resail/seed1`." in text
    assert "No run has a row after cycle 0 yet." not in text  # sdpo has cycles 1-2
    assert "| sdpo after 2 | seed0 | 0 | 0 | 2 | 2 | 0.5 |" in text and "sdpo_resail after" not in text
    assert "| sdpo after 2 | seed1 |" not in text and "| sdpo after 2 | pooled |" not in text  # seed0 alone
    assert "Unfinished, rows of cycles 0-0 included: `sdpo/seed1`." in text
    assert "| sdpo_resail | cycle 0, seed0 | 2 | 0 | 0 | 2 | 1 |" in text and "cycle 1, seed0" not in text
    assert sorted(p.name for p in (out / "unfinished" / "sdpo").iterdir()) == [
        "seed0.cycles.jsonl.gz", "seed0.cycles.log.gz", "seed0.tasks.jsonl.gz", "seed1.cycles.jsonl.gz",
        "seed1.tasks.jsonl.gz"]
    assert not (out / "runs").exists()  # nothing in the finished archive

    shutil.rmtree(root)  # runs/ gone: the unfinished archive gives the same report, read only on request
    again = cycles_report.write_cycles_report(root, out, ["sdpo_resail:sdpo"], include_unfinished=True)
    assert again["table"].read_text() == text.replace("\nUnfinished, left out: `sdpo_resail/seed1`.", "")
    with pytest.raises(FileNotFoundError, match="no finished"):
        cycles_report.write_cycles_report(root, out)

    write_run(tmp_path / "first", "sdpo", "seed0", ["1100"], ["11"], finished=False)  # one cycle: nothing to compare
    first = cycles_report.write_cycles_report(tmp_path / "first", tmp_path / "first_report", include_unfinished=True)
    assert first["table"].read_text().count("No run has a row after cycle 0 yet.") == 2  # deployed and probe

    write_run(root, "sdpo", "seed0", ["1100", "1000", "0000", "0000"], ["11", "10", "10", "00"])  # finished
    cycles_report.write_cycles_report(root, out, include_unfinished=True)
    assert not list((out / "unfinished" / "sdpo").glob("seed0.*"))  # the finished archive replaces it, log included
    assert (out / "runs" / "sdpo" / "seed0.cycles.jsonl.gz").is_file()


def test_a_carried_row_is_counted_in_the_seeds_column(tmp_path):
    root, out = tmp_path / "runs", tmp_path / "report"
    write_run(root, "sdpo", "seed0", ["0000", "0000"], ["00", "00"])
    write_run(root, "sdpo", "seed1", ["1000", "0000"], ["10", "00"])
    rows = root / "sdpo" / "seed0" / "cycles.jsonl"  # seed0 verified nothing at cycle 0: cycle 1 is carried
    lines = rows.read_text().splitlines()
    rows.write_text(lines[0] + "\n" + json.dumps({**json.loads(lines[1]), "carried_from": 0}) + "\n")
    text = cycles_report.write_cycles_report(root, out)["table"].read_text()
    assert "| sdpo | 0 | 2 | " in text and "| sdpo | 1 | 2 (1 carried) | " in text


def test_the_cost_table_sums_each_runs_timed_phases_and_marks_lower_bounds(tmp_path):
    root = tmp_path / "runs"
    write_run(root, "sdpo", "seed0", ["1000", "1000", "0000"], ["10", "10", "00"])
    path = root / "sdpo" / "seed0" / "cycles.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    rows[0] |= {"perf/collect_s": 3600.0, "perf/distil_s": 1800.0}  # written before diagnostics were timed
    rows[1] |= {"perf/collect_s": 1800.0, "perf/diagnostics_s": 360.0}
    rows[2] |= {"perf/collect_s": 0.0, "perf/diagnostics_s": 0.0, "carried_from": 1}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs, _ = cycles_report.load_cycle_runs(root, tmp_path / "archive")
    (cost,) = cycles_report.cost_rows(runs)
    assert cost["untimed"] == ["perf/diagnostics_s"] and cost["rows"] == 3
    assert (cost["perf/collect_s"], cost["perf/diagnostics_s"], cost["perf/distil_s"]) == pytest.approx((1.5, 0.1, 0.5))
    assert "| sdpo | seed0 | 3 | 1.50 | ≥ 0.10 | 0.50 | ≥ 2.10 |" in cycles_report.cost_markdown([cost])


def test_action_words_are_shares_of_each_cycles_deployed_actions():
    tasks = [{"cycle": 0, "kind": "deployed", "actions": ["get a", "get b", "craft c", None]},
             {"cycle": 0, "kind": "probe", "actions": ["craft z", "craft z"]},  # the probe is not counted
             {"cycle": 1, "kind": "deployed", "actions": ["get a", "not enough a", "not enough a", "get b"]}]
    columns, rows = cycles_report.action_word_rows({"sdpo": {"seed0": {"cycles": [], "tasks": tasks}}}, words=2)
    assert columns == ["get", "craft", "other", "(unparsed)"]
    assert [{w: r[w] for w in columns} for r in rows] == [
        {"get": 0.5, "craft": 0.25, "other": 0.0, "(unparsed)": 0.25},
        {"get": 0.5, "craft": 0.0, "other": 0.5, "(unparsed)": 0.0}]
    assert "| sdpo | 1 | 1 | 50.0 | 0.0 | 50.0 | 0.0 |" in cycles_report.action_word_markdown(columns, rows)
