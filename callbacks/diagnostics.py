"""Collapse and learning diagnostics, logged for every method.

- First response token (the papers' collapse diagnostic): the student's entropy and
  its drift KL(student || initial model) at the first turn's first token.
- Repeated actions: the share of turns repeating an earlier action of the episode and
  the longest run of one action (the loop of one valid action seen at large budgets).
- Action drift on a fixed probe set: the first ``probe_episodes`` episodes of the
  stream that hold an action are kept (frozen copies); whenever the weights have
  changed, the mean KL(student || initial) over their action tokens and the number of
  their actions whose greedy tokens changed are measured (teacher forcing on the
  probes' own ids). The first token is a format token with near-zero entropy; the
  action tokens are where a change of behaviour shows.

Everything here is measured in ``on_episode``, for the policy that acted on the task
(before its update), and added to the task's diagnostics, so it reaches its record.
"""
from __future__ import annotations

from callbacks.base import EpisodeCallback
from lit_ascent.collapse import PROBE_MAX_TOKENS, first_token, make_probe, no_drift, probe_drift
from lit_ascent.metrics import repeated_actions
from lit_ascent.models import adapter_is_zero


class CollapseDiagnostics(EpisodeCallback):
    """First-token entropy and drift, repeated actions, and action drift on a probe set."""

    def __init__(self, every_n_tasks: int = 1, probe_episodes: int = 4, probe_max_tokens: int = PROBE_MAX_TOKENS):
        """
        Args:
            every_n_tasks: First-token statistics every k tasks (two prompt forwards each); 0 disables.
            probe_episodes: Size of the fixed probe set for action drift (the stream's first episodes
                that hold an action; two forwards each when the weights changed); 0 disables.
            probe_max_tokens: Each probe is cut to its first this many tokens (bounds the forward's cost).
        """
        if every_n_tasks < 0:
            raise ValueError(f"diagnostics.every_n_tasks must be >= 0, got {every_n_tasks}")
        if probe_episodes < 0:
            raise ValueError(f"diagnostics.probe_episodes must be >= 0, got {probe_episodes}")
        if probe_max_tokens < 2:
            raise ValueError(f"diagnostics.probe_max_tokens must be >= 2, got {probe_max_tokens}")
        self.every_n_tasks, self.probe_episodes, self.probe_max_tokens = every_n_tasks, probe_episodes, probe_max_tokens
        self.probes: list[dict] = []
        """Frozen probe copies: ids (T,), positions (n,), turn ids made unique per probe (n,), and once
        measured the initial model's hidden states at the positions (n, d)."""
        self.measured_at: int | None = None
        """The update count at the last action-drift measurement."""
        self.drift: dict[str, float] = {}

    def on_episode(self, trainer, pl_module, outcome) -> None:
        episode = outcome.episode
        stats = repeated_actions(episode.actions)
        if self.every_n_tasks and not episode.task.index % self.every_n_tasks:
            stats.update(self.first_token(pl_module.policy, episode))
        if self.probe_episodes:
            self.maybe_add_probe(pl_module.policy.tokenizer, episode)
            stats.update(self.action_drift(pl_module))
        outcome.diagnostics.update(stats)

    @staticmethod
    def first_token(policy, episode) -> dict[str, float]:
        return first_token(policy, episode, policy.teacher)

    def maybe_add_probe(self, tokenizer, episode) -> None:
        if len(self.probes) < self.probe_episodes:
            if probe := make_probe(tokenizer, episode, self.probe_max_tokens, len(self.probes)):
                self.probes.append(probe)
                self.measured_at = None  # the set changed: measure again

    def action_drift(self, pl_module) -> dict[str, float]:
        """Action drift of the current weights on the probe set (recomputed only after the weights changed)."""
        updates = pl_module.counters["updates"]
        if self.measured_at != updates:
            policy = pl_module.policy  # zero fast weights: the student is the initial model, no drift
            self.drift = no_drift() if adapter_is_zero(policy.model) else self.measure(policy)
            self.drift["diagnostics/probe_actions"] = float(sum(len(p["turns"].unique()) for p in self.probes))
            self.measured_at = updates
        return dict(self.drift)

    def measure(self, policy) -> dict[str, float]:
        return probe_drift(policy, self.probes, policy.teacher)

    def state_dict(self) -> dict:
        return {"probes": [dict(p) for p in self.probes]}

    def load_state_dict(self, state: dict) -> None:
        self.probes = [dict(p) for p in state["probes"]]
        self.measured_at = None
