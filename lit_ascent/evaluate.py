"""Evaluate the current policy on a fixed task set, frozen (no updates)."""
from __future__ import annotations

import torch

from lit_ascent.envs.base import TextEnv
from lit_ascent.rollout import RolloutConfig, rollout
from lit_ascent.trajectory import Episode, Task


def evaluate(policy, env: TextEnv, tasks: list[Task], cfg: RolloutConfig,
             contexts: list[str | None] | None = None) -> list[Episode]:
    """Greedy episodes of ``tasks`` with the weights as they are; the adapter is not touched.

    ``contexts[i]`` is extra system text for task i (privileged information for probes).
    """
    contexts = contexts or [None] * len(tasks)
    was_training = policy.model.training
    policy.model.eval()
    try:
        with torch.no_grad():
            return [rollout(policy.model, policy.tokenizer, env, t, cfg, c) for t, c in zip(tasks, contexts)]
    finally:
        policy.model.train(was_training)


def outcome_rates(episodes: list[Episode]) -> dict[str, float]:
    """success_rate, mean turns and invalid-action rate of a set of episodes."""
    n = max(len(episodes), 1)
    turns = sum(len(e.turns) for e in episodes)
    return {
        "success_rate": sum(e.verified for e in episodes) / n,
        "turns": turns / n,
        "invalid_rate": sum(e.num_invalid for e in episodes) / max(turns, 1),
    }
