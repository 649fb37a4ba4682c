"""Stream statistics the papers track for every method: the recent invalid-action
rate and how many updates came from failed (unverified) episodes; and what the agent
does lately, by the first word of its actions (the collapse that invalid rate and
first-token entropy miss: the agent stops using a verb its tasks need)."""
from __future__ import annotations

from collections import deque

from callbacks.base import EpisodeCallback
from lit_ascent.action_words import leading_words, word_shares


def window_invalid_rate(window: list[tuple[int, int]]) -> float:
    """Invalid actions / turns over (invalid, turns) pairs of the last episodes (0 without turns)."""
    turns = sum(t for _, t in window)
    return sum(i for i, _ in window) / turns if turns else 0.0


def failed_update_share(failed_updates: int, total_updates: int) -> float:
    """Share of all optimiser steps so far that learned from an unverified episode."""
    return failed_updates / total_updates if total_updates else 0.0


class StreamStats(EpisodeCallback):
    """Logs ``stream/invalid_rate_window`` (invalid actions / turns over the last
    ``window`` episodes), ``train/updates_from_failed_share`` (cumulative) and
    ``stream/verb_share/<word>``: each tracked first word's share of the window's actions
    (a word is tracked from the first window in which it is among the ``verbs`` commonest).

    Both are measured after the task's update and added to the task's diagnostics,
    so its record (the experience log's line) carries them.
    """

    def __init__(self, window: int = 10, verbs: int = 3):
        """
        Args:
            window: Number of most recent episodes in the sliding invalid-action rate and verb shares (>= 1).
            verbs: How many of a window's commonest first words join the tracked ones (>= 0; 0 logs none).
        """
        if window < 1:
            raise ValueError(f"stream_stats.window must be >= 1, got {window}")
        if verbs < 0:
            raise ValueError(f"stream_stats.verbs must be >= 0, got {verbs}")
        self.window, self.verbs = window, verbs
        self.recent: deque[tuple[int, int]] = deque(maxlen=window)
        self.recent_actions: deque[list[str | None]] = deque(maxlen=window)
        self.tracked: list[str] = []
        self.updates = {"total": 0, "failed": 0}

    def on_after_update(self, trainer, pl_module, outcome) -> None:
        episode = outcome.episode
        self.recent.append((episode.num_invalid, len(episode.turns)))
        self.recent_actions.append(list(episode.actions))
        shares = word_shares(self.recent_actions)
        self.tracked += [w for w in leading_words(shares, self.verbs) if w not in self.tracked]
        n = int(outcome.stats.get("updates", 0))
        self.updates["total"] += n
        self.updates["failed"] += 0 if episode.verified else n
        values = {
            "stream/invalid_rate_window": window_invalid_rate(list(self.recent)),
            "train/updates_from_failed_share": failed_update_share(self.updates["failed"], self.updates["total"]),
            **{f"stream/verb_share/{w}": shares.get(w, 0.0) for w in self.tracked},
        }
        outcome.diagnostics.update(values)

    def state_dict(self) -> dict:
        return {"recent": list(self.recent), "updates": dict(self.updates),
                "recent_actions": list(self.recent_actions), "tracked": list(self.tracked)}

    def load_state_dict(self, state: dict) -> None:
        self.recent = deque((tuple(x) for x in state["recent"]), maxlen=self.window)
        self.updates = dict(state["updates"])
        # checkpoints from before the verb shares hold none: they start from an empty window
        self.recent_actions = deque((list(a) for a in state.get("recent_actions", [])), maxlen=self.window)
        self.tracked = list(state.get("tracked", []))
