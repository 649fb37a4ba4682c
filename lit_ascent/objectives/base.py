"""The objective interface: what one update learns from one episode.

An objective splits its work in two: ``prepare`` computes what stays fixed
during the updates of a task (teacher targets: the teacher is frozen, so its
targets never drift), ``loss`` computes the student side with gradients.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from lit_ascent.trajectory import Episode, target_positions


@dataclass
class LossOutput:
    """A scalar loss with gradient and the metrics to log for it."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


class Objective:
    """Base class: subclasses implement ``loss`` (and ``prepare`` if they use a teacher)."""

    updates = True
    """False for the evaluation-only row (no optimiser step ever)."""
    replayable = True
    """Whether replaying an earlier episode's ``prepare`` output is sound (``model.replay``)."""

    def prepare(self, policy, episode: Episode) -> Any:
        """Work that stays fixed across this task's updates (no gradient)."""
        return None

    def loss(self, policy, episode: Episode, prepared: Any) -> LossOutput | None:
        """The loss for one update; None when the episode has nothing to learn from.

        Also called under ``torch.no_grad()`` to measure what the updates absorbed: an objective
        that keeps running statistics updates them only when gradients are enabled."""
        raise NotImplementedError(f"{type(self).__name__} must implement loss()")

    def state_dict(self) -> dict[str, Any]:
        """Running statistics (e.g. baselines) that a resumed stream must restore."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class NoUpdate(Objective):
    """The base-model row: the stream is only evaluated, the adapter never moves."""

    updates = False

    def loss(self, policy, episode, prepared):
        return None


def student_targets(episode: Episode) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(positions, target ids, end): logits at ``positions`` predict the assistant tokens.

    Only ``ids[:end]`` is needed for a forward pass (tokens after the last
    assistant token are never targets).
    """
    pos = target_positions(episode.roles)
    ids = episode.ids()
    end = int(pos.max()) + 1 if len(pos) else 0
    return pos, ids[pos + 1], end
