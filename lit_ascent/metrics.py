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


def repeated_actions(actions: list[str | None]) -> dict[str, float]:
    """How much an episode repeats itself (the loop of one valid action seen at large update budgets).

    repeat_rate = share of turns whose parsed action equals an action of an earlier turn of the
    episode; back_to_back_rate = share of turns whose parsed action equals the previous turn's (the loop
    itself: a policy that alternates two actions repeats without it); longest_run = the longest run of
    consecutive turns with one and the same action. Turns without a parsed action (None) never repeat and
    break a run. An empty episode gives 0, 0, 0.
    """
    seen: set[str] = set()
    repeats, back_to_back, run, longest, prev = 0, 0, 0, 0, None
    for action in actions:
        repeats += action is not None and action in seen
        back_to_back += action is not None and action == prev
        run = run + 1 if action is not None and action == prev else int(action is not None)
        longest, prev = max(longest, run), action
        if action is not None:
            seen.add(action)
    n = len(actions) or 1
    return {"diagnostics/repeat_action_rate": repeats / n, "diagnostics/back_to_back_rate": back_to_back / n,
            "diagnostics/longest_action_run": float(longest)}


def action_drift(student_logits: Tensor, initial_logits: Tensor, turn_of: Tensor) -> dict[str, float]:
    """Drift on action tokens: mean KL(student || initial) and the actions whose greedy tokens changed.

    student_logits, initial_logits (n, V) at the n positions that predict an action token (teacher
    forcing on fixed probe episodes); turn_of (n,) the probe turn (a unique id per action) of each
    position. An action changed when, at any of its positions, the student's argmax differs from the
    initial model's. n = 0 gives zeros.
    """
    if student_logits.shape[0] == 0:
        return {"diagnostics/action_kl": 0.0, "diagnostics/action_changes": 0.0, "diagnostics/probe_actions": 0.0}
    differs = student_logits.argmax(-1) != initial_logits.argmax(-1)  # (n,)
    changed = torch.unique(turn_of[differs])
    return {"diagnostics/action_kl": float(kl(student_logits, initial_logits).mean()),
            "diagnostics/action_changes": float(len(changed)),
            "diagnostics/probe_actions": float(len(torch.unique(turn_of)))}
