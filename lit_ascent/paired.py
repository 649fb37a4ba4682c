"""Paired, per-task comparison of each method against the base on the same stream.

All methods of one seed see the same tasks, so a difference in success is best
read task by task: how many tasks both solved, how many only the method, how
many only the base, and whether the two discordant counts differ more than
chance would (the exact McNemar test, a two-sided sign test on the discordant
tasks). ``task_matrix`` shows which run solved which task, in how many turns.
"""
from __future__ import annotations

import math

Records = list[dict]
Runs = dict[str, dict[str, Records]]  # method -> seed folder -> records in stream order
COUNTS = ("both", "only_method", "only_base", "neither")


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
        row["p"] = mcnemar_exact_p(row["only_method"], row["only_base"])
    return rows


def paired_markdown(rows: list[dict], base: str = "base") -> str:
    """The paired rows as a markdown table."""
    head = ["method", "seed", "both solved", "only method", f"only {base}", "neither", "McNemar exact p"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(f"| {r['method']} | {r['seed']} | {r['both']} | {r['only_method']} | {r['only_base']} "
                     f"| {r['neither']} | {r['p']:.3g} |")
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
