"""The sign control's archive and table: hand-made plays at scale +1 and -1 against the base run."""
from __future__ import annotations

import json

import pytest
from test_heldout import records

from lit_ascent.results import paired, sign_control


def acting(outcomes: str, actions: str = "a") -> list[dict]:
    return [{**r, "actions": [f"{actions}{r['task_id']}"]} for r in records(outcomes)]


def write_play(root, seed, scale, rows, done=True):
    play = root / seed / f"scale{scale}"
    play.mkdir(parents=True)
    (play / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (play / "train.log").write_text("log\n")
    if done:
        (play / "done").touch()


def test_archive_then_table_against_hand_counts(tmp_path):
    root, archive = tmp_path / "plays", tmp_path / "sign_control"
    heldout = {"ascent": {"seed0": acting("1110"), "seed1": acting("1100")},
               "base": {"seed0": acting("1100", "b"), "seed1": acting("1010", "b")}}
    write_play(root, "seed0", "1", acting("1110"))                 # reproduces seed0's run
    write_play(root, "seed0", "-1", acting("1000", "m"))
    write_play(root, "seed1", "1", acting("1100")[:3] + acting("1101", "x")[3:])  # h3 played otherwise
    write_play(root, "seed1", "-1", acting("0000", "m"))
    write_play(root, "seed2", "1", acting("1111"), done=False)     # unfinished: not archived
    written = sign_control.archive_controls(root, archive)
    assert sorted(p.name for p in written if p.name.endswith(".heldout.jsonl.gz")) == [
        "seed0_scale-1.heldout.jsonl.gz", "seed0_scale1.heldout.jsonl.gz",
        "seed1_scale-1.heldout.jsonl.gz", "seed1_scale1.heldout.jsonl.gz"]
    rows = sign_control.sign_rows(sign_control.load_controls(archive), heldout)
    table = {(r["seed"], r["row"], r["reference"]): r for r in rows}
    # seed0: +1 1110 vs base 1100 -> only +1 h2; -1 1000 vs base -> only base h1; +1 vs -1 -> only +1 h1, h2
    # seed1: +1 1101 vs base 1010 -> only +1 h1 h3, only base h2; -1 0000 vs base -> only base h0 h2; +1 vs -1: 3
    expected = {("+1", "base"): (1, 0, 2, 1), ("-1", "base"): (0, 1, 0, 2), ("+1", "-1"): (2, 0, 3, 0)}
    for (row, ref), (o0, b0, o1, b1) in expected.items():
        assert (table["seed0", row, ref]["only_method"], table["seed0", row, ref]["only_base"]) == (o0, b0)
        assert (table["seed1", row, ref]["only_method"], table["seed1", row, ref]["only_base"]) == (o1, b1)
        pooled = table["pooled", row, ref]
        assert (pooled["only_method"], pooled["only_base"]) == (o0 + o1, b0 + b1)
        assert pooled["p"] == pytest.approx(paired.mcnemar_exact_p(o0 + o1, b0 + b1))
    assert table["seed0", "+1", "base"]["reproduced"] == 4 and table["seed1", "+1", "base"]["reproduced"] == 3
    md = sign_control.sign_markdown(rows)
    assert "| seed0 | +1 vs base | 3 | 2 | 1 | 0 | 1 | +25.0 [" in md and md.count("| pooled |") == 3
    assert md.splitlines()[-1].endswith("| - |")  # pooled rows: no reproduction count


def test_a_seed_without_both_scales_or_runs_is_left_out(tmp_path):
    controls = {"seed0": {"1": acting("10")}, "seed1": {"1": acting("10"), "-1": acting("00")}}
    assert sign_control.sign_rows(controls, {"ascent": {"seed0": acting("10")}, "base": {"seed0": acting("00")}}) == []
