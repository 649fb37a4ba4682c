"""Slow: the real embedded SmolLM2 on the real TextCraft environment, through the CLI."""
from __future__ import annotations

import json

import pytest

from tests.test_cli import run_cli

pytestmark = pytest.mark.slow


def test_demo_verifies_updates_and_says_what_the_updates_changed(tmp_path):
    """`make demo`'s stream (configs/demo.yaml): the reference base solves a task, the adapter is
    updated, the summary reports the update's effect, TensorBoard holds each task's transcript."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    proc = run_cli(tmp_path, "--config", "configs/textcraft/ascent.yaml", "--config", "configs/demo.yaml",
                   timeout=2400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    run = tmp_path / "runs" / "demo" / "version_0"
    records = [json.loads(line) for line in (run / "experience.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(r["task_id"].startswith("minecraft:") for r in records)
    assert any(r["verified"] for r in records) and sum(r["updates"] for r in records) >= 1
    assert all(r["update"]["update/absorbed_fraction"] > 0 for r in records if r["updates"])
    assert "stream summary: tasks=3" in out and "learning: " in out and "absorbed" in out
    events = EventAccumulator(str(run), size_guidance={"tensors": 0})
    events.Reload()
    assert {f"transcript/task_{k:04d}/text_summary" for k in range(3)} <= set(events.Tags()["tensors"])
    assert (run / "adapter" / "final" / "adapter_model.safetensors").exists()


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


def test_smollm2_with_a_procedural_memory_on_textcraft(tmp_path):
    """The in-context baseline on the real model and env: `make demo`'s stream (its first goal is
    solved) with configs/methods/procedural.yaml; the later tasks are shown the stored episode."""
    proc = run_cli(tmp_path, "--config", "configs/textcraft/ascent.yaml", "--config", "configs/demo.yaml",
                   "--config", "configs/methods/procedural.yaml", timeout=2400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "procedural" / "version_0"
    records = [json.loads(line) for line in (run / "experience.jsonl").read_text().splitlines()]
    assert records[0]["verified"] and records[0]["memory/shown"] == 0 and records[0]["memory/size"] == 1
    assert all(r["updates"] == 0 and r["error"] is None for r in records)
    later = records[1]
    assert later["memory/shown"] >= 1 and 0 < later["memory/tokens"] <= 1024
    assert later["memory_text"].startswith("Memory: verified successful attempts") and "Step 1:" in later["memory_text"]


def test_smollm2_shops_on_webshop_through_the_loop(tmp_path):
    """The real model on the offline WebShop (configs/webshop/ascent.yaml): two goals, three turns each."""
    from lit_ascent.envs.webshop_data import has_data

    if not has_data():
        pytest.skip("no WebShop data (set WEBSHOP_DATA)")
    proc = run_cli(tmp_path, "--config", "configs/webshop/ascent.yaml", "--data.num_tasks", "2",
                   "--model.rollout.max_turns", "3", "--model.rollout.max_new_tokens", "48", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "webshop" / "version_0"
    records = [json.loads(line) for line in (run / "experience.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["env"] == "webshop" and "#" in r["task_id"] for r in records)
    assert all(1 <= r["turns"] <= 3 and r["error"] is None and len(r["texts"]) == r["turns"] for r in records)
    assert all(r["partition"] == "stream" and r["asin"] == r["task_id"].split("#")[0] for r in records)


def test_smollm2_replay_and_learning_diagnostics_on_a_verified_textcraft_episode():
    """With the real model and a real verified TextCraft episode: cached teacher targets equal the
    recomputed ones, a step on the current + a replayed episode absorbs part of the divergence,
    and the action tokens found by the diagnostics spell the episode's actions."""
    import torch

    from callbacks.diagnostics import CollapseDiagnostics
    from lit_ascent.collapse import action_positions
    from lit_ascent.bench.replay import real_episode
    from lit_ascent.models import ModelConfig, load_policy
    from lit_ascent.objectives import Distillation
    from lit_ascent.objectives.experience_replay import ReplayBuffer, ReplayConfig

    policy = load_policy(ModelConfig(dtype="float32"))
    episode = real_episode(policy)
    pos, _ = action_positions(policy.tokenizer, episode, max_tokens=10_000)
    spelled = policy.tokenizer.decode([episode.token_ids[p + 1] for p in pos])
    assert spelled.replace(" ", "") == "".join(episode.actions).replace(" ", "")

    obj = Distillation(chunk_size=128)
    policy.model.train()
    buffer = ReplayBuffer(ReplayConfig(k=1))
    buffer.add(episode, obj.prepare(policy, episode))
    restored = ReplayBuffer(ReplayConfig(k=1))
    restored.load_state_dict(buffer.state_dict(), lambda ep: obj.prepare(policy, ep))
    torch.testing.assert_close(restored.entries[0].prepared, buffer.entries[0].prepared, rtol=0, atol=0)

    probes = CollapseDiagnostics(probe_episodes=1)
    probes.maybe_add_probe(policy.tokenizer, episode)
    prepared = buffer.entries[0].prepared
    before = obj.loss(policy, episode, prepared).loss.detach()
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-3)
    for ep, prep in [(episode, prepared), (restored.entries[0].episode, restored.entries[0].prepared)]:
        (obj.loss(policy, ep, prep).loss / 2).backward()
    opt.step()
    with torch.no_grad():
        after = obj.loss(policy, episode, prepared).loss
    assert 0 < float(after) < float(before)
    drift = probes.measure(policy)
    assert drift["diagnostics/action_kl"] > 0 and drift["diagnostics/probe_actions"] == len(episode.turns)


def test_smollm2_heldout_evaluation_on_textcraft(tmp_path):
    """The held-out overlay on the real TextCraft: the initial and the adapted model each play the
    same two held-out goals (batched, float32), none of them in the stream."""
    proc = run_cli(tmp_path, "--config", "configs/textcraft/ascent.yaml", "--config", "configs/heldout/textcraft.yaml",
                   "--data.num_tasks", "1", "--heldout.num_tasks", "2", "--heldout.batch_size", "2",
                   "--model.rollout.max_turns", "2", "--model.rollout.max_new_tokens", "32", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = next((tmp_path / "runs").glob("*/version_0"))
    records = [json.loads(line) for line in (run / "heldout.jsonl").read_text().splitlines()]
    assert [r["model"] for r in records] == ["initial", "initial", "adapted", "adapted"]
    assert {r["task_id"] for r in records[:2]} == {r["task_id"] for r in records[2:]}
    stream = [json.loads(line)["task_id"] for line in (run / "experience.jsonl").read_text().splitlines()]
    assert not set(stream) & {r["task_id"] for r in records}


def test_committed_textcraft_episode_reproduces_in_float32():
    """The reference config runs in float32 so that committed per-task outcomes reproduce on another
    machine (docs/results/README.md, Reproducibility): seed 1's task 3, built from the config as the
    stream builds it, replays the committed episode action for action."""
    from lit_ascent.cli import main
    from lit_ascent.models import load_policy
    from lit_ascent.rollout import rollout
    from lit_ascent.records import read_records

    committed = read_records("docs/results/textcraft_efficacy/runs/base/seed1.jsonl.gz")[3]
    cli = main(["--config", "configs/textcraft/ascent.yaml", "--config", "configs/methods/base.yaml",
                "--data.seed", "1"], run=False)
    assert cli.model.llm_cfg.dtype == "float32"
    data = cli.datamodule
    data.setup()
    try:
        task = data.stream[3]
        assert task.task_id == committed["task_id"] == "minecraft:spruce_trapdoor"
        policy = load_policy(cli.model.llm_cfg)
        episode = rollout(policy.model, policy.tokenizer, data.env, task, cli.model.rollout_cfg)
    finally:
        data.teardown()
    assert episode.actions == committed["actions"] and episode.verified == committed["verified"] is True


def test_resail_cycles_on_the_textcraft_reference_base(tmp_path):
    """`scripts/resail_cycles.sh`'s configs (float32, without its CPU schedule) on the real model and TextCraft,
    cut to 3 tasks and 1 cycle: the reference base verifies a task, SGS distils it (gradient checkpointing on),
    the collapse diagnostics see the moved action tokens."""
    from lit_ascent.cycles import main

    rows = main(["--config", "configs/resail/sdpo.yaml", "--config", "configs/resail/reference/textcraft.yaml",
                 "--config", "configs/resail/sdpo_resail.yaml", "--env.init_args", '{"depths": [2], "split": "eval"}',
                 "--num_tasks", "3", "--task_seed", "244", "--rollout.max_turns", "10", "--cycles.cycles", "1",
                 "--cycles.updates_per_cycle", "2", "--cycles.batch_size", "2", "--cycles.probe_size", "1",
                 "--cycles.eval_batch_size", "3", "--log_dir", str(tmp_path)])
    assert len(rows) == 2 and rows[0]["deployed/verified"] >= 1 and rows[0]["updates"] == 2
    assert 0 < rows[0]["resail/selected_steps"] < rows[0]["resail/steps"]  # SGS kept a share of the steps
    assert rows[0]["diagnostics/probe_actions"] > 0 and rows[0]["diagnostics/action_kl"] == 0  # initial weights
    assert rows[1]["diagnostics/action_kl"] > 0 and rows[1]["probe/size"] == 1
    tasks = [json.loads(line) for line in (tmp_path / "tasks.jsonl").read_text().splitlines()]
    assert len(tasks) == 2 * (3 + 1) and all(t["task_id"].startswith("minecraft:") for t in tasks)
