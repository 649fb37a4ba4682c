"""Stream diagnostics as pure functions over logits."""
from __future__ import annotations

import torch
from torch import Tensor


def entropy(logits: Tensor) -> Tensor:
    """Entropy (nats) of softmax(logits) over the last dim: (..., V) -> (...)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def kl(p_logits: Tensor, q_logits: Tensor) -> Tensor:
    """KL(p || q) over the last dim, in float32: (..., V) -> (...)."""
    logp = torch.log_softmax(p_logits.float(), dim=-1)
    logq = torch.log_softmax(q_logits.float(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(-1)


def first_token_stats(student_logits: Tensor, initial_logits: Tensor) -> dict[str, float]:
    """Collapse diagnostics at the first response token: the student's entropy and its drift
    KL(student || initial model). Both inputs (V,)."""
    return {
        "diagnostics/first_token_entropy": float(entropy(student_logits)),
        "diagnostics/drift_kl": float(kl(student_logits, initial_logits)),
    }
