"""Collapse diagnostics of the papers, logged for every method."""
from __future__ import annotations

import torch

from callbacks.gate import EpisodeCallback
from lit_ascent.metrics import first_token_stats


class CollapseDiagnostics(EpisodeCallback):
    """Entropy of the first response token at the first turn, and the drift
    KL(student || initial model) there, for the policy that acted on the task."""

    def __init__(self, every_n_tasks: int = 1):
        """
        Args:
            every_n_tasks: Compute every k tasks (two prompt forwards each); 0 disables.
        """
        if every_n_tasks < 0:
            raise ValueError(f"diagnostics.every_n_tasks must be >= 0, got {every_n_tasks}")
        self.every_n_tasks = every_n_tasks

    def on_episode(self, trainer, pl_module, episode) -> None:
        if not self.every_n_tasks or episode.task.index % self.every_n_tasks:
            return
        policy = pl_module.policy
        prompt = episode.ids()[: episode.prompt_len]
        last = torch.tensor([episode.prompt_len - 1])
        with torch.no_grad():
            student = policy.logits(prompt, last)[0]
        with policy.teacher():
            initial = policy.logits(prompt, last)[0]
        stats = first_token_stats(student, initial)
        episode.diagnostics.update(stats)
        pl_module.log_dict(stats, on_step=True, on_epoch=False, batch_size=1)
