"""The proxy sweep's table: cell names, the row's numbers against hand-computed ones, the plan's choice,
and the archive round trip."""
from __future__ import annotations

import gzip
import json

import pytest

from lit_ascent.results import sweep


def heldout(outcomes: str, actions: list[list[str]] | None = None) -> list[dict]:
    return [{"model": "adapted", "task_index": i, "task_id": f"h{i}", "verified": c == "1", "turns": 4, "invalid": i % 2,
             **({"actions": actions[i]} if actions else {})} for i, c in enumerate(outcomes)]


def stream(absorbed: list[float | None], kl: float) -> list[dict]:
    return [{"task_index": i, "verified": a is not None, "turns": 3, "invalid": 0, "updates": int(a is not None),
             "update": {} if a is None else {"update/absorbed_fraction": a}, "timings": {"update_s": 2.0 * (a is not None)},
             "diagnostics/action_kl": kl * i, "diagnostics/action_changes": float(i)} for i, a in enumerate(absorbed)]


def test_setting_reads_the_cell_name_and_refuses_others():
    assert sweep.setting("ascent_lr1e-3_s2_k4") == {"method": "ascent", "lr": 1e-3, "steps": 2, "k": 4}
    assert sweep.setting("rft_kl_lr0.0003_s1_k0") == {"method": "rft_kl", "lr": 3e-4, "steps": 1, "k": 0}
    assert sweep.setting("base")["method"] == "base"
    with pytest.raises(ValueError, match="cell name 'ascent_fast'"):
        sweep.setting("ascent_fast")


def test_cell_row_against_hand_computed_numbers():
    base = heldout("1100")
    acts = [["a", "a", "b", "a"], ["x", "y", "z", "w"], ["a", None, "a", "a"], ["q", "q", "q", "q"]]
    row = sweep.cell_row("ascent_lr1e-3_s1_k0", stream([0.5, None, 0.25], kl=0.01), heldout("1011", acts), base)
    assert (row["solved"], row["tasks"], row["success"]) == (3, 4, 0.75)
    assert row["invalid_rate"] == pytest.approx(2 / 16) and row["turns"] == 4.0
    # repeats: 2/4, 0/4, 2/4 (None never repeats), 3/4
    assert row["repeat_rate"] == pytest.approx((0.5 + 0 + 0.5 + 0.75) / 4)
    assert row["back_to_back"] == pytest.approx((0.25 + 0 + 0.25 + 0.75) / 4)  # same as the previous turn's
    assert row["updates"] == 2 and row["absorbed"] == pytest.approx(0.375) and row["update_s"] == 4.0
    assert row["action_kl"] == pytest.approx(0.02) and row["action_changes"] == 2.0  # the last task's
    assert row["counts"] == {"both": 1, "only_method": 2, "only_base": 1, "neither": 0}
    assert row["words"]["a"] == pytest.approx(6 / 16) and row["words"]["q"] == pytest.approx(4 / 16)
    assert list(row["words"])[:2] == ["a", "q"] and row["words"]["(unparsed)"] == pytest.approx(1 / 16)
    assert row["diff"] == pytest.approx(0.25) and row["p"] == pytest.approx(1.0)  # 2 vs 1 discordant
    assert "p" not in sweep.cell_row("base", [], base, base)  # the base is not paired with itself
    assert sweep.cell_row("base", [], base, base)["repeat_rate"] is None  # records without actions


def test_chosen_follows_the_plan_success_then_drift_then_budget():
    def row(cell, success, kl):
        return {**sweep.setting(cell), "cell": cell, "success": success, "action_kl": kl}

    rows = [row("ascent_lr1e-3_s4_k4", 0.5, 0.01), row("ascent_lr1e-4_s1_k0", 0.5, 0.01),
            row("ascent_lr3e-4_s1_k0", 0.5, 0.001), row("ascent_lr1e-3_s1_k0", 0.4, 0.0), row("rft_lr1e-4_s1_k0", 0.9, 0.1)]
    assert sweep.chosen(rows, "ascent")["cell"] == "ascent_lr3e-4_s1_k0"  # lowest drift among the best
    assert sweep.chosen(rows[:2], "ascent")["cell"] == "ascent_lr1e-4_s1_k0"  # same drift: smaller budget
    assert sweep.chosen(rows, "reinforce") is None


def test_archive_then_table_from_the_archive(tmp_path):
    root, archive = tmp_path / "runs", tmp_path / "archive"
    acts = {"base": [["craft a", "get b"]] * 4, "ascent_lr1e-3_s1_k0": [["get a", "get b"]] * 3 + [["craft a", "x"]]}
    for cell, outcomes in [("base", "1100"), ("ascent_lr1e-3_s1_k0", "1110"), ("ascent_lr1e-4_s1_k0", "1000")]:
        run = root / cell / "textcraft" / "version_0"
        run.mkdir(parents=True)
        (run / "experience.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stream([0.5], 0.0)))
        (run / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in heldout(outcomes, acts.get(cell))))
        (root / cell / "train.log").write_text("log\n")
        if cell != "ascent_lr1e-4_s1_k0":  # unfinished: not archived
            (root / cell / "done").write_text("")
    text = sweep.main(["--root", str(root), "--archive", str(archive), "--out", str(tmp_path / "sweep")])
    assert sorted(p.name for p in archive.iterdir()) == [
        "ascent_lr1e-3_s1_k0.heldout.jsonl.gz", "ascent_lr1e-3_s1_k0.jsonl.gz", "ascent_lr1e-3_s1_k0.train.log.gz",
        "base.heldout.jsonl.gz", "base.jsonl.gz", "base.train.log.gz"]
    assert gzip.decompress((archive / "base.train.log.gz").read_bytes()) == b"log\n"
    lines = text.splitlines()
    assert lines[2].startswith("| base | 0 | 0 | 0 | 2/4 | - | - |")
    assert lines[3].startswith("| ascent_lr1e-3_s1_k0 | 0.001 | 1 | 0 | 3/4 | +25.0 [")
    # the base's commonest verb (craft, tied with get: first seen) and each cell's share of it, then the share
    # of words the base never uses (x)
    assert lines[0].endswith("| `craft` actions | words the base never uses |")
    assert lines[2].endswith("| 50.0% | 0.0% |") and lines[3].endswith("| 12.5% | 12.5% |")
    assert "- chosen for ascent among its 1 cell(s) here: ascent_lr1e-3_s1_k0" in text
    assert json.loads((tmp_path / "sweep.json").read_text())[0]["cell"] in ("base", "ascent_lr1e-3_s1_k0")


def test_validity_pairs_each_stream_seed_with_the_base_of_its_seed(tmp_path):
    def write(path, records):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode()))

    streams = tmp_path / "runs"
    write(streams / "base" / "seed0.heldout.jsonl.gz", heldout("1100"))
    write(streams / "base" / "seed1.heldout.jsonl.gz", heldout("0011"))
    write(streams / "ascent_lr1e-4_s1_k0" / "seed0.heldout.jsonl.gz", heldout("1000"))
    write(streams / "ascent_lr1e-4_s1_k0" / "seed0.jsonl.gz", stream([0.5, 0.25], 0.0))
    write(streams / "ascent_lr1e-4_s1_k0" / "seed1.heldout.jsonl.gz", heldout("1111"))
    proxy = heldout("1110")
    rows = [sweep.cell_row("base", [], heldout("1100"), None), sweep.cell_row("ascent_lr1e-4_s1_k0", [], proxy, None),
            sweep.cell_row("ascent_lr1e-3_s1_k0", [], proxy, None)]  # no streams: not in the table
    got = sweep.validity_rows(rows, streams)
    assert [(r["cell"], r["run"], r["solved"]) for r in got] == [
        ("ascent_lr1e-4_s1_k0", "proxy", 3), ("ascent_lr1e-4_s1_k0", "seed0", 1), ("ascent_lr1e-4_s1_k0", "seed1", 4)]
    assert got[1]["counts"] == {"both": 1, "only_method": 0, "only_base": 1, "neither": 2}  # vs base seed 0
    assert got[2]["counts"] == {"both": 2, "only_method": 2, "only_base": 0, "neither": 0}  # vs base seed 1
    assert got[1]["updates"] == 2 and got[1]["absorbed"] == pytest.approx(0.375)
    table = sweep.validity_markdown(got).splitlines()
    assert table[3].startswith("| ascent_lr1e-4_s1_k0 | seed0 | 1/4 | -25.0 [") and len(table) == 5
