"""The one rule for success, turns, invalid-action and score rates over per-task records."""
from __future__ import annotations

import pytest

from lit_ascent.records import record_rates, summarize


def rec(verified, turns, invalid, score=None, updates=0):
    return {"verified": verified, "turns": turns, "invalid": invalid, "score": score, "updates": updates}


def test_rates_against_their_formulas():
    rows = [rec(True, 4, 1), rec(False, 10, 6), rec(False, 6, 0)]
    rates = record_rates(rows)
    assert rates == pytest.approx({"success_rate": 1 / 3, "turns": 20 / 3, "invalid_rate": 7 / 20})
    assert "mean_score" not in rates  # an environment that only verifies has no score column


def test_mean_score_counts_unscored_episodes_as_zero():
    # WebShop: bought at reward 1.0 and 0.5; the third hit the turn limit without buying (no score)
    rows = [rec(True, 4, 0, 1.0), rec(False, 6, 1, 0.5), rec(False, 15, 9)]
    assert record_rates(rows)["mean_score"] == pytest.approx(1.5 / 3)


def test_empty_records_are_zero_not_an_error():
    assert record_rates([]) == {"success_rate": 0.0, "turns": 0.0, "invalid_rate": 0.0}


def test_summary_second_half_and_updates():
    rows = [rec(False, 5, 1, updates=0), rec(True, 3, 0, updates=2), rec(True, 4, 0, updates=2), rec(False, 8, 2)]
    s = summarize(rows)
    assert s["second_half_success_rate"] == 0.5 and s["updates"] == 4 and s["tasks"] == 4
