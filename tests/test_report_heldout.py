"""The report's held-out table: pooled pairs against hand-made records, the archive round trip, and the
pairing of a run without its own initial row with the base run of its seed."""
from __future__ import annotations

import json

import pytest
from test_heldout import records
from test_paired import newcombe_by_hand
from test_report import records_of

from lit_ascent.results import paired, report, run_archive


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


def test_the_held_out_table_shows_the_share_of_the_base_s_commonest_verb():
    from lit_ascent.results.heldout_table import heldout_markdown, heldout_rows

    def acting(outcomes, actions, model="adapted"):
        return [{**r, "actions": a} for r, a in zip(records(outcomes, model, 0 if model == "initial" else 4), actions)]

    runs = {"base": {"seed0": acting("10", [["craft a", "get b"], ["craft c", "get d"]])},
            "ascent": {"seed0": acting("00", [["get a", "get b"], ["get x", "craft y"]]),
                       "seed1": acting("01", [["get a"], ["craft b"]]) + acting("11", [["craft a"], ["craft b"]],
                                                                              "initial")}}
    rows = {r["method"]: r for r in heldout_rows(runs)}
    a = rows["ascent"]
    assert a["verb"] == "craft"  # the base's commonest (tied with get: the first seen)
    assert a["verb_share"][:2] == pytest.approx([(1 / 4 + 1 / 2) / 2, (1 / 4 * 2 ** 0.5) / 2])
    assert a["initial_verb_share"][:2] == pytest.approx([(1 / 2 + 1) / 2, (1 / 2 * 2 ** 0.5) / 2])  # base's, own
    table = heldout_markdown(list(rows.values()))
    assert "| `craft` actions, adapted / initial (%) |" in table.splitlines()[0]
    assert table.splitlines()[3].endswith("| 37.5 ± 17.7 / 75.0 ± 35.4 |")
    no_actions = heldout_rows({"base": {"seed0": records("10")}})[0]
    assert no_actions["verb"] is None and no_actions["verb_share"] is None


def test_a_graded_environment_gets_a_held_out_score_column():
    from lit_ascent.results.heldout_table import heldout_markdown, heldout_rows

    def scored(outcomes, scores, model="adapted"):
        return [{**r, "score": s} for r, s in zip(records(outcomes, model, 0 if model == "initial" else 4), scores)]

    runs = {"base": {"seed0": scored("10", [1.0, 0.5])},  # base's fast weights never move: its play is the initial's
            "ascent": {"seed0": scored("11", [1.0, 1.0]), "seed1": scored("01", [None, 1.0])}}
    rows = {r["method"]: r for r in heldout_rows(runs)}
    assert rows["ascent"]["score"][:2] == pytest.approx([(1.0 + 0.5) / 2, 0.5 * 2 ** 0.5 / 2])
    assert rows["ascent"]["initial_score"][:2] == pytest.approx([0.75, 0.0])  # seed0 borrows the base's; seed1 none
    table = heldout_markdown(list(rows.values()))
    assert table.splitlines()[0].endswith("| score (mean reward x 100), adapted / initial |")
    assert table.splitlines()[3].endswith("| 75.0 ± 35.4 / 75.0 ± 0.0 |")
    assert "score" not in heldout_markdown(heldout_rows({"base": {"seed0": records("10")}}))
