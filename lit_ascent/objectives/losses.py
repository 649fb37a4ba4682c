"""Sampled-token baselines and the ReSAIL reductions, as pure tensor functions.

Baselines (METHOD.md section 2): imitation / RFT (``token_nll``), REINFORCE
(``policy_gradient_loss`` with a ``RunningMoments`` baseline) and REINFORCE++
(normalised advantage plus the token-level ``sampled_kl`` penalty).
ReSAIL (METHOD.md section 3): PI sensitivity (``pi_sensitivity``), step
selection (``select_top_steps``) and the trajectory-balanced reduction
(``trajectory_balanced_mean``). Float32 math; masked means divide by
``mask.sum().clamp_min(1)`` so that an all-masked batch gives 0, not NaN.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from lit_ascent.objectives.divergences import generalized_jsd

KL_ESTIMATORS = ("k1", "k2", "k3")


def masked_mean(values: Tensor, mask: Tensor | None = None) -> Tensor:
    """sum(values * mask) / max(sum(mask), 1): (N,) values, (N,) bool mask -> scalar.

    Masked-out entries are replaced by 0 before the sum (not multiplied), so a
    NaN or inf there never reaches the result or its gradient.
    """
    values = values.float()
    if mask is None:
        return values.sum() / max(values.numel(), 1)
    mask = mask.bool()
    kept = torch.where(mask, values, torch.zeros_like(values))
    return kept.sum() / mask.sum().clamp_min(1)


def segment_mean(values: Tensor, segment_index: Tensor, num_segments: int) -> Tensor:
    """Mean of ``values`` within each segment (a turn/step), (N,) -> (num_segments,).

    ``segment_index`` (N,) long gives each position's segment; negative indices
    mark positions outside every segment and are ignored. Empty segments give 0.
    Differentiable w.r.t. ``values``.
    """
    values = values.float()
    keep = segment_index >= 0
    index = torch.where(keep, segment_index, torch.zeros_like(segment_index))
    kept = torch.where(keep, values, torch.zeros_like(values))
    sums = values.new_zeros(num_segments).index_add(0, index, kept)
    counts = values.new_zeros(num_segments).index_add(0, index, keep.float())
    return sums / counts.clamp_min(1)


def sampled_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """log p(y_n) = logits[n, y_n] - logsumexp_v logits[n, v]: (N, V), (N,) -> (N,) float32."""
    logits = logits.float()
    picked = logits.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def token_nll(logits: Tensor, targets: Tensor, mask: Tensor | None = None) -> Tensor:
    """Masked mean negative log-likelihood -1/|M| sum_{n in M} log p(y_n), scalar.

    Imitation / RFT on the agent's own tokens. logits (N, V), targets (N,)
    long, mask (N,) bool or None (all positions). Masked targets may hold any
    placeholder (e.g. -100); they are not looked up.
    """
    if mask is not None:
        targets = torch.where(mask.bool(), targets, torch.zeros_like(targets))
    return masked_mean(-sampled_logprobs(logits, targets), mask)


def policy_gradient_loss(
    logprobs: Tensor, advantages: Tensor | float, mask: Tensor | None = None
) -> Tensor:
    """REINFORCE surrogate L = -1/|M| sum_{n in M} A_n log pi(y_n), scalar.

    Args:
        logprobs: (N,) log-probabilities of the sampled tokens (with grad).
        advantages: (N,) or scalar A (reward minus baseline); treated as a
            constant (detached), so grad_logp L = -A / |M|: descent raises the
            sampled token's log-prob when A > 0 and lowers it when A < 0.
        mask: (N,) bool or None.
    """
    advantages = torch.as_tensor(advantages, dtype=torch.float32, device=logprobs.device)
    return masked_mean(-advantages.detach() * logprobs.float(), mask)


def sampled_kl(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimators of KL(pi || pi_ref) on tokens sampled from pi, (N,) x2 -> (N,).

    With d = log pi(y) - log pi_ref(y) and y ~ pi:
        k1 = d                      unbiased, can be negative
        k2 = d^2 / 2                biased, >= 0, low variance
        k3 = exp(-d) - 1 + d        unbiased, >= 0 (REINFORCE++ default)
    All are 0 where pi and pi_ref agree. Not clamped: exp(-d) overflows to inf
    only for |d| > ~88, which a sane KL penalty never reaches.
    """
    d = logprobs.float() - ref_logprobs.float()
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d.square()
    if estimator == "k3":
        return torch.expm1(-d) + d  # expm1 keeps precision for small d
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")


class RunningMoments:
    """Running mean and (population) variance of a scalar stream, Welford's algorithm.

    Exact over everything seen so far, with no decay: at batch size 1 over a
    single pass of the stream each task's reward counts equally. Used as the
    REINFORCE baseline and for REINFORCE++ advantage normalisation; its
    ``state_dict`` is plain python floats so it rides along in a checkpoint.
    """

    def __init__(self, eps: float = 1e-6) -> None:
        self.eps = eps
        self.count = 0
        self.mean = 0.0
        self._m2 = 0.0  # sum of squared deviations from the running mean

    def update(self, x: float) -> None:
        x = float(x)
        self.count += 1
        delta = x - self.mean
        self.mean += delta / self.count
        self._m2 += delta * (x - self.mean)

    @property
    def var(self) -> float:
        return self._m2 / self.count if self.count > 0 else 0.0

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def normalize(self, x):
        """(x - mean) / std; only centred while std <= eps (fewer than two distinct values)."""
        std = self.std
        return (x - self.mean) / std if std > self.eps else x - self.mean

    def state_dict(self) -> dict[str, float]:
        return {"count": float(self.count), "mean": self.mean, "m2": self._m2}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.count = int(state["count"])
        self.mean = float(state["mean"])
        self._m2 = float(state["m2"])


@torch.no_grad()
def pi_sensitivity(
    with_pi_logits: Tensor, without_pi_logits: Tensor, step_index: Tensor, num_steps: int
) -> Tensor:
    """SGS score s_k = mean_{n in step k} JS(q_n^{+PI}, q_n^{-PI}), (num_steps,) float32.

    Args:
        with_pi_logits: (N, V) teacher logits with the privileged information.
        without_pi_logits: (N, V) teacher logits without it, same positions.
        step_index: (N,) long, each position's interaction step in [0, num_steps);
            negative = position belongs to no step.
        num_steps: S, the number of steps in the batch U.
    Steps without tokens score 0. Runs under no_grad: the scores only select
    steps and are held fixed during backpropagation.
    """
    js = generalized_jsd(with_pi_logits, without_pi_logits, 0.5)  # (N,), symmetric
    return segment_mean(js, step_index, num_steps)


def top_k_count(rho: float, num_steps: int) -> int:
    """K_rho = ceil(rho * |U|), rho in (0, 1]; 0 when there are no steps."""
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho must lie in (0, 1], got {rho!r}")
    if num_steps == 0:
        return 0
    # The 1e-9 slack keeps float noise (0.07 * 100 = 7.000000000000001) from
    # adding a step; rho > 0 always keeps at least one.
    return min(num_steps, max(1, math.ceil(rho * num_steps - 1e-9)))


def select_top_steps(scores: Tensor, rho: float) -> Tensor:
    """Boolean mask (S,) of the K = ceil(rho * S) highest-scoring steps.

    Ties go to the lowest index (stable sort); NaN scores rank last.
    rho must lie in (0, 1]; rho = 1 keeps every step; S = 0 gives an empty mask.
    """
    k = top_k_count(rho, scores.shape[0])
    scores = torch.nan_to_num(scores.detach().float(), nan=-math.inf)
    order = torch.sort(scores, descending=True, stable=True).indices
    selected = torch.zeros(scores.shape[0], dtype=torch.bool, device=scores.device)
    selected[order[:k]] = True
    return selected


def trajectory_balanced_mean(
    step_losses: Tensor, step_trajectory: Tensor, selected: Tensor, num_trajectories: int
) -> Tensor:
    """TLB reduction: L = 1/|B| sum_{b in B} mean_{k in b, selected} l_k, scalar.

    Args:
        step_losses: (S,) per-step loss (e.g. segment_mean of token divergences).
        step_trajectory: (S,) long, each step's trajectory in [0, num_trajectories).
        selected: (S,) bool, steps kept by SGS (all True for the PR term).
        num_trajectories: |B|.
    Every trajectory with a selected step carries total weight 1/|B| (split
    evenly over its selected steps); one without any contributes 0.
    Gradient flows into ``step_losses`` only through selected steps.
    """
    selected = selected.bool()
    step_losses = step_losses.float()
    kept = torch.where(selected, step_losses, torch.zeros_like(step_losses))
    sums = step_losses.new_zeros(num_trajectories).index_add(0, step_trajectory, kept)
    counts = step_losses.new_zeros(num_trajectories).index_add(0, step_trajectory, selected.float())
    return (sums / counts.clamp_min(1)).sum() / max(num_trajectories, 1)
