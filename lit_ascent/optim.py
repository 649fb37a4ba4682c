"""The optimiser: AdamW on the LoRA parameters (``OptimConfig``) and the guarded step shared by the
stream, the cycles and the warm start.

One rule for non-finite numbers: a step whose loss or gradient norm is not finite
is not taken (the weights and the optimiser's moments stay as they were), and the
caller learns that it was skipped. Without it one NaN would reach every LoRA
weight through AdamW's moments and end the run's learning silently.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class OptimConfig:
    """AdamW on the LoRA parameters only."""

    lr: float = 1e-4
    """Learning rate (> 0)."""
    weight_decay: float = 0.0
    """AdamW weight decay (>= 0)."""
    updates_per_task: int = 1
    """Optimiser steps per episode that passes the callbacks (>= 1)."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"model.optim.lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"model.optim.weight_decay must be >= 0, got {self.weight_decay}")
        if self.updates_per_task < 1:
            raise ValueError(f"model.optim.updates_per_task must be >= 1, got {self.updates_per_task}")
        if self.grad_clip < 0:
            raise ValueError(f"model.optim.grad_clip must be >= 0, got {self.grad_clip}")

    def adamw(self, params: Iterable[Tensor]) -> torch.optim.AdamW:
        """AdamW over ``params`` (the trainable LoRA weights) with this lr and weight decay."""
        return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)


@dataclass
class StepOutcome:
    """What one guarded step did."""

    stepped: bool
    """The optimiser stepped (False: a loss or the gradient norm was not finite)."""
    grad_norm: float
    """Global gradient norm before clipping (NaN when a loss was not finite: no norm was taken)."""


def guarded_step(optimizer: torch.optim.Optimizer, params: Iterable[Tensor], losses: Iterable[Tensor],
                 grad_clip: float, backward: Callable[[Tensor], None] = Tensor.backward) -> StepOutcome:
    """Zero the gradients, backpropagate each loss, clip the global norm to ``grad_clip`` and step.

    ``losses`` may be a generator: each loss is built after the previous one's backward, so
    memory holds one graph at a time (gradient accumulation). The first non-finite loss ends
    the step before its backward; a non-finite norm ends it before ``optimizer.step``. The
    gradients are left as they are either way (the next step zeroes them).

    Args:
        optimizer: The optimiser of ``params``.
        params: The trainable parameters (the LoRA weights).
        losses: Scalar losses whose gradients are summed into one step.
        grad_clip: Max global gradient norm; 0 disables clipping (the norm is still checked).
        backward: How a loss is backpropagated (e.g. ``LightningModule.manual_backward``).
    """
    if grad_clip < 0:
        raise ValueError(f"grad_clip must be >= 0, got {grad_clip}")
    params = list(params)
    optimizer.zero_grad(set_to_none=True)
    for loss in losses:
        if not torch.isfinite(loss):
            return StepOutcome(False, float("nan"))
        backward(loss)
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip or float("inf"))
    if not torch.isfinite(norm):
        return StepOutcome(False, float(norm))
    optimizer.step()
    return StepOutcome(True, float(norm))
