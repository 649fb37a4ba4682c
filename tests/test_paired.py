"""The paired statistics of the held-out evaluation and the report: Wilson's score interval and
Newcombe's interval for a paired difference (method 10), against the formulas by hand and published values."""
from __future__ import annotations

import math

import pytest

from lit_ascent.results import paired

Z = 1.959964


def wilson_by_hand(s: int, n: int) -> tuple[float, float]:
    """The two roots in p of (s/n - p)^2 = z^2 p (1 - p) / n (the score test's acceptance limits)."""
    q = s / n
    a, b, c = 1 + Z * Z / n, -(2 * q + Z * Z / n), q * q
    root = math.sqrt(b * b - 4 * a * c)
    return (-b - root) / (2 * a), (-b + root) / (2 * a)


def newcombe_by_hand(a: int, b: int, c: int, d: int) -> tuple[float, float]:
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    (l1, u1), (l2, u2) = wilson_by_hand(a + b, n), wilson_by_hand(a + c, n)
    cross = a * d - b * c
    cross = max(cross - n / 2, 0) if cross > 0 else cross
    phi = cross / math.sqrt((a + b) * (c + d) * (a + c) * (b + d))
    lower = p1 - p2 - math.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    upper = p1 - p2 + math.sqrt((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2)
    return lower, upper


@pytest.mark.parametrize("s,n", [(81, 263), (15, 148), (1, 29), (7, 64), (64, 64)])
def test_wilson_interval_is_the_score_test_inversion(s, n):
    assert paired.wilson_interval(s, n) == pytest.approx(wilson_by_hand(s, n), abs=1e-12)


def test_wilson_interval_published_values_and_limits():
    # Newcombe (1998a), Stat. Med. 17:857, Table I, method 3 (score, no continuity correction)
    published = {(81, 263): (0.2553, 0.3662), (15, 148): (0.0624, 0.1605), (0, 20): (0.0, 0.1611),
                 (1, 29): (0.0061, 0.1718)}
    for (s, n), interval in published.items():
        assert paired.wilson_interval(s, n) == pytest.approx(interval, abs=5e-5)
    assert paired.wilson_interval(0, 20)[1] == pytest.approx(Z * Z / (20 + Z * Z))  # closed form at s = 0
    assert paired.wilson_interval(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize("counts", [(20, 9, 3, 32), (5, 1, 7, 51), (30, 2, 2, 30), (0, 4, 1, 59)])
def test_paired_interval_against_the_formula_by_hand(counts):
    low, high = paired.paired_difference_interval(*counts)
    assert (low, high) == pytest.approx(newcombe_by_hand(*counts), abs=1e-12)
    a, b, c, d = counts
    assert low <= (b - c) / sum(counts) <= high
    # the method and the base swapped: the interval is mirrored
    assert paired.paired_difference_interval(a, c, b, d) == pytest.approx((-high, -low), abs=1e-12)


def test_paired_interval_published_values():
    # Newcombe (1998b), Stat. Med. 17:2635, method 10, his examples (a, b, c, d)
    published = {(36, 12, 2, 0): (0.0569, 0.3404), (18, 12, 2, 18): (0.0562, 0.3290), (53, 0, 0, 1): (-0.0729, 0.0729)}
    for counts, interval in published.items():
        assert paired.paired_difference_interval(*counts) == pytest.approx(interval, abs=5e-5)
    assert paired.paired_phi(10, 0, 0, 0) == 0.0  # an empty margin: phi = 0
    assert paired.paired_difference_interval(0, 0, 0, 0) == (-1.0, 1.0)
