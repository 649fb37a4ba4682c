"""Full-vocabulary divergences between the student p and the teacher q.

ASCENT distils the hindsight teacher q = p_theta0(. | z, prefix) into the
student p = p^phi(. | prefix) at every generated position (METHOD.md section 2).
All functions here are pure: logits in (any float dtype), float32 log-space
math, one value per position out, (N,). Reductions (masks, per-step or
per-trajectory means) belong to the caller.

Naming: ``forward_kl`` is KL(q || p) (mode covering, gradient p - q w.r.t. the
student logits), ``reverse_kl`` is KL(p || q) (mode seeking).
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

DIVERGENCES = ("forward_kl", "reverse_kl", "jsd")

Head = Callable[[Tensor], Tensor]  # (n, d) hidden -> (n, V) logits


def _log_probs(logits: Tensor) -> Tensor:
    # (N, V) float32 log-probabilities, whatever the input dtype (bf16 included).
    return F.log_softmax(logits.float(), dim=-1)


def _kl_log(log_a: Tensor, log_b: Tensor) -> Tensor:
    """KL(a || b) = sum_v a_v (log a_v - log b_v) per row, (N, V) -> (N,).

    Entries with a_v = 0 (e.g. -inf logits) contribute 0; the difference is
    zeroed *before* the product so that no 0 * inf appears in the backward.
    """
    a = log_a.exp()
    diff = torch.where(a > 0, log_a - log_b, torch.zeros_like(log_a))
    return (a * diff).sum(dim=-1)


def forward_kl(student_logits: Tensor, teacher_logits: Tensor) -> Tensor:
    """Forward KL(q || p) = sum_v q_v (log q_v - log p_v), one value per position.

    Args:
        student_logits: (N, V), p = softmax(student_logits).
        teacher_logits: (N, V), q = softmax(teacher_logits); pass it detached.
    Returns:
        (N,) float32. d/d(student_logits) = p - q per position.
    """
    return _kl_log(_log_probs(teacher_logits), _log_probs(student_logits))


def reverse_kl(student_logits: Tensor, teacher_logits: Tensor) -> Tensor:
    """Reverse KL(p || q) = sum_v p_v (log p_v - log q_v), (N, V) x2 -> (N,) float32."""
    return _kl_log(_log_probs(student_logits), _log_probs(teacher_logits))


def _check_beta(beta: float) -> None:
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta!r}")


def generalized_jsd(student_logits: Tensor, teacher_logits: Tensor, beta: float) -> Tensor:
    """Generalised Jensen-Shannon divergence (the GKD convention), (N,) float32.

    For 0 < beta < 1, with q the teacher and p the student:

        m        = beta * q + (1 - beta) * p            (log m via logaddexp)
        JSD_beta = beta * KL(q || m) + (1 - beta) * KL(p || m)

    The endpoints are special-cased: beta = 0 returns forward KL(q || p) and
    beta = 1 returns reverse KL(p || q) exactly. This mixture is the one whose
    limits agree with those endpoints: JSD_beta / beta -> KL(q || p) as
    beta -> 0 and JSD_beta / (1 - beta) -> KL(p || q) as beta -> 1. (The other
    mixture, m = beta * p + (1 - beta) * q, tends to the *reverse* KL at
    beta -> 0, contradicting the beta = 0 endpoint.) beta = 0.5 is the standard,
    symmetric JS divergence. Note the scale: 0 <= JSD_beta <= H(beta), the
    binary entropy of beta (log 2 at 0.5), so inside (0, 1) values are roughly
    beta (or 1 - beta) times the corresponding KL, and it is not continuous at
    the endpoints.

    Args:
        student_logits: (N, V) student logits.
        teacher_logits: (N, V) teacher logits; pass it detached.
        beta: interpolation weight in [0, 1].
    """
    _check_beta(beta)
    if beta == 0.0:
        return forward_kl(student_logits, teacher_logits)
    if beta == 1.0:
        return reverse_kl(student_logits, teacher_logits)
    log_p, log_q = _log_probs(student_logits), _log_probs(teacher_logits)
    log_m = torch.logaddexp(log_q + math.log(beta), log_p + math.log1p(-beta))
    return beta * _kl_log(log_q, log_m) + (1.0 - beta) * _kl_log(log_p, log_m)


def token_divergence(
    student_logits: Tensor, teacher_logits: Tensor, kind: str, beta: float = 0.5
) -> Tensor:
    """Per-position divergence named by ``kind`` (one of DIVERGENCES), (N, V) x2 -> (N,).

    ``beta`` is used by ``"jsd"`` only.
    """
    if kind == "forward_kl":
        return forward_kl(student_logits, teacher_logits)
    if kind == "reverse_kl":
        return reverse_kl(student_logits, teacher_logits)
    if kind == "jsd":
        return generalized_jsd(student_logits, teacher_logits, beta)
    raise ValueError(f"unknown divergence kind {kind!r}; expected one of {DIVERGENCES}")


def _check_chunking(kind: str, beta: float, chunk_size: int) -> None:
    # Fail before any chunk is computed, not halfway through the loop.
    if kind not in DIVERGENCES:
        raise ValueError(f"unknown divergence kind {kind!r}; expected one of {DIVERGENCES}")
    _check_beta(beta)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size!r}")


def checkpointed_chunks(chunk_fn: Callable[..., Tensor], *rows: Tensor | None, chunk_size: int) -> Tensor:
    """``chunk_fn(*rows)`` computed ``chunk_size`` rows at a time, each chunk under a non-reentrant
    ``torch.utils.checkpoint``: autograd keeps only the chunk's inputs and rebuilds what
    ``chunk_fn`` made from them (e.g. (chunk, V) logits) during the backward.

    Args:
        chunk_fn: (n, ...) row slices of ``rows`` -> (n, ...) output.
        rows: tensors with the same first dimension N, sliced together; None passes through.
        chunk_size: rows per chunk.
    Returns:
        The chunk outputs concatenated along dim 0, (N, ...).
    """
    n = rows[0].shape[0]
    if n == 0:
        # Empty but still attached to the head and the hidden states, so a
        # caller's backward through an empty batch works and gives zero grads.
        return chunk_fn(*rows)
    outs = [
        checkpoint(chunk_fn, *(None if t is None else t[start : start + chunk_size] for t in rows),
                   use_reentrant=False)
        for start in range(0, n, chunk_size)
    ]
    return torch.cat(outs)


def chunked_token_divergence(
    student_hidden: Tensor,
    teacher_hidden: Tensor,
    head: Head,
    kind: str,
    beta: float = 0.5,
    chunk_size: int = 256,
) -> Tensor:
    """token_divergence(head(student_hidden), head(teacher_hidden)) without (N, V) logits.

    Positions are processed in chunks. Each chunk's student *and* teacher
    logits are built inside ``torch.utils.checkpoint`` (non-reentrant), so
    autograd keeps only the (chunk, d) hidden slices and recomputes the
    (chunk, V) logits during backward: peak logits memory is one chunk per
    model, never (N, V). The teacher side always runs under ``no_grad``.

    Args:
        student_hidden: (N, d) final hidden states of the student (requires grad).
        teacher_hidden: (N, d) teacher hidden states at the aligned positions.
        head: LM head, (n, d) -> (n, V) logits (e.g. ``nn.Linear``); gets gradients.
        kind, beta: as in ``token_divergence``.
        chunk_size: positions per chunk.
    Returns:
        (N,) float32 per-position divergence, differentiable w.r.t.
        ``student_hidden`` and the parameters of ``head``.
    """
    _check_chunking(kind, beta, chunk_size)
    if student_hidden.shape[0] != teacher_hidden.shape[0]:
        raise ValueError(
            f"student_hidden has {student_hidden.shape[0]} positions, "
            f"teacher_hidden {teacher_hidden.shape[0]}"
        )

    def chunk_div(h_student: Tensor, h_teacher: Tensor) -> Tensor:
        with torch.no_grad():
            t_logits = head(h_teacher)  # (n, V)
        return token_divergence(head(h_student), t_logits, kind, beta)

    return checkpointed_chunks(chunk_div, student_hidden, teacher_hidden.detach(), chunk_size=chunk_size)  # (N,)


# --- Top-k teacher with a tail bucket (an approximation; off by default) -----------------

_TAIL_FLOOR = -1.0e4  # stands in for log 0 so that an empty tail keeps finite gradients


def topk_teacher_targets(teacher_logits: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The teacher's k most likely tokens and the mass of all the others.

    Args:
        teacher_logits: (N, V) teacher logits (no gradient is kept).
        k: tokens kept per position, 1 <= k <= V.
    Returns:
        (index (N, k) long, log_q (N, k) float32, log_tail (N,) float32): the top-k
        log-probabilities of q and log(1 - sum of them) (-1e4 when the tail is empty).
    """
    if not 1 <= k <= teacher_logits.shape[-1]:
        raise ValueError(f"k must lie in [1, {teacher_logits.shape[-1]}], got {k!r}")
    with torch.no_grad():
        log_q = _log_probs(teacher_logits)
        top, index = log_q.topk(k, dim=-1)
        return index, top, _tail_log_mass(log_q, index)


def _tail_log_mass(log_probs: Tensor, index: Tensor) -> Tensor:
    # log sum_{v not in index} exp(log_probs_v), (N,); the kept entries are floored, not -inf,
    # so the logsumexp and its gradient stay finite when nothing is left in the tail.
    rest = log_probs.scatter(-1, index, _TAIL_FLOOR)
    return torch.logsumexp(rest, dim=-1).clamp_min(_TAIL_FLOOR)


def topk_tail_divergence(
    student_logits: Tensor, index: Tensor, teacher_log_q: Tensor, teacher_log_tail: Tensor,
    kind: str, beta: float = 0.5,
) -> Tensor:
    """``token_divergence`` between the teacher and the student, both coarsened to k + 1 buckets.

    Buckets: the teacher's top-k tokens, then one tail bucket holding the rest
    of the vocabulary. With b the bucketing map, this computes D(b(q), b(p)):
    exact for k = V (empty tail); for k < V a lower bound of the full
    divergence (coarse-graining never increases an f-divergence), close to it
    when the teacher is peaked. Only (N, k) teacher numbers need to be kept.

    Args:
        student_logits: (N, V) student logits.
        index, teacher_log_q, teacher_log_tail: from ``topk_teacher_targets``, (N, k), (N, k), (N,).
        kind, beta: as in ``token_divergence``.
    Returns:
        (N,) float32, differentiable w.r.t. ``student_logits``.
    """
    log_p = _log_probs(student_logits)
    student = torch.cat([log_p.gather(-1, index), _tail_log_mass(log_p, index)[:, None]], dim=-1)
    teacher = torch.cat([teacher_log_q, teacher_log_tail[:, None]], dim=-1).detach()
    return token_divergence(student, teacher, kind, beta)  # log_softmax of log-probs: identity


def chunked_topk_divergence(
    student_hidden: Tensor, targets: tuple[Tensor, Tensor, Tensor], head: Head, kind: str,
    beta: float = 0.5, chunk_size: int = 256,
) -> Tensor:
    """``topk_tail_divergence(head(student_hidden), *targets)`` with (chunk, V) student logits at most.

    As in ``chunked_token_divergence``, each chunk's logits are rebuilt in the
    backward (non-reentrant checkpoint), so memory holds one chunk of logits.
    """
    _check_chunking(kind, beta, chunk_size)
    index, log_q, log_tail = targets
    if student_hidden.shape[0] != index.shape[0]:
        raise ValueError(f"student_hidden has {student_hidden.shape[0]} positions, targets {index.shape[0]}")

    def chunk_div(h: Tensor, idx: Tensor, lq: Tensor, lt: Tensor) -> Tensor:
        return topk_tail_divergence(head(h), idx, lq, lt, kind, beta)

    return checkpointed_chunks(chunk_div, student_hidden, index, log_q, log_tail, chunk_size=chunk_size)  # (N,)
