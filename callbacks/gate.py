"""Callbacks that decide, per episode, what the update may use."""
from __future__ import annotations

from callbacks.base import EpisodeCallback


class VerificationGate(EpisodeCallback):
    """Only verified episodes update the adapter (rejection sampling by the verifier).

    Without it, every episode updates: ungated imitation, REINFORCE.
    """

    def on_episode(self, trainer, pl_module, outcome) -> None:
        episode = outcome.episode
        episode.trainable = episode.trainable and episode.verified


class InvalidTurnFilter(EpisodeCallback):
    """Drop turns the environment did not execute from the privileged information.

    Only the teacher's input changes; the student still trains at every position
    of its own trajectory, invalid turns included.
    """

    def on_episode(self, trainer, pl_module, outcome) -> None:
        outcome.episode.pi_valid_only = True
