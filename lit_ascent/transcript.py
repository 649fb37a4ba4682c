"""An episode as a readable markdown transcript: the task, every turn (thought and action,
the environment's reply, invalid turns marked), the verifier's verdict and what the
update did with the episode. TensorBoard's text plugin renders it (``callbacks/transcript.py``).
"""
from __future__ import annotations

from lit_ascent.trajectory import Episode

UPDATE_KEYS = ("update/loss_before", "update/loss_after", "update/absorbed_fraction", "update/replayed")
"""The update's numbers shown under a transcript, in this order, when the update produced them."""


def fenced(text: str, limit: int) -> str:
    """``text`` as a markdown code block (shown verbatim), cut to ``limit`` characters with a note."""
    cut = len(text) - limit
    body = text if cut <= 0 else text[:limit] + f"\n... [{cut} more characters]"
    return "```\n" + body.replace("```", "'''") + "\n```"


def verdict(episode: Episode) -> str:
    """One line: solved or not, turns, invalid turns, and the environment error that ended it."""
    line = (f"**{'SOLVED' if episode.verified else 'failed'}** in {len(episode.turns)} turns, "
            f"{episode.num_invalid} invalid")
    return line + (f"; environment error: `{episode.error}`" if episode.error else "")


def update_line(episode: Episode, stats: dict) -> str:
    """What the update did: how many optimiser steps and their numbers, or why there was none."""
    steps = int(stats.get("updates", 0))
    if not steps:
        reason = "vetoed (not verified, or a callback said no)" if not episode.trainable else "nothing to learn"
        return f"**update:** none ({reason})"
    numbers = ", ".join(f"{k.split('/', 1)[1]} {stats[k]:.4g}" for k in UPDATE_KEYS if k in stats)
    return f"**update:** {steps} optimiser step{'s' * (steps != 1)}" + (f" ({numbers})" if numbers else "")


def render(episode: Episode, stats: dict | None = None, max_chars: int = 2000,
           diagnostics: dict[str, float] | None = None) -> str:
    """The whole episode as markdown (the update's line only with the update's ``stats``, the
    diagnostics line only with ``diagnostics``); each text (task, turn, observation) cut to ``max_chars``."""
    t = episode.task
    parts = [f"### task {t.index}: `{t.task_id}` ({t.env}, reset seed {t.seed})", verdict(episode) + "  ",
             *([update_line(episode, stats)] if stats is not None else []),
             "**task:**", fenced(episode.first_observation, max_chars)]
    for turn in episode.turns:
        mark = "" if turn.valid else " (**invalid**)"
        action = f"`{turn.action}`" if turn.action is not None else "no parseable action"
        parts += [f"**turn {turn.index + 1}**{mark}: {action}", fenced(turn.text, max_chars),
                  fenced(turn.observation, max_chars)]
    if diagnostics:
        parts.append("**diagnostics:** " + ", ".join(f"{k} {v:.4g}" for k, v in sorted(diagnostics.items())))
    return "\n\n".join(parts)
