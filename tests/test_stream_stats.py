"""StreamStats: the windowed invalid rate, the share of updates from failed episodes, the verb shares."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from callbacks.stream_stats import StreamStats, failed_update_share, window_invalid_rate
from lit_ascent.outcome import TaskOutcome


def test_stream_stat_functions():
    assert window_invalid_rate([(1, 4), (0, 0), (3, 6)]) == pytest.approx(0.4)
    assert window_invalid_rate([]) == 0.0
    assert failed_update_share(1, 4) == 0.25 and failed_update_share(0, 0) == 0.0


def test_stream_stats_callback():
    cb, added = StreamStats(window=2, verbs=1), []
    actions = [["craft a", "get b"], ["craft c", None], ["get a", "get b", "get c", "go x"], ["get y", "look"]]
    for (verified, invalid, turns, updates), acts in zip(
            [(True, 1, 2, 1), (False, 2, 2, 1), (False, 0, 4, 2), (True, 0, 2, 0)], actions):
        outcome = TaskOutcome(SimpleNamespace(verified=verified, num_invalid=invalid, turns=[None] * turns,
                                              actions=acts), dtype="float32", stats={"updates": updates})
        cb.on_after_update(None, None, outcome)
        added.append(outcome.diagnostics)  # the module logs them with the task's metrics
    assert [d["stream/invalid_rate_window"] for d in added] == pytest.approx([0.5, 0.75, 2 / 6, 0.0])
    assert [d["train/updates_from_failed_share"] for d in added] == pytest.approx([0.0, 0.5, 0.75, 0.75])
    # windows of 2 episodes: craft leads the first two (tracked), get from the third on (tracked too)
    assert [d.get("stream/verb_share/craft") for d in added] == pytest.approx([1 / 2, 2 / 4, 1 / 6, 0.0])
    assert [d.get("stream/verb_share/get") for d in added] == [None, None, pytest.approx(3 / 6), pytest.approx(4 / 6)]
    assert not any("stream/verb_share/go" in d for d in added)
    restored = StreamStats(window=2)
    restored.load_state_dict(cb.state_dict())
    assert restored.state_dict() == cb.state_dict()
    with pytest.raises(ValueError, match="stream_stats.window"):
        StreamStats(window=0)
    with pytest.raises(ValueError, match="stream_stats.verbs"):
        StreamStats(verbs=-1)
    old = StreamStats(window=2)  # a checkpoint from before the verb shares
    old.load_state_dict({"recent": [[1, 2]], "updates": {"total": 1, "failed": 0}})
    assert old.tracked == [] and not old.recent_actions
