"""An interrupted reference evaluation continues from the episodes it saved (``warmstart eval --resume``)."""
from __future__ import annotations

import json

import pytest

from lit_ascent.warmstart.cli import main

EVAL = ["eval", "--env", "textcraft", "--num-tasks", "3", "--hindsight", "--model", "tiny-random",
        "--dtype", "float32", "--max-turns", "2", "--max-new-tokens", "8"]


def _same(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("task_id", "verified", "turns", "invalid", "actions"))


def test_resume_keeps_saved_episodes_and_runs_only_the_rest(tmp_path):
    out = tmp_path / "eval.json"
    assert main([*EVAL, "--out", str(out)]) == 0
    full = json.loads(out.read_text())
    assert "partial" not in full and full["args"]["num_tasks"] == 3

    # an interruption during the second mode: plain finished, one hindsight episode saved
    plain, hindsight = full["rows"]["plain"]["episodes"], full["rows"]["hindsight"]["episodes"]
    for record in plain[:1] + hindsight[:1]:
        record["marker"] = True  # kept records come back as saved, not recomputed
    moved = {**full["args"], "out": "elsewhere/eval.json"}  # a moved file still resumes
    out.write_text(json.dumps({"args": moved, "eval_s": 5.0,
                               "rows": {"plain": full["rows"]["plain"]}, "partial": {"hindsight": hindsight[:1]}}))
    assert main([*EVAL, "--out", str(out), "--resume"]) == 0
    resumed = json.loads(out.read_text())
    assert "partial" not in resumed and resumed["eval_s"] >= 5.0
    assert resumed["rows"]["plain"]["episodes"] == plain
    again = resumed["rows"]["hindsight"]["episodes"]
    assert again[0] == hindsight[0] and "marker" not in again[1] and "marker" not in again[2]
    assert all(_same(a, b) for a, b in zip(again, hindsight))  # float32 tiny model: the same greedy episodes
    for mode in ("plain", "hindsight"):
        row, ref = resumed["rows"][mode], full["rows"][mode]
        assert (row["tasks"], row["success_rate"], row["turns"], row["invalid_rate"]) == \
            (ref["tasks"], ref["success_rate"], ref["turns"], ref["invalid_rate"])


def test_resume_refuses_other_settings_and_starts_fresh_without_a_file(tmp_path, caplog):
    out = tmp_path / "eval.json"
    with caplog.at_level("INFO", logger="lit_ascent.warmstart"):
        assert main([*EVAL[:-4], "--max-turns", "1", "--max-new-tokens", "4", "--out", str(out), "--resume"]) == 0
    assert any("no earlier results" in r.getMessage() for r in caplog.records)
    assert json.loads(out.read_text())["rows"]["plain"]["tasks"] == 3
    with pytest.raises(ValueError, match="max_turns"):
        main([*EVAL, "--out", str(out), "--resume"])


def test_partial_records_are_handed_out_after_each_group(policy):
    from lit_ascent.envs import ScriptedEnv
    from lit_ascent.rollout import RolloutConfig
    from lit_ascent.warmstart.eval import evaluate_modes

    env = ScriptedEnv(num_tasks=3, episode_steps=2, verify_every=2)
    calls = []
    rows = evaluate_modes(policy, env, env.tasks(), RolloutConfig(max_turns=2, max_new_tokens=4), ["plain"], None,
                          on_row=lambda rows, partial: calls.append((list(rows), {m: len(r) for m, r in partial.items()})),
                          batch_size=2)
    assert calls == [([], {"plain": 2}), ([], {"plain": 3}), (["plain"], {})]
    assert [r["task_id"] for r in rows["plain"]["episodes"]] == [t.task_id for t in env.tasks()]
    with pytest.raises(ValueError, match="not the first tasks"):
        evaluate_modes(policy, env, env.tasks(), RolloutConfig(max_turns=2), ["plain"], None,
                       done={"plain": rows["plain"]["episodes"][1:]})
