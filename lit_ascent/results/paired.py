"""Paired, per-task comparison of each method against the base on the same stream.

All methods of one seed see the same tasks, so a difference in success is best
read task by task: how many tasks both solved, how many only the method, how
many only the base, and whether the two discordant counts differ more than
chance would (the exact McNemar test, a two-sided sign test on the discordant
tasks). The difference in success comes with Newcombe's (1998) score interval
for paired proportions, so a small table says how large an effect it could
still hide. ``task_matrix`` shows which run solved which task, in how many turns.
"""
from __future__ import annotations

import math
import statistics

Records = list[dict]
Runs = dict[str, dict[str, Records]]  # method -> seed folder -> records in stream order
COUNTS = ("both", "only_method", "only_base", "neither")
Z95 = 1.959964
"""The standard normal quantile of 0.975 (two-sided 95%)."""


def paired_counts(records: Records, base_records: Records) -> dict[str, int]:
    """On tasks both runs played (matched by ``task_id``): solved by both, only one, or neither."""
    base = {r["task_id"]: bool(r["verified"]) for r in base_records}
    counts = dict.fromkeys(COUNTS, 0)
    for r in records:
        if r["task_id"] not in base:
            continue
        mine, theirs = bool(r["verified"]), base[r["task_id"]]
        key = "both" if mine and theirs else "only_method" if mine else "only_base" if theirs else "neither"
        counts[key] += 1
    return counts


def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for discordant counts b and c.

    p = min(1, 2 * P(X <= min(b, c))) with X ~ Binomial(b + c, 1/2); 1.0 when there is no discordant task.
    """
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion p = successes / n.

    centre = (p + z^2 / 2n) / (1 + z^2 / n),
    half-width = z * sqrt(p (1 - p) / n + z^2 / 4n^2) / (1 + z^2 / n);
    (0, 1) when n = 0 (no information).
    """
    if n == 0:
        return 0.0, 1.0
    p, z2 = successes / n, z * z
    scale = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / scale
    half = z * math.sqrt(max(p * (1 - p) / n + z2 / (4 * n * n), 0.0)) / scale
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_phi(both: int, only_method: int, only_base: int, neither: int) -> float:
    """Newcombe's (1998) correlation of the two paired outcomes, phi* = C / sqrt(efgh).

    With a = both, b = only_method, c = only_base, d = neither and the margins
    e = a + b, f = c + d, g = a + c, h = b + d: C = ad - bc, lowered by n/2 when
    positive (C = max(ad - bc - n/2, 0) for ad > bc), as in his method 10; 0 when a margin is 0.
    """
    a, b, c, d = both, only_method, only_base, neither
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    if margins == 0:
        return 0.0
    cross = a * d - b * c
    if cross > 0:
        cross = max(cross - (a + b + c + d) / 2, 0.0)
    return cross / math.sqrt(margins)


def paired_difference_interval(both: int, only_method: int, only_base: int, neither: int,
                               z: float = Z95) -> tuple[float, float]:
    """95% interval (at ``z``) for the paired difference p1 - p2 of two success rates on the same n tasks.

    Newcombe (1998), Stat. Med. 17:2635, method 10: p1 = (a + b) / n (the method), p2 = (a + c) / n (the
    base), (l1, u1) and (l2, u2) their Wilson intervals, phi = ``paired_phi``, D = p1 - p2 = (b - c) / n:

        lower = D - sqrt((p1 - l1)^2 - 2 phi (p1 - l1)(u2 - p2) + (u2 - p2)^2)
        upper = D + sqrt((u1 - p1)^2 - 2 phi (u1 - p1)(p2 - l2) + (p2 - l2)^2)

    (-1, 1) when n = 0.
    """
    n = both + only_method + only_base + neither
    if n == 0:
        return -1.0, 1.0
    p1, p2 = (both + only_method) / n, (both + only_base) / n
    l1, u1 = wilson_interval(both + only_method, n, z)
    l2, u2 = wilson_interval(both + only_base, n, z)
    phi = paired_phi(both, only_method, only_base, neither)

    def spread(x: float, y: float) -> float:
        return math.sqrt(max(x * x - 2 * phi * x * y + y * y, 0.0))

    return p1 - p2 - spread(p1 - l1, u2 - p2), p1 - p2 + spread(u1 - p1, p2 - l2)


def paired_stats(counts: dict[str, int]) -> dict[str, float]:
    """McNemar's exact p, the difference in success (method - base) and its 95% interval, from ``COUNTS``."""
    n = sum(counts[k] for k in COUNTS)
    low, high = paired_difference_interval(*(counts[k] for k in COUNTS))
    return {"p": mcnemar_exact_p(counts["only_method"], counts["only_base"]),
            "diff": (counts["only_method"] - counts["only_base"]) / n if n else 0.0,
            "diff_low": low, "diff_high": high}


def mean_std(values: list[float | None]) -> tuple[float, float, int] | None:
    """(mean, sample std (n-1; 0 for one value), n) over the values that are not None."""
    kept = [v for v in values if v is not None]
    if not kept:
        return None
    return statistics.fmean(kept), statistics.stdev(kept) if len(kept) > 1 else 0.0, len(kept)


def method_order(methods, base: str) -> list[str]:
    return sorted(methods, key=lambda m: (m != base, m))


def format_cell(stat: tuple[float, float, int] | None, scale: float) -> str:
    if stat is None:
        return "-"
    mean, std, _ = stat  # rounded to 9 places first: equal means must not round apart on float noise
    return f"{round(mean * scale, 9):.1f} ± {round(std * scale, 9):.1f}"


def format_number(value: float | None, fmt: str = ".3g") -> str:
    return "-" if value is None else format(value, fmt)


def format_difference(row: dict) -> str:
    """'+12.5 [-3.1, +27.4]': the difference and its interval in percentage points."""
    return f"{100 * row['diff']:+.1f} [{100 * row['diff_low']:+.1f}, {100 * row['diff_high']:+.1f}]"


def paired_rows(runs: Runs, base: str = "base") -> list[dict]:
    """One row per (method, seed) with a base run of that seed, plus a pooled row per method over its seeds."""
    rows = []
    for method, seeds in runs.items():
        if method == base:
            continue
        per_seed = [{"method": method, "seed": seed, **paired_counts(records, runs[base][seed])}
                    for seed, records in sorted(seeds.items()) if seed in runs.get(base, {})]
        if len(per_seed) > 1:
            per_seed.append({"method": method, "seed": "pooled", **{k: sum(r[k] for r in per_seed) for k in COUNTS}})
        rows += per_seed
    for row in rows:
        row.update(paired_stats(row))
    return rows


def paired_markdown(rows: list[dict], base: str = "base") -> str:
    """The paired rows as a markdown table (the difference in percentage points, with its 95% interval)."""
    head = ["method", "seed", "both solved", "only method", f"only {base}", "neither", "McNemar exact p",
            "difference (pp, 95% CI)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(f"| {r['method']} | {r['seed']} | {r['both']} | {r['only_method']} | {r['only_base']} "
                     f"| {r['neither']} | {r['p']:.3g} | {format_difference(r)} |")
    return "\n".join(lines) + "\n"


def short_ids(task_ids: list[str]) -> dict[str, str]:
    """Task ids without the '/'-separated leading and trailing parts that all of them share."""
    parts = [t.split("/") for t in task_ids]
    if len(parts) < 2:
        return {t: t for t in task_ids}
    shortest = min(map(len, parts))
    lead = next((i for i in range(shortest) if len({p[i] for p in parts}) > 1), shortest)
    trail = next((i for i in range(shortest - lead) if len({p[-1 - i] for p in parts}) > 1), shortest - lead)
    return {t: "/".join(p[lead:len(p) - trail]) or t for t, p in zip(task_ids, parts)}


def task_matrix(runs: Runs, seed: str) -> str:
    """Markdown: one row per task of ``seed`` (stream order), one column per method: turns when solved, '-' when not."""
    methods = [m for m in runs if seed in runs[m]]
    order = max((runs[m][seed] for m in methods), key=len)  # the longest run gives the task order
    solved = {m: {r["task_id"]: r["turns"] if r["verified"] else "-" for r in runs[m][seed]} for m in methods}
    names = short_ids([r["task_id"] for r in order])
    lines = ["| # | task | " + " | ".join(methods) + " |", "|" + "---|" * (len(methods) + 2)]
    for r in order:
        cells = [str(solved[m].get(r["task_id"], "")) for m in methods]
        lines.append(f"| {r['task_index']} | {names[r['task_id']]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
