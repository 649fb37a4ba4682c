"""Power of the paired held-out comparison: how likely the exact McNemar test finds an effect.

    python -m lit_ascent.results.power --pairs 64 192 --discordant 0.1 0.2 --effect 0.05 0.1

A design of ``n`` paired tasks (each solved or not by the method and by the base) has discordant
pairs with probability ``d`` and a true success difference ``e`` = P(only the method) - P(only
the base). The number of discordant pairs D is Binomial(n, d); given D, the method-only count B is
Binomial(D, (d + e) / (2 d)). The power is the exact probability that the two-sided McNemar p
(``lit_ascent.results.paired.mcnemar_exact_p``) is below ``alpha`` with B > D - B. Exact sums,
no simulation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import comb

from lit_ascent.options import parse_options
from lit_ascent.results.paired import mcnemar_exact_p


def binomial_pmf(n: int, p: float) -> list[float]:
    return [comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(n + 1)]


def mcnemar_power(pairs: int, discordant: float, effect: float, alpha: float = 0.05) -> float:
    """P(the exact McNemar test rejects at ``alpha`` in the method's favour)."""
    if not 0 < discordant <= 1 or abs(effect) > discordant:
        raise ValueError(f"power: need 0 < discordant <= 1 and |effect| <= discordant, got {discordant}, {effect}")
    q = (discordant + effect) / (2 * discordant)
    power = 0.0
    for d, p_d in enumerate(binomial_pmf(pairs, discordant)):
        if p_d < 1e-15 or d == 0:
            continue
        power += p_d * sum(p_b for b, p_b in enumerate(binomial_pmf(d, q))
                           if b > d - b and mcnemar_exact_p(b, d - b) < alpha)
    return power


@dataclass
class PowerOptions:
    pairs: list[int] = field(default_factory=lambda: [64, 192])
    """Paired tasks (64: one seed's TextCraft held-out set; 192: three seeds pooled)."""
    discordant: list[float] = field(default_factory=lambda: [0.1, 0.2])
    """Share of pairs where exactly one of the two solves the task."""
    effect: list[float] = field(default_factory=lambda: [0.05, 0.1])
    """True success difference, method minus base."""
    alpha: float = 0.05


def table(opts: PowerOptions) -> str:
    lines = ["| pairs | discordant | effect | power |", "|---|---|---|---|"]
    for n in opts.pairs:
        for d in opts.discordant:
            for e in opts.effect:
                if abs(e) <= d:
                    lines.append(f"| {n} | {d:.2f} | {e:+.2f} | {mcnemar_power(n, d, e, opts.alpha):.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    print(table(parse_options(PowerOptions, argv, prog="python -m lit_ascent.results.power", description=__doc__)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
