"""Replay of verified experience: the bounded buffer, cached targets, replay off = the paper's
step bit for bit, every episode objective replays, exact resume with a non-empty buffer."""
from __future__ import annotations

import random
import signal

import pytest
import torch
from conftest import hand_episode
from test_resume import assert_same_adapter, fit_forked, outcomes

from callbacks.stream_checkpoint import load_state
from lit_ascent.cli import main
from lit_ascent.module import OaTTTModule
from lit_ascent.objectives import TTOPSD, Distillation, Imitation, Reinforce, ReinforcePP, ReSAIL
from lit_ascent.objectives.experience_replay import (ReplayBuffer, ReplayConfig, draw_without_replacement,
                                                     recency_weights, tensor_bytes)
from lit_ascent.trajectory import episode_from_state, episode_state

DEBUG = ["--config", "configs/debug.yaml", "--trainer.enable_progress_bar", "false", "--report.verbose", "false"]


def episode(tokenizer, k: int):
    return hand_episode(tokenizer, [f"Thought: step {k}\nAction: go {k}", "Thought: done\nAction: stop"],
                        task_id=f"t{k}")


def test_buffer_is_bounded_by_count_and_bytes(policy):
    buf = ReplayBuffer(ReplayConfig(k=2, buffer_size=3))
    for k in range(5):
        buf.add(episode(policy.tokenizer, k), (torch.zeros(10, 4),))  # 160 bytes each
    assert [e.episode.task.task_id for e in buf.entries] == ["t2", "t3", "t4"]  # oldest out first
    assert buf.counts == {"added": 5, "evicted": 2, "too_large": 0}
    small = ReplayBuffer(ReplayConfig(k=1, buffer_size=10, max_mb=400 / 2**20))  # room for two entries
    for k in range(4):
        small.add(episode(policy.tokenizer, k), (torch.zeros(10, 4),))
    assert len(small) == 2 and small.nbytes == 320
    small.add(episode(policy.tokenizer, 9), (torch.zeros(200, 4),))  # 3,200 bytes > the whole budget
    assert small.counts["too_large"] == 1 and len(small) == 2
    buf.add(episode(policy.tokenizer, 7), None)  # nothing to learn from: never buffered
    assert buf.counts["added"] == 5


def test_sampling_is_seeded_distinct_and_recency_weighted(policy):
    def draws(seed, sampling):
        buf = ReplayBuffer(ReplayConfig(k=3, buffer_size=8, sampling=sampling, half_life=2.0), seed)
        for k in range(8):
            buf.add(episode(policy.tokenizer, k), (torch.zeros(1),))
        return [[e.episode.task.task_id for e in buf.sample(3)] for _ in range(200)]

    for sampling in ("uniform", "recency"):
        a = draws(0, sampling)
        assert a == draws(0, sampling) and a != draws(1, sampling)
        assert all(len(set(d)) == 3 for d in a)
    newest = sum("t7" in d for d in draws(0, "recency")) / 200
    oldest = sum("t0" in d for d in draws(0, "recency")) / 200
    assert newest > 0.6 and oldest < 0.2  # uniform: 3/8 each; here t0 weighs 2^-3.5 of t7
    assert recency_weights(3, 1.0) == [0.25, 0.5, 1.0]
    for seed in range(20):  # a zero weight is drawn only when nothing else is left; k is capped at n
        assert sorted(draw_without_replacement(random.Random(seed), [1.0, 0.0, 2.0], 2)) == [0, 2]
        assert sorted(draw_without_replacement(random.Random(seed), [1.0, 0.0, 2.0], 5)) == [0, 1, 2]


def test_tensor_bytes_counts_nested_tensors():
    from lit_ascent.objectives.resail import StepTargets

    t = StepTargets(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long), 1, torch.zeros(5),
                    0, torch.zeros(3, 2, dtype=torch.bfloat16), torch.zeros(1), torch.ones(1, dtype=torch.bool),
                    torch.zeros(1, dtype=torch.bool))
    assert tensor_bytes(t) == 24 + 24 + 20 + 12 + 4 + 1 + 1
    assert tensor_bytes([(torch.zeros(2), None, 3), {"a": torch.zeros(1, dtype=torch.float64)}]) == 16


def test_episode_state_round_trips(policy):
    ep = episode(policy.tokenizer, 1)
    ep.pi_valid_only = True
    back = episode_from_state(episode_state(ep))
    assert back == ep


OBJECTIVES = [Distillation(chunk_size=16), Distillation(chunk_size=16, teacher_top_k=5), Imitation(chunk_size=16),
              Imitation(kl_weight=0.1, chunk_size=16), TTOPSD(chunk_size=16),
              ReSAIL(chunk_size=16, selection_ratio=0.5)]


@pytest.mark.parametrize("objective", OBJECTIVES, ids=lambda o: type(o).__name__)
def test_cached_targets_equal_recomputed_ones(policy, objective):
    """Tolerance 0: the frozen teacher gives the same tensors when a resume recomputes them."""
    buf = ReplayBuffer(ReplayConfig(k=1))
    for k in range(2):
        ep = episode(policy.tokenizer, k)
        buf.add(ep, objective.prepare(policy, ep))
    with torch.no_grad():  # the fast weights move: the teacher's targets must not
        for p in policy.trainable_parameters():
            p.add_(0.05)
    restored = ReplayBuffer(ReplayConfig(k=1))
    restored.load_state_dict(buf.state_dict(), lambda ep: objective.prepare(policy, ep))
    assert [e.episode for e in restored.entries] == [e.episode for e in buf.entries]
    for a, b in zip(buf.entries, restored.entries):
        if isinstance(objective, ReSAIL):  # a list of StepTargets
            cached, recomputed = [vars(x) for x in a.prepared], [vars(y) for y in b.prepared]
        else:
            cached, recomputed = a.prepared, b.prepared
        torch.testing.assert_close(cached, recomputed, rtol=0, atol=0)
    assert restored.rng.random() == buf.rng.random()


@pytest.mark.parametrize("objective", [Reinforce(), ReinforcePP()], ids=lambda o: type(o).__name__)
def test_policy_gradient_rejects_replay(objective):
    with pytest.raises(ValueError, match="model.replay.k must be 0 with Reinforce"):
        OaTTTModule(objective=objective, replay=ReplayConfig(k=2))
    OaTTTModule(objective=objective, replay=ReplayConfig(k=0))


@pytest.mark.parametrize("kwargs,match", [({"k": -1}, "model.replay.k"), ({"buffer_size": 0}, "buffer_size"),
                                          ({"max_mb": 0}, "max_mb"), ({"sampling": "lifo"}, "sampling"),
                                          ({"half_life": 0}, "half_life")])
def test_bad_replay_settings_name_the_option(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReplayConfig(**kwargs)


def legacy_learn(self, episode):
    """The update as it was before replay existed (one loss, backward, clip, step per update)."""
    stats = {"updates": 0}
    if not (self.objective.updates and episode.trainable):
        return stats
    policy, opt = self.policy, self.optimizers()
    policy.model.train()
    prepared = self.objective.prepare(policy, episode)
    for _ in range(self.optim_cfg.updates_per_task):
        out = self.objective.loss(policy, episode, prepared)
        if out is None:
            break
        opt.zero_grad(set_to_none=True)
        self.manual_backward(out.loss)
        torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), self.optim_cfg.grad_clip)
        opt.step()
        stats["updates"] += 1
        stats.update(out.metrics)
    opt.zero_grad(set_to_none=True)
    self.counters["updates"] += stats["updates"]
    return stats


def _run(tmp_path, name, *extra):
    main(["fit", *DEBUG, "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.logger.init_args.name",
          name, "--trainer.logger.init_args.version", "v", "--model.optim.updates_per_task", "2",
          "--data.env.init_args.verify_every", "1", *extra])
    return tmp_path / name / "v"


OLD_KEYS = {"task_index", "env", "task_id", "family", "verified", "turns", "invalid", "actions", "valid", "tokens",
            "error", "diagnostics/first_token_entropy", "diagnostics/drift_kl", "updates", "loss"}


def test_replay_off_is_the_step_of_before(tmp_path, monkeypatch):
    new = _run(tmp_path, "new")
    with monkeypatch.context() as m:
        m.setattr(OaTTTModule, "learn", legacy_learn)
        old = _run(tmp_path, "old")
    got, want = ([{k: v for k, v in r.items() if k in OLD_KEYS} for r in outcomes(f)] for f in (new, old))
    assert got == want and sum(r["updates"] for r in got) == 8
    assert_same_adapter(new, old)
    records = outcomes(new)
    assert all(r["update"]["update/replayed"] == 0 and "replay/buffer_episodes" not in r["update"]
               for r in records)  # k = 0: no buffer, nothing replayed
    for r in records:  # the first step's loss is the 'before'; the absorbed fraction follows from it
        u = r["update"]
        assert u["update/absorbed_fraction"] == pytest.approx(1 - u["update/loss_after"] / u["update/loss_before"])


def test_replay_uses_k_buffered_episodes_per_step(tmp_path):
    folder = _run(tmp_path, "replay", "--model.replay.k", "2", "--model.replay.buffer_size", "2")
    records = outcomes(folder)
    assert [r["update"]["update/replayed"] for r in records] == [0.0, 1.0, 2.0, 2.0]
    assert [r["update"]["replay/buffer_episodes"] for r in records] == [1.0, 2.0, 2.0, 2.0]
    assert records[-1]["update"]["replay/evicted"] == 2.0
    no_replay = outcomes(_run(tmp_path, "plain"))
    assert [r["loss"] for r in records][:1] == [r["loss"] for r in no_replay][:1]  # same first task
    assert [r["loss"] for r in records][1:] != [r["loss"] for r in no_replay][1:]  # replay changed the steps


@pytest.mark.parametrize("objective", OBJECTIVES, ids=lambda o: type(o).__name__)
def test_every_episode_objective_replays(policy, objective):
    """One optimiser step on the current episode + two buffered ones moves the adapter; the mean
    gradient equals the gradient of the mean loss (accumulated per episode)."""
    eps = [episode(policy.tokenizer, k) for k in range(3)]
    prepared = [objective.prepare(policy, e) for e in eps]
    grads = []
    for together in (True, False):
        for p in policy.trainable_parameters():
            p.grad = None
        if together:
            sum(objective.loss(policy, e, p).loss for e, p in zip(eps, prepared)).div(3).backward()
        else:
            for e, p in zip(eps, prepared):
                (objective.loss(policy, e, p).loss / 3).backward()
        grads.append([p.grad.clone() for p in policy.trainable_parameters()])
    torch.testing.assert_close(grads[0], grads[1])
    assert any(g.abs().sum() > 0 for g in grads[0])


def test_resume_with_a_non_empty_buffer_is_exact(tmp_path):
    from test_resume import CONFIG

    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG.replace("SAVE_DIR", str(tmp_path)))
    common = ["--config", str(cfg), "--model.replay.k", "2", "--model.replay.buffer_size", "2"]
    assert fit_forked([*common, "--trainer.logger.init_args.version", "reference"]) == 0
    killed = [*common, "--trainer.logger.init_args.name", "killed"]
    assert fit_forked([*killed, "--trainer.logger.init_args.version", "run"], kill="5:episode") == -signal.SIGKILL
    folder, ref = tmp_path / "killed" / "run", tmp_path / "stream" / "reference"
    assert len(load_state(folder / "stream_state.pt")["module"]["replay"]["episodes"]) == 2
    assert fit_forked([*killed, "--ckpt_path", str(folder)]) == 0
    assert outcomes(folder) == outcomes(ref)
    assert_same_adapter(folder, ref)
    final, want = (load_state(f / "stream_state.pt")["module"] for f in (folder, ref))
    assert final["replay"]["rng"] == want["replay"]["rng"] and final["replay"]["counts"] == want["replay"]["counts"]
    buffered = [[(e["task"], e["token_ids"].tolist()) for e in s["replay"]["episodes"]] for s in (final, want)]
    assert buffered[0] == buffered[1]
    torch.testing.assert_close(final["optimizer"]["state"], want["optimizer"]["state"], rtol=0, atol=0)


@pytest.mark.parametrize("top_k", [None, 5])
def test_cache_formula_matches_the_cached_tensors(policy, top_k):
    from lit_ascent.bench.replay import cache_formula

    ep = episode(policy.tokenizer, 0)
    prepared = Distillation(chunk_size=16, teacher_top_k=top_k).prepare(policy, ep)
    hidden = policy.model.config.hidden_size
    assert tensor_bytes(prepared) == cache_formula(len(prepared[0]), hidden, 4, top_k)  # float32 tiny model
