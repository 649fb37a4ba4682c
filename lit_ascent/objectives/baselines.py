"""Online baselines of the same protocol (METHOD.md section 2, "Baselines").

Every class here learns from the agent's own sampled tokens, except TT-OPSD,
which distils like ASCENT but shows the teacher only the current turn:

- ``Imitation``: NLL of the episode's assistant tokens. With the
  VerificationGate callback it is online RFT, without it online ungated
  imitation; ``kl_weight > 0`` adds a full-vocabulary KL(student || initial)
  penalty (RFT + KL).
- ``Reinforce``: policy gradient with reward v_i minus a running-mean baseline.
- ``ReinforcePP``: REINFORCE++: running-normalised advantage plus a token-level
  k3 KL penalty toward the initial model on the sampled tokens.
- ``TTOPSD``: self-distillation whose teacher sees, for turn t, only turn t.

The initial model is ``policy.teacher()`` (adapter off, no grad) on the same ids,
without privileged information. Sampled-token log-probs are computed in chunks
under activation checkpointing, so no (N, V) logits are kept for backward.
"""
from __future__ import annotations

import torch
from torch import Tensor

from lit_ascent.objectives.base import LossOutput, Objective, student_targets
from lit_ascent.objectives.distillation import Distillation
from lit_ascent.objectives.divergences import checkpointed_chunks, reverse_kl
from lit_ascent.objectives.losses import (KL_ESTIMATORS, RunningMoments, masked_mean, policy_gradient_loss,
                                          sampled_kl, sampled_logprobs)
from lit_ascent.privileged import render_privileged, teacher_sequence


def chunked_sampled_logprobs(hidden: Tensor, targets: Tensor, head, chunk_size: int,
                             initial_hidden: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """log p(y_n) and, with ``initial_hidden``, KL(p_n || p0_n) over the full vocabulary.

    hidden (N, d) student, targets (N,), initial_hidden (N, d) initial model (detached)
    -> ((N,) float32, (N,) float32 or None). Each chunk's (chunk, V) logits are built
    once for both terms and rebuilt in the backward pass (checkpoint).
    """
    def chunk_terms(h: Tensor, y: Tensor, h0: Tensor | None) -> Tensor:
        logits = head(h)  # (n, V)
        logp = sampled_logprobs(logits, y)
        if h0 is None:
            return logp[:, None]
        with torch.no_grad():
            initial_logits = head(h0)
        return torch.stack([logp, reverse_kl(logits, initial_logits)], dim=-1)

    if initial_hidden is not None:
        initial_hidden = initial_hidden.detach()
    out = checkpointed_chunks(chunk_terms, hidden, targets, initial_hidden, chunk_size=chunk_size)  # (N, 1 or 2)
    return out[:, 0], (out[:, 1] if initial_hidden is not None else None)


def _check_chunk_size(chunk_size: int) -> None:
    if chunk_size <= 0:
        raise ValueError(f"objective.chunk_size must be > 0, got {chunk_size}")


def _check_weight(name: str, value: float) -> None:
    if not value >= 0:  # also rejects NaN
        raise ValueError(f"objective.{name} must be >= 0, got {value}")


class _SampledTokens(Objective):
    """Shared student side: hidden states at the assistant-token targets."""

    def __init__(self, chunk_size: int):
        _check_chunk_size(chunk_size)
        self.chunk_size = chunk_size

    def student_hidden(self, policy, episode, pos: Tensor, end: int) -> Tensor:
        return policy.hidden(episode.ids()[:end])[pos.to(policy.device)]  # (N, d)

    def initial_hidden(self, policy, episode, pos: Tensor, end: int) -> Tensor:
        """Hidden states of the initial model (no PI, same ids) at the targets, no grad."""
        with policy.teacher():
            return self.student_hidden(policy, episode, pos, end)

    def logprobs(self, policy, hidden: Tensor, targets: Tensor,
                 initial_hidden: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Sampled-token log-probs (N,) (and per-token KL to the initial model when given its hidden states)."""
        return chunked_sampled_logprobs(hidden, targets.to(hidden.device), policy.head, self.chunk_size,
                                        initial_hidden)


class Imitation(_SampledTokens):
    """Token-mean NLL of the agent's own assistant tokens (+ optional KL to the initial model).

    L = -1/N sum_n log p^phi(y_n | prefix) + kl_weight * 1/N sum_n KL(p^phi_n || p_theta0_n).
    Gated: online RFT; ungated: online imitation; kl_weight > 0: RFT + KL.
    """

    def __init__(self, kl_weight: float = 0.0, chunk_size: int = 256):
        """
        Args:
            kl_weight: Weight of the full-vocabulary KL(student || initial model) penalty (>= 0; 0 = plain NLL).
            chunk_size: Positions per logits chunk (bounds the (chunk, V) logits).
        """
        super().__init__(chunk_size)
        _check_weight("kl_weight", kl_weight)
        self.kl_weight = kl_weight

    def prepare(self, policy, episode):
        pos, targets, end = student_targets(episode)
        if not len(pos):
            return None
        initial = self.initial_hidden(policy, episode, pos, end) if self.kl_weight > 0 else None
        return pos, targets, end, initial

    def loss(self, policy, episode, prepared):
        if prepared is None:
            return None
        pos, targets, end, initial = prepared
        hidden = self.student_hidden(policy, episode, pos, end)
        if initial is None:
            nll = -self.logprobs(policy, hidden, targets)[0].mean()
            return LossOutput(nll, {"loss/nll": float(nll.detach()), "loss/total": float(nll.detach())})
        logp, kl_per_token = self.logprobs(policy, hidden, targets, initial)
        nll, kl = -logp.mean(), kl_per_token.mean()
        loss = nll + self.kl_weight * kl
        return LossOutput(loss, {"loss/nll": float(nll.detach()), "loss/kl": float(kl.detach()),
                                 "loss/total": float(loss.detach())})


class Reinforce(_SampledTokens):
    """REINFORCE on the sampled tokens: A = v_i - b, L = -A * mean_n log p^phi(y_n).

    b is the running mean of all earlier rewards (0 before the first task); it
    is updated after A is computed, so an episode never baselines itself.
    Meant to run without the verification gate (failed episodes push down).
    No replay: a replayed episode is off-policy for the current weights and its
    advantage was fixed against an older baseline (importance weights would be needed).
    """

    replayable = False

    def __init__(self, chunk_size: int = 256):
        """
        Args:
            chunk_size: Positions per logits chunk (bounds the (chunk, V) logits).
        """
        super().__init__(chunk_size)
        self.rewards = RunningMoments()

    def advantage(self, reward: float) -> float:
        return reward - self.rewards.mean

    def prepare(self, policy, episode):
        """Fix A for this task's updates, then fold v_i into the running statistics."""
        reward = float(episode.verified)
        adv = self.advantage(reward)
        self.rewards.update(reward)
        pos, targets, end = student_targets(episode)
        if not len(pos):
            return None
        return pos, targets, end, adv, self.reference(policy, episode, pos, end, targets)

    def reference(self, policy, episode, pos, end, targets) -> Tensor | None:
        return None

    def loss(self, policy, episode, prepared):
        if prepared is None:
            return None
        pos, targets, end, adv, ref_logp = prepared
        logp, _ = self.logprobs(policy, self.student_hidden(policy, episode, pos, end), targets)
        pg = policy_gradient_loss(logp, adv)
        metrics = {"loss/pg": float(pg.detach()), "loss/advantage": adv, "loss/reward_mean": self.rewards.mean}
        loss = pg + self.penalty(logp, ref_logp, metrics)
        metrics["loss/total"] = float(loss.detach())
        return LossOutput(loss, metrics)

    def penalty(self, logp: Tensor, ref_logp: Tensor | None, metrics: dict) -> Tensor | float:
        """Extra loss term on the sampled tokens' log-probs (none for plain REINFORCE)."""
        return 0.0

    def state_dict(self):
        return {"rewards": self.rewards.state_dict()}

    def load_state_dict(self, state):
        self.rewards.load_state_dict(state["rewards"])


class ReinforcePP(Reinforce):
    """REINFORCE++ at batch size 1: A = (v_i - mean) / std over earlier rewards,
    L = -A * mean_n log p^phi(y_n) + kl_weight * mean_n k3(log p^phi(y_n) - log p_theta0(y_n))."""

    def __init__(self, kl_weight: float = 0.01, kl_estimator: str = "k3", chunk_size: int = 256):
        """
        Args:
            kl_weight: Weight of the token-level KL penalty toward the initial model (>= 0).
            kl_estimator: Per-token KL estimator on the sampled tokens: k1 | k2 | k3 (REINFORCE++: k3).
            chunk_size: Positions per logits chunk (bounds the (chunk, V) logits).
        """
        super().__init__(chunk_size)
        _check_weight("kl_weight", kl_weight)
        if kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"objective.kl_estimator must be one of {KL_ESTIMATORS}, got {kl_estimator!r}")
        self.kl_weight, self.kl_estimator = kl_weight, kl_estimator

    def advantage(self, reward: float) -> float:
        return float(self.rewards.normalize(reward))

    def reference(self, policy, episode, pos, end, targets):
        """log p_theta0(y_n) of the initial model (no PI), fixed for this task."""
        if self.kl_weight == 0:
            return None
        return self.logprobs(policy, self.initial_hidden(policy, episode, pos, end), targets)[0]

    def penalty(self, logp, ref_logp, metrics):
        if ref_logp is None:
            return 0.0
        kl = masked_mean(sampled_kl(logp, ref_logp, self.kl_estimator))
        metrics["loss/kl"] = float(kl.detach())
        return self.kl_weight * kl


class TTOPSD(Distillation):
    """Test-time on-policy self-distillation: the teacher's PI is only the current turn.

    For the assistant tokens of turn t the teacher sees ``system + PI(turn t)``,
    the first user message, then the identical episode ids up to the end of
    turn t. One teacher forward per turn; the student side is ASCENT's.
    """

    def turn_teacher_ids(self, tokenizer, episode, turn) -> tuple[list[int], int]:
        """(teacher ids up to the end of ``turn``, offset) with only ``turn`` as PI."""
        pi_text = render_privileged([turn], self.pi_content, episode.pi_valid_only)
        ids, offset = teacher_sequence(tokenizer, episode, pi_text)
        return ids[: turn.span[1] + offset], offset

    def prepare(self, policy, episode):
        pos, _, end = student_targets(episode)
        if not len(pos):
            return None
        target_turn = torch.tensor(episode.turn_ids)[pos + 1]  # (N,) turn of each predicted token
        t_hidden = None
        for turn in episode.turns:
            rows = torch.nonzero(target_turn == turn.index).flatten()
            if not len(rows):
                continue
            t_ids, offset = self.turn_teacher_ids(policy.tokenizer, episode, turn)
            with policy.teacher():
                h = policy.hidden(torch.tensor(t_ids))[(pos[rows] + offset).to(policy.device)]
            if t_hidden is None:
                t_hidden = h.new_zeros(len(pos), h.shape[-1])
            t_hidden[rows.to(h.device)] = h
        return pos, end, t_hidden
