"""Task-by-task agreement of two logs of the same stream (python -m lit_ascent.results.reproduce)."""
from __future__ import annotations

import json

import pytest

from lit_ascent.results.reproduce import agreement, first_difference, main


def rec(k: int, verified: bool, actions: list[str], task_id: str | None = None) -> dict:
    return {"task_index": k, "task_id": task_id or f"t{k}", "verified": verified, "turns": len(actions),
            "actions": actions}


def test_first_difference():
    assert first_difference(["a", "b"], ["a", "b"]) is None
    assert first_difference(["a", "b"], ["a", "c"]) == 1
    assert first_difference(["a"], ["a", "b"]) == 1
    assert first_difference([], []) is None


def test_agreement_counts_outcomes_and_trajectories_on_the_common_prefix():
    a = [rec(0, True, ["x", "y"]), rec(1, False, ["x", "x"]), rec(2, False, ["z"])]
    b = [rec(0, True, ["x", "y"]), rec(1, False, ["x", "q"])]
    rows = agreement(a, b)
    assert [(r["same_outcome"], r["same_actions"], r["first_difference"]) for r in rows] == [
        (True, True, None), (True, False, 2)]


def test_agreement_refuses_two_different_streams():
    with pytest.raises(ValueError, match="not the same stream"):
        agreement([rec(0, True, ["x"], "a")], [rec(0, True, ["x"], "b")])


def test_command_prints_the_table_and_the_counts(tmp_path, capsys):
    for name, records in (("a.jsonl", [rec(0, True, ["x"]), rec(1, False, ["y", "y"])]),
                          ("b.jsonl", [rec(0, False, ["w"]), rec(1, False, ["y", "y"])])):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    out = main([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--labels", "bf16", "fp32"])
    assert "| 0 | t0 | solved in 1 | failed (1 turns) | no | 1 |" in out
    assert "same outcome: 1/2; same trajectory: 1/2; solved: bf16 1/2, fp32 0/2" in out
    with pytest.raises(SystemExit):
        main([str(tmp_path / "a.jsonl"), str(tmp_path / "missing.jsonl")])
