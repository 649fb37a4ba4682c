"""Replay given assistant turns through an environment into an Episode.

The bookkeeping is the rollout's own (``EpisodeRun``), so the token layout is
exactly a generated episode's: a replayed expert or scripted trajectory can be
distilled, imitated or shown as privileged information like a generated one.
"""
from __future__ import annotations

from lit_ascent.envs.base import TextEnv
from lit_ascent.rollout import EpisodeRun, RolloutConfig
from lit_ascent.trajectory import Episode, Task


def replay(tokenizer, env: TextEnv, task: Task, texts: list[str], context: str | None = None) -> Episode:
    """An Episode whose assistant turns are ``texts`` (each closed by the end-of-turn token)."""
    if not texts:
        raise ValueError("replay: texts must hold at least one assistant turn")
    run = EpisodeRun(tokenizer, env, task, RolloutConfig(max_turns=len(texts), max_context_tokens=1 << 30),
                     context)
    for text in texts:
        gen = tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        if run.budget() <= 0 or run.end_turn(gen, closed=True) is None:
            break
    return run.finish()
