"""WebShop's reset and step times (search included) and its oracle's success, in one run.

    python -m lit_ascent.bench.webshop [--partition stream] [--goals-per-product 1] [--out docs/results/bench_webshop]

Plays the oracle (``webshop_oracle.solve``) on every goal of the partition and times each
``reset`` and ``step`` (wall clock, milliseconds). One-time costs are timed apart: loading and
checking the data with building the search index, and loading spaCy's model (the first purchase).
Targets (issue 32): reset < 50 ms, step < 20 ms.
"""
from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from lit_ascent.envs.webshop import WebShopEnv, parse_web_action
from lit_ascent.envs.webshop_data import PARTITIONS, resolve_data_dir
from lit_ascent.envs.webshop_oracle import oracle_query, solve
from lit_ascent.envs.webshop_reward import nouns
from lit_ascent.options import parse_options


@dataclass
class BenchOptions:
    partition: str = "stream"
    """Goals to play: demo, stream, heldout or all."""
    goals_per_product: int = 1
    """Goals per product (a large number: every option combination)."""
    out: Path | None = None
    """Write OUT.json and OUT.md."""

    def __post_init__(self) -> None:
        if self.partition not in PARTITIONS:
            raise ValueError(f"--partition must be one of {PARTITIONS}, got {self.partition!r}")


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - t0) * 1000


def spread(ms: list[float]) -> dict:
    ms = sorted(ms)
    return {"n": len(ms), "median_ms": statistics.median(ms), "p95_ms": ms[int(0.95 * (len(ms) - 1))],
            "max_ms": ms[-1]}


def run(opts: BenchOptions) -> dict:
    env = WebShopEnv(partition=opts.partition, goals_per_product=opts.goals_per_product)
    _, load_ms = timed(env.catalog)
    _, spacy_ms = timed(nouns, "warm up")
    tasks = env.tasks()
    resets, steps, rewards, fallbacks = [], {"search": [], "click": []}, Counter(), 0
    for task in tasks:
        _, ms = timed(env.reset, task)
        resets.append(ms)
        for action in solve(env, task):
            result, ms = timed(env.step, action)
            steps[parse_web_action(action)[0]].append(ms)
        rewards["1.0" if result.verified else f"{result.info['reward']:.2f}"] += 1
        fallbacks += oracle_query(env, task)[1]
    return {"partition": opts.partition, "goals_per_product": opts.goals_per_product, "goals": len(tasks), "data_dir": str(resolve_data_dir()),
            "oracle_reward_1": rewards["1.0"], "oracle_rewards": dict(rewards), "name_fallback_searches": fallbacks,
            "load_and_index_ms": load_ms, "spacy_load_ms": spacy_ms, "reset": spread(resets),
            "step_search": spread(steps["search"]), "step_click": spread(steps["click"]),
            "step_all": spread(steps["search"] + steps["click"])}


def markdown(r: dict) -> str:
    rows = [(k, r[k]) for k in ("reset", "step_search", "step_click", "step_all")]
    command = f"python -m lit_ascent.bench.webshop --partition {r['partition']} --goals-per-product {r['goals_per_product']}"
    lines = [f"# WebShop reset / step times (`{command}`)", "",
             f"Oracle: reward 1.0 on {r['oracle_reward_1']}/{r['goals']} goals ({r['name_fallback_searches']} found "
             "by the name fallback search). One-time: data check + index "
             f"{r['load_and_index_ms']:.0f} ms, spaCy model {r['spacy_load_ms']:.0f} ms.", "",
             "| call | n | median ms | p95 ms | max ms |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {v['n']} | {v['median_ms']:.3f} | {v['p95_ms']:.3f} | {v['max_ms']:.3f} |" for k, v in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    opts = parse_options(BenchOptions, argv, prog="python -m lit_ascent.bench.webshop", description=__doc__)
    result = run(opts)
    text = markdown(result)
    print(text)
    if opts.out:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
        opts.out.with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
