"""Batched evaluation equals sequential evaluation, episode for episode, in float32."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from lit_ascent import evaluate as evaluate_module
from lit_ascent.engines import close_engines
from lit_ascent.engines.fused import FusedRows, FusedSettings
from lit_ascent.envs import ScriptedEnv
from lit_ascent.evaluate import evaluate
from lit_ascent.rollout import RolloutConfig


class EosAfter(torch.nn.Module):
    """The tiny model, except that a turn ends (EOS) right after any fed token id divisible by ``k``.

    A position-wise rule, so cached, batched and sequential runs agree; it makes
    turns stop at different times in different episodes.
    """

    def __init__(self, model, eos_id: int, k: int):
        super().__init__()
        self.model, self.eos_id, self.k = model, eos_id, k

    @property
    def device(self):
        return self.model.device

    def forward(self, input_ids, **kw):
        out = self.model(input_ids=input_ids, **kw)
        fed = input_ids[:, -out.logits.shape[1]:]  # (B, kept positions)
        out.logits[..., self.eos_id] += 100.0 * (fed % self.k == 0)
        return out


def _signature(ep):
    return (ep.token_ids, ep.roles, ep.turn_ids, [t.text for t in ep.turns], ep.actions,
            [t.valid for t in ep.turns], [t.span for t in ep.turns], ep.verified, ep.error)


def _tasks_and_contexts(env):
    tasks = env.tasks()
    # different prompt lengths: the context budget ends these episodes after different turns
    contexts = [None, "x" * 40, None, "y" * 90, "z" * 5, None, "w" * 60]
    return tasks, contexts


@pytest.fixture
def lively(policy):
    """The tiny policy with its base weights scaled up: less repetitive output, context-dependent turns."""
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_" not in name and p.dim() == 2:
                p.mul_(8.0)
    tok = policy.tokenizer
    return SimpleNamespace(model=EosAfter(policy.model, tok.eos_token_id, k=5), tokenizer=tok)


@pytest.mark.parametrize("batch_size", [3, 8])
def test_batched_equals_sequential(lively, batch_size):
    wrapped, tok = lively, lively.tokenizer
    env = ScriptedEnv(num_tasks=7, episode_steps=2, verify_every=2)
    tasks, contexts = _tasks_and_contexts(env)
    cfg = RolloutConfig(max_turns=5, max_new_tokens=9, max_context_tokens=450)
    seq = evaluate(wrapped, env, tasks, cfg, contexts)
    bat = evaluate(wrapped, env, tasks, cfg, contexts, batch_size=batch_size,
                   env_factory=lambda: ScriptedEnv(num_tasks=7, episode_steps=2, verify_every=2))
    assert [_signature(e) for e in bat] == [_signature(e) for e in seq]
    # the case is not trivial: episodes of different lengths, turns that stop at different times
    assert len({len(e.turns) for e in seq}) > 1
    turn_lengths = {t.span[1] - t.span[0] for e in seq for t in e.turns}
    assert len(turn_lengths) > 2 and max(turn_lengths) == 9
    assert any(e.token_ids[t.span[1] - 1] == tok.eos_token_id for e in seq for t in e.turns)
    assert {e.verified for e in seq} == {True, False}


def test_batched_with_deep_copied_env_and_plain_model(policy):
    env = ScriptedEnv(num_tasks=4, episode_steps=2, verify_every=2)
    cfg = RolloutConfig(max_turns=3, max_new_tokens=6)
    seq = evaluate(policy, env, env.tasks(), cfg)
    bat = evaluate(policy, env, env.tasks(), cfg, batch_size=4)
    assert [_signature(e) for e in bat] == [_signature(e) for e in seq]


@pytest.mark.parametrize("engine", ["hf", "fused"])
def test_batched_equals_sequential_with_non_zero_fast_weights(eos_prone, engine):
    """After updates the LoRA runs (hf: PEFT's unmerged layers over the padded batch; fused: folded in)."""
    from lit_ascent.bench.engines import perturb

    perturb(eos_prone.model, 0.3, seed=4)
    env, tasks, contexts, cfg = _continuous_case()
    cfg = replace(cfg, engine=engine)
    ref = evaluate(eos_prone, env, tasks, replace(cfg, engine="hf"), contexts)
    bat = evaluate(eos_prone, env, tasks, cfg, contexts, batch_size=3,
                   env_factory=lambda: ScriptedEnv(num_tasks=7, episode_steps=4, verify_every=2))
    assert [_signature(e) for e in bat] == [_signature(e) for e in ref]
    perturb(eos_prone.model, 0.0)
    assert [e.token_ids for e in evaluate(eos_prone, env, tasks, cfg, contexts)] != [e.token_ids for e in ref]


def test_bad_batch_arguments(policy, scripted):
    with pytest.raises(ValueError, match="batch_size"):
        evaluate(policy, scripted, scripted.tasks(), RolloutConfig(), batch_size=0)
    with pytest.raises(ValueError, match="contexts"):
        evaluate(policy, scripted, scripted.tasks(), RolloutConfig(), ["a"])


@pytest.mark.parametrize("batch_size", [1, 3])
def test_progress_is_logged_after_each_group(lively, batch_size, caplog):
    env = ScriptedEnv(num_tasks=7, episode_steps=2, verify_every=2)
    tasks, contexts = _tasks_and_contexts(env)
    cfg = RolloutConfig(max_turns=5, max_new_tokens=9, max_context_tokens=450)
    with caplog.at_level("INFO", logger="lit_ascent.evaluate"):
        episodes = evaluate(lively, env, tasks, cfg, contexts, batch_size=batch_size,
                            env_factory=lambda: ScriptedEnv(num_tasks=7, episode_steps=2, verify_every=2))
    lines = [r.getMessage() for r in caplog.records if r.name == "lit_ascent.evaluate"]
    done = list(range(batch_size, 7, batch_size)) + [7]
    assert [line.split()[1] for line in lines] == [f"{n}/7" for n in done]
    assert lines[-1].endswith(f"{sum(e.verified for e in episodes)} verified")


@pytest.fixture
def eos_prone(policy):
    """The tiny policy with its base weights scaled up and the end-of-turn token's (tied) embedding
    enlarged: turns of 1 to 9 tokens, some closed by EOS, some cut by the budget, in the weights
    themselves, so engines that read the weights (fused) see it too."""
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_" not in name and p.dim() == 2:
                p.mul_(8.0)
        policy.model.get_base_model().get_input_embeddings().weight[policy.tokenizer.eos_token_id] *= 5.5
    policy.model.eval()
    yield policy
    close_engines(policy.model)


def _continuous_case(lookup: int = 8):
    env = ScriptedEnv(num_tasks=7, episode_steps=4, verify_every=2)
    tasks, contexts = _tasks_and_contexts(env)
    cfg = RolloutConfig(max_turns=6, max_new_tokens=9, max_context_tokens=450, engine="fused",
                        fused=FusedSettings(prompt_lookup=lookup))
    return env, tasks, contexts, cfg


@pytest.mark.parametrize("batch_size,lookup", [(3, 0), (3, 8), (8, 8)])
def test_continuous_batch_equals_sequential(eos_prone, batch_size, lookup, monkeypatch):
    env, tasks, contexts, cfg = _continuous_case(lookup)
    ref = evaluate(eos_prone, env, tasks, replace(cfg, engine="hf"), contexts)  # the reference engine, one at a time
    seq = evaluate(eos_prone, env, tasks, cfg, contexts)
    monkeypatch.setattr(evaluate_module, "batched_rollouts", None)  # the fused engine must not fall back to it
    chains = []
    step = FusedRows.step
    monkeypatch.setattr(FusedRows, "step", lambda self, limits=None: chains.append(step(self, limits)) or chains[-1])
    bat = evaluate(eos_prone, env, tasks, cfg, contexts, batch_size=batch_size,
                   env_factory=lambda: ScriptedEnv(num_tasks=7, episode_steps=4, verify_every=2))
    assert [_signature(e) for e in bat] == [_signature(e) for e in seq] == [_signature(e) for e in ref]
    assert max(len(c) for c in chains) == min(batch_size, 7)  # rows decoded together
    assert (max(len(t) for c in chains for t in c.values()) > 1) == (lookup > 0)  # drafts kept when looked up
    # not trivial: rows end at different steps and new episodes take their place
    assert len({len(e.turns) for e in ref}) > 1 and len({len(e.token_ids) for e in ref}) > 4
    turn_lengths = {t.span[1] - t.span[0] for e in ref for t in e.turns}
    assert len(turn_lengths) > 3 and max(turn_lengths) == 9
    assert any(e.token_ids[t.span[1] - 1] == eos_prone.tokenizer.eos_token_id for e in ref for t in e.turns)
    assert {e.verified for e in ref} == {True, False}


def test_continuous_batch_reports_finished_prefixes_in_task_order(eos_prone, caplog):
    env, tasks, contexts, cfg = _continuous_case()
    prefixes = []
    with caplog.at_level("INFO", logger="lit_ascent.evaluate"):
        episodes = evaluate(eos_prone, env, tasks, cfg, contexts, batch_size=3,
                            env_factory=lambda: ScriptedEnv(num_tasks=7, episode_steps=4, verify_every=2),
                            on_group=lambda so_far: prefixes.append([e.task.task_id for e in so_far]))
    ids = [t.task_id for t in tasks]
    assert prefixes and all(p == ids[:len(p)] for p in prefixes)  # always the finished prefix, in order
    sizes = [len(p) for p in prefixes]
    assert sizes[-1] == 7 and all(b - a >= 3 for a, b in zip(sizes, sizes[1:-1]))
    lines = [r.getMessage() for r in caplog.records if r.name == "lit_ascent.evaluate"]
    assert [line.split()[1] for line in lines] == [f"{n}/7" for n in sizes]
    assert [e.task.task_id for e in episodes] == ids


def test_continuous_batch_survives_a_failed_reset(eos_prone):
    """A task whose reset raises is an episode with its error and no turns; the others are unaffected."""
    env, tasks, contexts, cfg = _continuous_case()

    class BrokenReset(ScriptedEnv):
        def reset(self, task):
            if task.task_id == tasks[2].task_id:
                raise RuntimeError("no such game")
            return super().reset(task)

    seq = evaluate(eos_prone, env, tasks, cfg, contexts)
    bat = evaluate(eos_prone, env, tasks, cfg, contexts, batch_size=3,
                   env_factory=lambda: BrokenReset(num_tasks=7, episode_steps=4, verify_every=2))
    assert bat[2].turns == [] and "no such game" in bat[2].error and not bat[2].verified
    assert [_signature(e) for k, e in enumerate(bat) if k != 2] == [_signature(e) for k, e in enumerate(seq) if k != 2]
