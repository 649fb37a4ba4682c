"""Stream statistics the papers track for every method: the recent invalid-action
rate and how many updates came from failed (unverified) episodes."""
from __future__ import annotations

from collections import deque

from callbacks.base import EpisodeCallback


def window_invalid_rate(window: list[tuple[int, int]]) -> float:
    """Invalid actions / turns over (invalid, turns) pairs of the last episodes (0 without turns)."""
    turns = sum(t for _, t in window)
    return sum(i for i, _ in window) / turns if turns else 0.0


def failed_update_share(failed_updates: int, total_updates: int) -> float:
    """Share of all optimiser steps so far that learned from an unverified episode."""
    return failed_updates / total_updates if total_updates else 0.0


class StreamStats(EpisodeCallback):
    """Logs ``stream/invalid_rate_window`` (invalid actions / turns over the last
    ``window`` episodes) and ``train/updates_from_failed_share`` (cumulative).

    Both are measured after the task's update and added to the task's diagnostics,
    so its record (the experience log's line) carries them.
    """

    def __init__(self, window: int = 10):
        """
        Args:
            window: Number of most recent episodes in the sliding invalid-action rate (>= 1).
        """
        if window < 1:
            raise ValueError(f"stream_stats.window must be >= 1, got {window}")
        self.window = window
        self.recent: deque[tuple[int, int]] = deque(maxlen=window)
        self.updates = {"total": 0, "failed": 0}

    def on_after_update(self, trainer, pl_module, outcome) -> None:
        episode = outcome.episode
        self.recent.append((episode.num_invalid, len(episode.turns)))
        n = int(outcome.stats.get("updates", 0))
        self.updates["total"] += n
        self.updates["failed"] += 0 if episode.verified else n
        values = {
            "stream/invalid_rate_window": window_invalid_rate(list(self.recent)),
            "train/updates_from_failed_share": failed_update_share(self.updates["failed"], self.updates["total"]),
        }
        outcome.diagnostics.update(values)

    def state_dict(self) -> dict:
        return {"recent": list(self.recent), "updates": dict(self.updates)}

    def load_state_dict(self, state: dict) -> None:
        self.recent = deque((tuple(x) for x in state["recent"]), maxlen=self.window)
        self.updates = dict(state["updates"])
