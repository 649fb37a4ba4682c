"""ASCENT: distil the student toward the frozen initial model shown hindsight."""
from __future__ import annotations

import torch

from lit_ascent.objectives.base import LossOutput, Objective, student_targets
from lit_ascent.objectives.divergences import (DIVERGENCES, chunked_token_divergence, chunked_topk_divergence,
                                               topk_teacher_targets)
from lit_ascent.privileged import PI_CONTENTS, render_privileged, teacher_sequence


class Distillation(Objective):
    """Self-distillation of verified experience (ASCENT).

    For every position of the student's own assistant tokens, the teacher
    (adapter disabled, privileged prompt) gives q and the student gives p^phi;
    the loss is the token-mean divergence over the full vocabulary.
    """

    def __init__(self, divergence: str = "forward_kl", beta: float = 0.5,
                 pi_content: str = "reasoning_actions", chunk_size: int = 256, teacher_top_k: int | None = None,
                 valid_steps_only: bool = False):
        """
        Args:
            divergence: forward_kl (KL(q||p), default) | reverse_kl | jsd.
            beta: JSD interpolation weight in [0, 1] (0.5 = Jensen-Shannon); used by jsd only.
            pi_content: privileged information: actions | reasoning_actions | full.
            chunk_size: positions per chunk of the divergence (bounds the (chunk, V) logits).
            teacher_top_k: keep only the teacher's top-k tokens plus a tail bucket (an approximation,
                a lower bound of the divergence; None = the exact full-vocabulary loss).
            valid_steps_only: distil only the tokens of turns whose action was valid (not in the papers, which
                distil every turn; ``InvalidTurnFilter`` changes the teacher's PI only). An episode with no
                valid turn has no target. See docs/results/resail_cycles for why.
        """
        if divergence not in DIVERGENCES:
            raise ValueError(f"objective.divergence must be one of {DIVERGENCES}, got {divergence!r}")
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"objective.beta must be in [0, 1], got {beta}")
        if pi_content not in PI_CONTENTS:
            raise ValueError(f"objective.pi_content must be one of {PI_CONTENTS}, got {pi_content!r}")
        if chunk_size <= 0:
            raise ValueError(f"objective.chunk_size must be > 0, got {chunk_size}")
        if teacher_top_k is not None and teacher_top_k < 1:
            raise ValueError(f"objective.teacher_top_k must be >= 1 or None, got {teacher_top_k}")
        self.divergence, self.beta, self.pi_content, self.chunk_size = divergence, beta, pi_content, chunk_size
        self.teacher_top_k, self.valid_steps_only = teacher_top_k, valid_steps_only

    def privileged_text(self, episode) -> str:
        return render_privileged(episode.turns, self.pi_content, episode.pi_valid_only)

    def targets(self, episode) -> tuple[torch.Tensor, int]:
        """(positions, end) of the distilled tokens: ``student_targets``, less invalid turns' tokens with
        ``valid_steps_only``."""
        pos, _, end = student_targets(episode)
        if self.valid_steps_only and len(pos):
            invalid = episode.invalid_turns
            pos = pos[torch.tensor([episode.turn_ids[i + 1] not in invalid for i in pos.tolist()], dtype=torch.bool)]
        return pos, end

    def prepare(self, policy, episode):
        """Teacher hidden states at the aligned positions (fixed for all updates of this task)."""
        pos, end = self.targets(episode)
        if not len(pos):
            return None
        t_ids, offset = teacher_sequence(policy.tokenizer, episode, self.privileged_text(episode))
        with policy.teacher():
            t_hidden = policy.hidden(torch.tensor(t_ids[: end + offset]))[pos.to(policy.device) + offset]
            if self.teacher_top_k is not None:  # (N, k) targets instead of (N, d) hidden states
                parts = []
                for h in t_hidden.split(self.chunk_size):
                    logits = policy.head(h)  # (chunk, V)
                    parts.append(topk_teacher_targets(logits, min(self.teacher_top_k, logits.shape[-1])))
                return pos, end, tuple(torch.cat(x) for x in zip(*parts))
        return pos, end, t_hidden

    def loss(self, policy, episode, prepared):
        if prepared is None:
            return None
        pos, end, t_hidden = prepared
        s_hidden = policy.hidden(episode.ids()[:end])[pos.to(policy.device)]
        if self.teacher_top_k is not None:
            per_token = chunked_topk_divergence(s_hidden, t_hidden, policy.head, self.divergence,
                                                self.beta, self.chunk_size)
        else:
            per_token = chunked_token_divergence(s_hidden, t_hidden, policy.head, self.divergence,
                                                 self.beta, self.chunk_size)
        loss = per_token.mean()
        return LossOutput(loss, {"loss/divergence": float(loss.detach())})
