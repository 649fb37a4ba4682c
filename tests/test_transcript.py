"""Transcripts in TensorBoard's text tab and the run's settings as hyperparameters."""
from __future__ import annotations

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks.transcript import flat_settings
from lit_ascent.cli import main
from lit_ascent.transcript import fenced, render, update_line
from tests.conftest import hand_episode


def test_render_marks_invalid_turns_and_shows_actions_observations_and_the_update(policy):
    ep = hand_episode(policy.tokenizer, ["Thought: go.\nAction: get 1 log", "Thought: hm.\nno action here"],
                      valid=[True, False], task_id="minecraft:stick", observation=lambda t: f"reply {t}",
                      verified=False)
    ep.error = "RuntimeError('boom')"
    stats = {"updates": 2, "update/loss_before": 0.5, "update/loss_after": 0.25, "update/absorbed_fraction": 0.5}
    text = render(ep, stats)
    assert "`minecraft:stick`" in text and "**failed** in 2 turns, 1 invalid" in text
    assert "environment error: `RuntimeError('boom')`" in text
    assert "**turn 1**: `get 1 log`" in text and "**turn 2** (**invalid**): no parseable action" in text
    assert "Thought: hm.\nno action here" in text and "reply 0" in text and "reply 1" in text
    assert "2 optimiser steps (loss_before 0.5, loss_after 0.25, absorbed_fraction 0.5)" in text


def test_update_line_says_why_there_was_no_update(policy):
    ep = hand_episode(policy.tokenizer, ["Action: a"], verified=False)
    ep.trainable = False
    assert "vetoed" in update_line(ep, {"updates": 0})
    ep.trainable = True
    assert update_line(ep, {"updates": 0}) == "**update:** none (nothing to learn)"
    assert update_line(ep, {"updates": 1}) == "**update:** 1 optimiser step"


def test_fenced_keeps_text_verbatim_and_notes_the_cut():
    assert fenced("a *b* ```c```", 100) == "```\na *b* '''c'''\n```"
    assert fenced("x" * 10, 4) == "```\nxxxx\n... [6 more characters]\n```"


def test_flat_settings_flattens_nested_config_to_showable_values():
    flat = flat_settings({"model": {"optim": {"lr": 1e-4}, "name": "m"}, "paths": ["a.yaml", "b.yaml"], "x": None,
                          "on": True})
    assert flat == {"model.optim.lr": 1e-4, "model.name": "m", "paths": "a.yaml, b.yaml", "x": "None", "on": True}


def test_debug_run_logs_each_task_transcript_and_its_settings(tmp_path):
    main(["fit", "--config", "configs/debug.yaml", "--trainer.default_root_dir", str(tmp_path),
          "--trainer.enable_progress_bar", "false"])
    run = tmp_path / "debug" / "version_0"
    records = [json.loads(line) for line in (run / "experience.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(run), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    for r in records:
        [summary] = events.Tensors(f"transcript/task_{r['task_index']:04d}/text_summary")
        text = summary.tensor_proto.string_val[0].decode()
        assert summary.step == r["task_index"] and f"`{r['task_id']}`" in text
        assert ("**SOLVED**" in text) == r["verified"] and f"in {r['turns']} turns, {r['invalid']} invalid" in text
        assert text.count("(**invalid**)") == r["invalid"]
        assert ("optimiser step" in text) == (r["updates"] > 0)
    diagnostics = sorted(k for k in records[0] if k.startswith(("diagnostics/", "stream/invalid_rate_window")))
    assert "diagnostics/first_token_entropy" in diagnostics and "stream/invalid_rate_window" in diagnostics
    for key in diagnostics:  # what the episode callbacks added reaches TensorBoard, one point per task
        assert [e.value for e in events.Scalars(key)] == pytest.approx([r[key] for r in records])
    success = sum(r["verified"] for r in records) / len(records)
    assert [(e.step, e.value) for e in events.Scalars("hp_metric")] == [(0, -1.0), (len(records), success)]
    hparams = (run / "hparams.yaml").read_text()
    assert "model.optim.lr: 0.001" in hparams and "data.env.class_path: lit_ascent.envs.ScriptedEnv" in hparams


def test_learning_line_says_what_the_updates_changed():
    from callbacks.report import learning_line

    base = {"verified": False, "updates": 0, "update": {}, "task_index": 0}
    assert learning_line([base]) == "learning: no update"
    records = [{**base, "verified": True, "updates": 2, "update": {"update/absorbed_fraction": 0.5}},
               {**base, "task_index": 1, "verified": True, "updates": 1, "update": {"update/absorbed_fraction": 0.25}},
               {**base, "task_index": 2, "diagnostics/probe_actions": 8.0, "diagnostics/action_kl": 3.1e-4,
                "diagnostics/action_changes": 1.0}]
    assert learning_line(records) == (
        "learning: 3 optimiser steps from 2 episodes (2 verified); each absorbed 50%/25% of its episode's loss; "
        "on 8 probe actions before task 2: KL 0.00031 nats from the initial model, 1 greedy actions changed")
