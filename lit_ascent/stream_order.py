"""The seeded task order every program draws its tasks from.

One source for the order of a stream, of a fixed evaluation set (transfer, held-out),
of the cycles' deployment set and of the warm start's demo and evaluation tasks, so
that the same seed gives the same tasks everywhere.
"""
from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace

from lit_ascent.trajectory import Task


def stream_order(tasks: list[Task], seed: int, shuffle: bool = True, balance_by: str | None = None) -> list[Task]:
    """The stream's task order: seeded shuffle, optionally round-robin over a meta key.

    With ``balance_by='family'`` every prefix of the stream holds the families in
    near-equal numbers (each family shuffled on its own, then interleaved).
    """
    rng = random.Random(seed)
    tasks = list(tasks)
    if shuffle:
        rng.shuffle(tasks)
    if not balance_by:
        return tasks
    groups: dict = defaultdict(list)
    for t in tasks:
        groups[t.info().get(balance_by)].append(t)
    keys = sorted(groups, key=str)
    if shuffle:
        rng.shuffle(keys)
    out: list[Task] = []
    while any(groups[k] for k in keys):
        out.extend(groups[k].pop(0) for k in keys if groups[k])
    return out


def stream_tasks(tasks: list[Task], num_tasks: int | None, seed: int, shuffle: bool = True,
                 balance_by: str | None = None) -> list[Task]:
    """The first ``num_tasks`` of ``stream_order`` (None: all), numbered from 0, each with its
    environment reset seed drawn from ``random.Random(seed + 1)`` (a generator of its own, so
    the reset seeds do not depend on the draws of the shuffle)."""
    if num_tasks is not None and num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1 or null, got {num_tasks}")
    ordered = stream_order(tasks, seed, shuffle, balance_by)
    ordered = ordered[:num_tasks] if num_tasks else ordered
    rng = random.Random(seed + 1)
    return [replace(t, index=i, seed=rng.randrange(2**31)) for i, t in enumerate(ordered)]
