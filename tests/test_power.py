"""The paired design's power against closed forms."""
from __future__ import annotations

from math import comb

import pytest

from lit_ascent.results.power import main, mcnemar_power


def test_all_discordant_pairs_in_favour_is_a_binomial_tail():
    # q = 1: B = D always; the exact test rejects iff 2 / 2**D < 0.05, i.e. D >= 6
    tail = sum(comb(64, k) * 0.1 ** k * 0.9 ** (64 - k) for k in range(6, 65))
    assert mcnemar_power(64, 0.1, 0.1) == pytest.approx(tail, rel=1e-12)


def test_no_effect_rejects_in_favour_at_most_half_alpha_and_power_grows_with_pairs():
    assert mcnemar_power(192, 0.2, 0.0) <= 0.025
    assert mcnemar_power(64, 0.15, 0.1) < mcnemar_power(192, 0.15, 0.1) < 1.0
    assert mcnemar_power(192, 0.15, -0.1) < 1e-6  # an effect against the method never counts


def test_bad_design_and_the_table(capsys):
    with pytest.raises(ValueError, match="discordant"):
        mcnemar_power(64, 0.05, 0.1)
    assert main(["--pairs", "64", "--discordant", "0.1", "--effect", "0.1"]) == 0
    assert "| 64 | 0.10 | +0.10 | 0.63 |" in capsys.readouterr().out
