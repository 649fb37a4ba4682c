"""ReSAIL: trajectory-balanced selective distillation (SGS + TLB) and privileged retention (PR).

METHOD.md section 3. For a batch U of verified episodes (one episode online):

- SGS: every interaction step k (one assistant turn) gets the PI sensitivity
  s_k = token-mean JS(teacher(. | with PI), teacher(. | without PI)); only the
  K = ceil(rho * |U|) most sensitive steps are distilled.
- TLB: the selected steps' losses are averaged per trajectory, then summed and
  divided by the number of trajectories |B|.
- PR: forward KL(teacher || student) on the *privileged view* (the teacher's
  input, with the PI) at every step of U, same trajectory reduction.

L = L_sel + lambda * L_ret. Scores and the selection come from ``prepare_batch``
(teacher only, no gradient) and are held fixed while ``loss_batch`` backpropagates.
``prepare_batch`` = ``prepare_episode`` per episode, then ``select`` over the batch. The
cycles driver prepares each episode once per cycle (its teacher is frozen for the
cycle) and selects over every new batch; the online stream prepares once per task,
which is the same thing there because the teacher is frozen and U is the one episode.

Cost: SGS skips the student forward/backward of every episode without a selected
step and cuts the others at their last selected token; PR adds one student
forward/backward per episode on the (longer) privileged view.
The teacher is whatever ``policy.teacher()`` gives: the frozen initial model
online, the start-of-cycle snapshot in the cycles mode (lit_ascent/cycles.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lit_ascent.objectives.base import LossOutput, student_targets
from lit_ascent.objectives.distillation import Distillation
from lit_ascent.objectives.divergences import chunked_token_divergence
from lit_ascent.objectives.losses import segment_mean, select_top_steps, trajectory_balanced_mean
from lit_ascent.privileged import teacher_sequence
from lit_ascent.trajectory import Episode


@dataclass
class StepTargets:
    """What stays fixed for one episode during an update (all teacher-side, no gradient)."""

    positions: Tensor
    """(n,) student positions whose logits predict an assistant token."""
    steps: Tensor
    """(n,) each position's step (turn) in [0, num_steps)."""
    num_steps: int
    teacher_ids: Tensor
    """(T',) the privileged view: PI prompt + the episode's ids (up to the last target)."""
    offset: int
    """Teacher position = student position + offset."""
    teacher_hidden: Tensor
    """(n, d) teacher hidden states on the privileged view at the aligned positions."""
    scores: Tensor
    """(num_steps,) PI sensitivity s_k (zeros when the selection needs no scores)."""
    selected: Tensor
    """(num_steps,) bool, the steps SGS keeps (set by ``prepare_batch`` over the whole batch)."""
    invalid: Tensor
    """(num_steps,) bool, the step's action was invalid (the environment did not execute it)."""


def privileged_view(tokenizer, episode: Episode, pi_text: str) -> tuple[list[int], int]:
    """(ids, offset) of the teacher's input; an empty PI text means no PI: the student's own input."""
    if not pi_text:
        return list(episode.token_ids), 0
    return teacher_sequence(tokenizer, episode, pi_text)


class ReSAIL(Distillation):
    """Self-distillation with SGS step selection, TLB reduction and PR retention.

    ``selection_ratio=1, trajectory_balance=False, retention_weight=0`` is plain
    token-mean distillation (the SDPO / OEL parent methods, and ASCENT online).
    """

    def __init__(self, divergence: str = "forward_kl", beta: float = 0.5,
                 pi_content: str = "reasoning_actions", chunk_size: int = 256,
                 selection_ratio: float = 0.05, trajectory_balance: bool = True,
                 retention_weight: float = 0.5, valid_steps_only: bool = False):
        """
        Args:
            divergence: forward_kl (KL(q||p), default) | reverse_kl | jsd, for the selected steps.
            beta: JSD interpolation weight in [0, 1]; used by jsd only.
            pi_content: privileged information: actions | reasoning_actions | full.
            chunk_size: positions per chunk of the divergence (bounds the (chunk, V) logits).
            selection_ratio: rho in (0, 1]: share of the batch's steps SGS keeps (K = ceil(rho |U|)); 1 keeps all.
            trajectory_balance: TLB: mean per trajectory, then / |B|; False: token mean over the batch.
            retention_weight: lambda >= 0 of the privileged-retention KL (0 disables PR).
            valid_steps_only: distil only steps whose action was valid: SGS ranks those alone (K = ceil(rho
                |valid steps of U|); rho = 1 keeps every valid step). Not in the papers: on the TextCraft
                reference SGS kept mostly invalid craft attempts (docs/results/resail_cycles). PR is unchanged.
        """
        super().__init__(divergence, beta, pi_content, chunk_size, valid_steps_only=valid_steps_only)
        if not 0.0 < selection_ratio <= 1.0:
            raise ValueError(f"objective.selection_ratio must be in (0, 1], got {selection_ratio}")
        if retention_weight < 0:
            raise ValueError(f"objective.retention_weight must be >= 0, got {retention_weight}")
        self.selection_ratio, self.trajectory_balance = selection_ratio, trajectory_balance
        self.retention_weight = retention_weight

    # ------------------------------------------------------------------ teacher side (no gradient)
    def prepare(self, policy, episode):
        return self.prepare_batch(policy, [episode])

    def loss(self, policy, episode, prepared):
        return self.loss_batch(policy, [episode], prepared)

    def prepare_batch(self, policy, episodes: list[Episode],
                      pi_texts: list[str] | None = None) -> list[StepTargets | None]:
        """Teacher targets, PI sensitivities and the SGS selection over the whole batch U.

        ``pi_texts[i]`` overrides episode i's rendered PI (e.g. an OEL lesson); "" = no PI.
        """
        texts = pi_texts if pi_texts is not None else [self.privileged_text(e) for e in episodes]
        if len(texts) != len(episodes):
            raise ValueError(f"got {len(texts)} PI texts for {len(episodes)} episodes")
        return self.select([self.prepare_episode(policy, e, z) for e, z in zip(episodes, texts)])

    def select(self, prepared: list[StepTargets | None]) -> list[StepTargets | None]:
        """SGS over the batch: sets each target's ``selected`` to its share of the batch's top steps (among
        the valid steps only, with ``valid_steps_only``)."""
        kept = [p for p in prepared if p is not None]
        if kept:
            scores = torch.cat([p.scores for p in kept])
            eligible = torch.ones_like(scores, dtype=torch.bool)
            if self.valid_steps_only:
                eligible = ~torch.cat([p.invalid for p in kept])
            selected = torch.zeros_like(eligible)
            selected[eligible] = select_top_steps(scores[eligible], self.selection_ratio)
            for p, mask in zip(kept, selected.split([p.num_steps for p in kept])):
                p.selected = mask
        return prepared

    def prepare_episode(self, policy, episode: Episode, pi_text: str) -> StepTargets | None:
        pos, _, end = student_targets(episode)
        if not len(pos):
            return None
        dev = policy.device
        turn_of = torch.tensor(episode.turn_ids)[pos + 1]
        turns, steps = torch.unique(turn_of, return_inverse=True)
        num_steps = int(steps.max()) + 1
        rejected = episode.invalid_turns
        invalid = torch.tensor([t in rejected for t in turns.tolist()], dtype=torch.bool, device=dev)
        t_ids, offset = privileged_view(policy.tokenizer, episode, pi_text)
        t_ids = torch.tensor(t_ids[: end + offset])
        pos, steps = pos.to(dev), steps.to(dev)
        with policy.teacher():
            t_hidden = policy.hidden(t_ids)[pos + offset]
            scores = torch.zeros(num_steps, device=dev)
            if self.selection_ratio < 1.0:  # rho = 1 keeps every step: no scores needed
                scores = self.sensitivity(policy, episode.ids()[:end], pos, t_hidden, steps, num_steps)
        return StepTargets(pos, steps, num_steps, t_ids, offset, t_hidden, scores,
                           torch.ones(num_steps, dtype=torch.bool, device=dev), invalid)

    def sensitivity(self, policy, plain_ids: Tensor, pos: Tensor, t_hidden: Tensor,
                    steps: Tensor, num_steps: int) -> Tensor:
        """s_k = token-mean JS(teacher with PI, teacher without PI) per step, (num_steps,).

        The same quantity as ``losses.pi_sensitivity`` but chunked over positions so
        that no (n, V) logits are materialised. Call inside ``policy.teacher()``.
        """
        plain_hidden = policy.hidden(plain_ids)[pos]
        js = chunked_token_divergence(plain_hidden, t_hidden, policy.head, "jsd", 0.5, self.chunk_size)
        return segment_mean(js, steps, num_steps)

    # ------------------------------------------------------------------ student side (gradient)
    def loss_batch(self, policy, episodes: list[Episode], prepared: list[StepTargets | None]) -> LossOutput | None:
        """L = L_sel + lambda * L_ret over the batch; None when no episode has a target."""
        pairs = [(e, p) for e, p in zip(episodes, prepared) if p is not None]
        if not pairs or (self.retention_weight == 0 and not any(p.selected.any() for _, p in pairs)):
            return None  # nothing to distil (no valid step, with valid_steps_only): the update is skipped, logged
        sel = self.selective_loss(policy, pairs)
        loss, metrics = sel, {"loss/selective": float(sel.detach())}
        if self.retention_weight > 0:
            ret = self.retention_loss(policy, pairs)
            loss = loss + self.retention_weight * ret
            metrics["loss/retention"] = float(ret.detach())
        metrics["loss/divergence"] = float(loss.detach())
        metrics.update(selection_stats([p for _, p in pairs]))
        return LossOutput(loss, metrics)

    def selective_loss(self, policy, pairs: list[tuple[Episode, StepTargets]]) -> Tensor:
        """L_sel: the divergence at the selected steps only; unselected episodes cost no forward."""
        step_losses, token_sum, token_count = [], 0.0, 0
        for episode, p in pairs:
            keep = p.selected[p.steps]  # (n,) positions of selected steps
            if not keep.any():
                step_losses.append(torch.zeros(p.num_steps, device=p.scores.device))
                continue
            pos = p.positions[keep]
            s_hidden = policy.hidden(episode.ids()[: int(pos.max()) + 1])[pos]
            per_token = chunked_token_divergence(s_hidden, p.teacher_hidden[keep], policy.head,
                                                 self.divergence, self.beta, self.chunk_size)
            step_losses.append(segment_mean(per_token, p.steps[keep], p.num_steps))
            token_sum, token_count = token_sum + per_token.sum(), token_count + len(per_token)
        if self.trajectory_balance:
            return self._balanced(step_losses, pairs, [p.selected for _, p in pairs])
        return _token_mean(token_sum, token_count, policy)

    def retention_loss(self, policy, pairs: list[tuple[Episode, StepTargets]]) -> Tensor:
        """L_ret (PR): KL(teacher || student) on the privileged view at every step of U."""
        step_losses, token_sum, token_count = [], 0.0, 0
        for _, p in pairs:
            r_hidden = policy.hidden(p.teacher_ids)[p.positions + p.offset]  # adapter on, with grad
            per_token = chunked_token_divergence(r_hidden, p.teacher_hidden, policy.head,
                                                 "forward_kl", chunk_size=self.chunk_size)
            step_losses.append(segment_mean(per_token, p.steps, p.num_steps))
            token_sum, token_count = token_sum + per_token.sum(), token_count + len(per_token)
        if self.trajectory_balance:
            everything = [torch.ones_like(p.selected) for _, p in pairs]
            return self._balanced(step_losses, pairs, everything)
        return _token_mean(token_sum, token_count, policy)

    @staticmethod
    def _balanced(step_losses: list[Tensor], pairs, selected: list[Tensor]) -> Tensor:
        trajectory = torch.cat([torch.full((p.num_steps,), b, dtype=torch.long, device=p.scores.device)
                                for b, (_, p) in enumerate(pairs)])
        return trajectory_balanced_mean(torch.cat(step_losses), trajectory, torch.cat(selected), len(pairs))


def _token_mean(token_sum, token_count: int, policy) -> Tensor:
    if token_count == 0:  # nothing selected: a zero that still reaches the parameters
        return sum(p.sum() for p in policy.trainable_parameters()) * 0.0
    return token_sum / token_count


def selection_stats(prepared: list[StepTargets]) -> dict[str, float]:
    """How much of the batch SGS kept, how PI-sensitive the kept steps are, and how many of them (and of all
    steps) were invalid actions: where the teacher's PI disagrees with the agent most."""
    scores = torch.cat([p.scores for p in prepared])
    selected = torch.cat([p.selected for p in prepared])
    invalid = torch.cat([p.invalid for p in prepared]).float()
    return {
        "resail/steps": float(len(selected)),
        "resail/selected_steps": float(selected.sum()),
        "resail/selected_trajectories": float(sum(bool(p.selected.any()) for p in prepared)),
        "resail/sensitivity_mean": float(scores.mean()),
        "resail/sensitivity_selected_mean": float(scores[selected].mean()) if selected.any() else 0.0,
        "resail/invalid_share": float(invalid.mean()),
        "resail/selected_invalid_share": float(invalid[selected].mean()) if selected.any() else 0.0,
    }
