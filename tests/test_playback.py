"""Playback (``model.playback.log``): a stream that learns from an earlier run's recorded episodes."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from lit_ascent.envs import ScriptedEnv
from lit_ascent.playback import Playback
from lit_ascent.trajectory import Task
from test_cli import run_cli


def _records(root: Path, name: str) -> list[dict]:
    return [json.loads(x) for x in (root / "runs" / name / "version_0" / "experience.jsonl").read_text().splitlines()]


def _outcome(r: dict) -> tuple:
    return r["task_id"], r["verified"], r["turns"], r["actions"], r["texts"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A debug stream with no update (the base row): its log is what playback learns from."""
    root = tmp_path_factory.mktemp("playback")
    proc = run_cli(root, "--config", "configs/debug.yaml", "--config", "configs/methods/base.yaml",
                   "--trainer.logger.init_args.name", "base", "--model.rollout.max_new_tokens", "24")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def test_playback_replays_the_log_and_updates_after_its_verified_episodes(recorded):
    log = recorded / "runs" / "base" / "version_0" / "experience.jsonl"
    archived = recorded / "base.jsonl.gz"  # an archived log (the report's copy) reads the same
    archived.write_bytes(gzip.compress(log.read_bytes()))
    proc = run_cli(recorded, "--config", "configs/debug.yaml", "--model.playback.log", str(archived),
                   "--trainer.logger.init_args.name", "played", "--model.optim.updates_per_task", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    base, played = _records(recorded, "base"), _records(recorded, "played")
    assert [_outcome(r) for r in played] == [_outcome(r) for r in base]
    assert sum(r["updates"] for r in base) == 0
    assert [r["updates"] for r in played] == [2 * r["verified"] for r in base] and any(r["verified"] for r in base)
    assert all(r["timings"]["playback_mismatches"] == 0 for r in played)
    adapter = load_file(str(recorded / "runs" / "played" / "version_0" / "adapter" / "final" / "adapter_model.safetensors"))
    assert any(bool(v.any()) for k, v in adapter.items() if "lora_B" in k)  # the fast weights moved


def test_playback_log_must_hold_texts_and_every_stream_task(tmp_path):
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"task_index": 0, "task_id": "task-0", "verified": True, "turns": 1}) + "\n")
    with pytest.raises(ValueError, match="no turn texts"):
        Playback(str(old))
    with pytest.raises(ValueError, match="no file"):
        Playback(str(tmp_path / "missing.jsonl"))
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"task_index": 0, "task_id": "task-0", "verified": False, "turns": 0, "texts": []}) + "\n")
    playback = Playback(str(log))
    with pytest.raises(ValueError, match="1 of the stream's 2 tasks.*'task-1'"):
        playback.check([Task("scripted", "task-0"), Task("scripted", "task-1")])


def test_playback_counts_a_verdict_that_differs_from_the_log(tmp_path, policy):
    env = ScriptedEnv(num_tasks=2, episode_steps=2, verify_every=1)
    task = env.tasks()[0]
    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"task_index": 0, "task_id": task.task_id, "verified": False, "turns": 2,
                               "texts": ["Action: go", "Action: go"]}) + "\n")
    playback = Playback(str(log))
    ep = playback.episode(policy.tokenizer, env, task)  # verify_every=1: the environment verifies it
    assert [t.action for t in ep.turns] == ["go", "go"] and ep.verified
    assert playback.mismatches == 1 and ep.timings["playback_mismatches"] == 1
    assert playback.episode(policy.tokenizer, env, task).timings["playback_mismatches"] == 2  # counted, not fatal
