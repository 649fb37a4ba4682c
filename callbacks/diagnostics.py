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

import torch

from callbacks.base import EpisodeCallback
from lit_ascent.envs.base import action_token_mask
from lit_ascent.metrics import action_drift, first_token_stats, repeated_actions
from lit_ascent.models import adapter_is_zero
from lit_ascent.trajectory import Episode

_NONE = torch.zeros(0, 1), torch.zeros(0, 1), torch.zeros(0, dtype=torch.long)  # no action positions


def action_positions(tokenizer, episode: Episode, max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, turn of each) for the positions whose logits predict an action token, within the
    first ``max_tokens`` tokens of ``episode``: (n,) long, (n,) long."""
    pos, turn_of = [], []
    for turn in episode.turns:
        start, end = turn.span
        for k, is_action in enumerate(action_token_mask(tokenizer, episode.token_ids[start:end])):
            if is_action and 0 < start + k < max_tokens:
                pos.append(start + k - 1)
                turn_of.append(turn.index)
    return torch.tensor(pos, dtype=torch.long), torch.tensor(turn_of, dtype=torch.long)


class CollapseDiagnostics(EpisodeCallback):
    """First-token entropy and drift, repeated actions, and action drift on a probe set."""

    def __init__(self, every_n_tasks: int = 1, probe_episodes: int = 4, probe_max_tokens: int = 2048):
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
        prompt = episode.ids()[: episode.prompt_len]
        last = torch.tensor([episode.prompt_len - 1])
        with torch.no_grad():
            student = policy.logits(prompt, last)[0]
        with policy.teacher():
            initial = policy.logits(prompt, last)[0]
        return first_token_stats(student, initial)

    def maybe_add_probe(self, tokenizer, episode) -> None:
        if len(self.probes) >= self.probe_episodes:
            return
        pos, turn_of = action_positions(tokenizer, episode, self.probe_max_tokens)
        if len(pos):
            end = int(pos.max()) + 1
            self.probes.append({"ids": episode.ids()[:end], "positions": pos,
                                "turns": turn_of + 10_000 * len(self.probes)})  # unique action ids
            self.measured_at = None  # the set changed: measure again

    def action_drift(self, pl_module) -> dict[str, float]:
        """Action drift of the current weights on the probe set (recomputed only after the weights changed)."""
        updates = pl_module.counters["updates"]
        if self.measured_at != updates:
            policy = pl_module.policy  # zero fast weights: the student is the initial model, no drift
            self.drift = action_drift(*_NONE) if adapter_is_zero(policy.model) else self.measure(policy)
            self.drift["diagnostics/probe_actions"] = float(sum(len(p["turns"].unique()) for p in self.probes))
            self.measured_at = updates
        return dict(self.drift)

    def measure(self, policy) -> dict[str, float]:
        student, initial, turns = [], [], []
        for probe in self.probes:
            if "initial_hidden" not in probe:  # the initial model never changes: one forward per probe
                with policy.teacher():
                    probe["initial_hidden"] = policy.hidden(probe["ids"])[probe["positions"].to(policy.device)]
            with torch.no_grad():
                student.append(policy.logits(probe["ids"], probe["positions"]).float())
                initial.append(policy.head(probe["initial_hidden"]).float())  # the head is never adapted
            turns.append(probe["turns"])
        if not turns:
            return action_drift(*_NONE)
        return action_drift(torch.cat(student), torch.cat(initial), torch.cat(turns).to(student[0].device))

    def state_dict(self) -> dict:
        return {"probes": [dict(p) for p in self.probes]}

    def load_state_dict(self, state: dict) -> None:
        self.probes = [dict(p) for p in state["probes"]]
        self.measured_at = None
