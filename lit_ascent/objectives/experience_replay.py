"""Replay of verified experience: a bounded buffer of past updating episodes with their
cached teacher targets (a project extension; ``k = 0`` is the paper's protocol).

The teacher is frozen, so what an objective's ``prepare`` computed for an episode
(teacher hidden states at the aligned positions, or top-k targets) never changes:
the buffer keeps it, and a replayed episode costs only the student's forward and
backward. Each optimiser step of a task uses the current episode plus ``k``
episodes drawn from the buffer (``OaTTTModule.learn``).

Bounds: at most ``buffer_size`` episodes and ``max_mb`` of cached tensors; the
oldest entries go first. Sampling uses the buffer's own generator (seeded from the
stream's seed), whose state, like the episodes, is part of the stream checkpoint.
The cached targets are not checkpointed: a resumed stream recomputes them with the
same frozen teacher (``load_state_dict``), which gives the same tensors.
"""
from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lit_ascent.trajectory import Episode, episode_from_state, episode_state

log = logging.getLogger(__name__)

SAMPLINGS = ("uniform", "recency")


@dataclass
class ReplayConfig:
    """Replay of verified experience (0 = off: the paper's protocol, bit-identical to no replay)."""

    k: int = 0
    """Episodes drawn from the buffer for every optimiser step, beside the current one (>= 0; 0 = off)."""
    buffer_size: int = 64
    """Most episodes kept; the oldest is dropped first (>= 1)."""
    max_mb: float = 512.0
    """Most megabytes of cached teacher targets kept; the oldest entries are dropped first (> 0)."""
    sampling: str = "uniform"
    """uniform | recency (weight halves every ``half_life`` episodes of age)."""
    half_life: float = 16.0
    """Recency sampling: age (in buffered episodes) at which an episode's weight halves (> 0)."""

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"model.replay.k must be >= 0, got {self.k}")
        if self.buffer_size < 1:
            raise ValueError(f"model.replay.buffer_size must be >= 1, got {self.buffer_size}")
        if not self.max_mb > 0:
            raise ValueError(f"model.replay.max_mb must be > 0, got {self.max_mb}")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"model.replay.sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        if not self.half_life > 0:
            raise ValueError(f"model.replay.half_life must be > 0, got {self.half_life}")


def tensor_bytes(value: Any) -> int:
    """Bytes held by the tensors inside ``value`` (nested tuples, lists, dicts, dataclasses)."""
    if isinstance(value, torch.Tensor):
        return value.nelement() * value.element_size()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = [getattr(value, f.name) for f in dataclasses.fields(value)]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v) for v in value)
    return 0


def recency_weights(n: int, half_life: float) -> list[float]:
    """Sampling weights of entries 0 (oldest) .. n-1 (newest): 2 ** (-age / half_life), age 0 = newest."""
    return [2.0 ** (-(n - 1 - i) / half_life) for i in range(n)]


def draw_without_replacement(rng: random.Random, weights: list[float], k: int) -> list[int]:
    """``min(k, n)`` distinct indices, each draw proportional to the remaining weights."""
    left = list(range(len(weights)))
    out: list[int] = []
    for _ in range(min(k, len(left))):
        total = sum(weights[i] for i in left)
        x, acc = rng.random() * total, 0.0
        for j, i in enumerate(left):
            acc += weights[i]
            if x < acc or j == len(left) - 1:
                out.append(left.pop(j))
                break
    return out


@dataclass
class ReplayEntry:
    episode: Episode
    prepared: Any
    """The objective's ``prepare`` output for the episode (cached teacher targets)."""
    nbytes: int


class ReplayBuffer:
    """Bounded FIFO of (episode, cached teacher targets), sampled with its own generator."""

    def __init__(self, cfg: ReplayConfig, seed: int = 0):
        self.cfg = cfg
        self.entries: list[ReplayEntry] = []
        self.rng = random.Random(seed)
        self.counts = {"added": 0, "evicted": 0, "too_large": 0}

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def add(self, episode: Episode, prepared: Any) -> None:
        """Keep ``episode``; drop the oldest entries until both bounds hold."""
        if prepared is None:
            return
        size, limit = tensor_bytes(prepared), int(self.cfg.max_mb * 2**20)
        if size > limit:
            self.counts["too_large"] += 1
            log.warning("replay: task %s's cached targets (%.1f MB) exceed model.replay.max_mb; not buffered",
                        episode.task.task_id, size / 2**20)
            return
        self.entries.append(ReplayEntry(episode, prepared, size))
        self.counts["added"] += 1
        while len(self.entries) > self.cfg.buffer_size or self.nbytes > limit:
            self.entries.pop(0)
            self.counts["evicted"] += 1

    def sample(self, k: int) -> list[ReplayEntry]:
        """``min(k, len)`` distinct entries, uniform or recency-weighted (oldest first in the result)."""
        n = len(self.entries)
        if k <= 0 or n == 0:
            return []
        if self.cfg.sampling == "uniform":
            picked = self.rng.sample(range(n), min(k, n))
        else:
            picked = draw_without_replacement(self.rng, recency_weights(n, self.cfg.half_life), k)
        return [self.entries[i] for i in sorted(picked)]

    def stats(self) -> dict[str, float]:
        return {"replay/buffer_episodes": float(len(self.entries)), "replay/buffer_mb": self.nbytes / 2**20,
                "replay/evicted": float(self.counts["evicted"]), "replay/too_large": float(self.counts["too_large"])}

    def state_dict(self) -> dict[str, Any]:
        """Episodes and generator state as plain values (the cached targets are recomputed on load)."""
        version, internal, gauss = self.rng.getstate()
        return {"episodes": [episode_state(e.episode) for e in self.entries], "counts": dict(self.counts),
                "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict[str, Any], prepare: Callable[[Episode], Any]) -> None:
        """Restore the buffer; ``prepare(episode)`` recomputes each episode's teacher targets."""
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.counts = dict(state["counts"])
        self.entries = []
        for s in state["episodes"]:
            ep = episode_from_state(s)
            prepared = prepare(ep)
            self.entries.append(ReplayEntry(ep, prepared, tensor_bytes(prepared)))
