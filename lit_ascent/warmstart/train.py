"""Behaviour cloning of demonstrations into a LoRA adapter (the warm start).

The loss of one demo is the token NLL of its assistant tokens,
    L = -1/|M| sum_{p in M} log pi(y_{p+1} | y_{<=p}),
at the positions ``student_targets`` gives (the same positions ASCENT distils
on), minus the turns that show a recovery demo's mistake unless asked.
"""
from __future__ import annotations

import json
import logging
import random
import subprocess
import time
from pathlib import Path

import torch

from lit_ascent.objectives.base import student_targets
from lit_ascent.objectives.losses import token_nll
from lit_ascent.optim import guarded_step
from lit_ascent.warmstart.demos import Demo

log = logging.getLogger(__name__)


def demo_targets(demo: Demo, learn_mistakes: bool = False) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(positions, targets, end) of a demo; the mistake turns are dropped unless ``learn_mistakes``."""
    pos, targets, end = student_targets(demo.episode)
    if learn_mistakes or not demo.mistake_turns or len(pos) == 0:
        return pos, targets, end
    turn_of = torch.tensor(demo.episode.turn_ids, dtype=torch.long)[pos + 1]  # turn of each target token
    keep = ~torch.isin(turn_of, torch.tensor(demo.mistake_turns, dtype=torch.long))
    pos, targets = pos[keep], targets[keep]
    return pos, targets, int(pos.max()) + 1 if len(pos) else 0


def bc_loss(policy, demo: Demo, learn_mistakes: bool = False) -> tuple[torch.Tensor, int, int]:
    """(loss, target tokens, forward tokens) of one demo (``Policy.logits`` on ids[:end] at the positions)."""
    pos, targets, end = demo_targets(demo, learn_mistakes)
    if len(pos) == 0:
        raise ValueError(f"warmstart: demo of {demo.episode.task.task_id!r} has no assistant tokens to learn")
    logits = policy.logits(demo.episode.ids()[:end], pos)  # (N, V)
    return token_nll(logits, targets.to(logits.device)), len(pos), end


@torch.no_grad()
def mean_bc_loss(policy, demos: list[Demo], learn_mistakes: bool = False) -> float:
    """Token-weighted mean BC loss of ``demos`` with the current weights (no update)."""
    total, count = 0.0, 0
    for demo in demos:
        loss, n, _ = bc_loss(policy, demo, learn_mistakes)
        total, count = total + float(loss) * n, count + n
    return total / max(count, 1)


def train_adapter(policy, demos: list[Demo], epochs: int = 1, lr: float = 5e-4, seed: int = 0,
                  weight_decay: float = 0.0, grad_clip: float = 1.0, learn_mistakes: bool = False,
                  log_every: int = 10) -> dict:
    """Behaviour cloning, one demo per step, demos shuffled each epoch; returns the training figures
    (``steps``: the steps taken; a demo with a non-finite loss or gradient is skipped, see ``guarded_step``)."""
    if not demos:
        raise ValueError("warmstart: no demonstrations to train on")
    params = policy.trainable_parameters()
    optim = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    rng = random.Random(seed)
    policy.model.train()
    history, tokens, t0, step = [], 0, time.perf_counter(), 0
    for epoch in range(epochs):
        order = list(range(len(demos)))
        rng.shuffle(order)
        epoch_loss, epoch_targets = 0.0, 0
        for k in order:
            loss, n_targets, n_tokens = bc_loss(policy, demos[k], learn_mistakes)
            tokens += n_tokens
            if not guarded_step(optim, params, [loss], grad_clip).stepped:
                log.warning("epoch %d: demo of %r skipped: non-finite loss or gradient", epoch,
                            demos[k].episode.task.task_id)
                continue
            step += 1
            epoch_loss, epoch_targets = epoch_loss + float(loss.detach()) * n_targets, epoch_targets + n_targets
            if step % log_every == 0:
                rate = tokens / (time.perf_counter() - t0)
                log.info("epoch %d step %d loss/bc %.4f perf/tokens_per_s %.0f", epoch, step, float(loss.detach()), rate)
        history.append(epoch_loss / max(epoch_targets, 1))
        log.info("epoch %d mean loss/bc %.4f", epoch, history[-1])
    policy.model.eval()
    seconds = time.perf_counter() - t0
    return {"epoch_loss": history, "steps": step, "tokens": tokens, "train_s": round(seconds, 2),
            "tokens_per_s": round(tokens / max(seconds, 1e-9), 1)}


def git_commit(cwd: str | Path = ".") -> str | None:
    """HEAD's commit, with ``-dirty`` when the tree has changes (None outside a repository)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def save_adapter(policy, out: str | Path, recipe: dict, demos: list[Demo]) -> Path:
    """The LoRA adapter (safetensors), ``recipe.json`` and ``demos.jsonl`` in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    policy.save_adapter(out)
    (out / "recipe.json").write_text(json.dumps(recipe, indent=2) + "\n")
    (out / "demos.jsonl").write_text("".join(json.dumps(d.record()) + "\n" for d in demos))
    return out
