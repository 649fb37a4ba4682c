"""Which search result a WebShop agent opens (docs/results/webshop_efficacy, "What the fast weights learned").

A WebShop episode searches, opens one of the results, chooses options and buys. Replaying a run's
recorded actions against the offline shop's own search (the same deterministic BM25 ranking the agent
saw) gives, per episode, the rank of the first result it opened and the rank of the goal's product in
that search. Per run: how often the agent opens the top hit (held out; on the stream, by half and in
the verified episodes it learned from) and how often the top hit is the goal's product; per seed, which
of the goals a method gains or loses against the base it does so by opening the top hit.

    python -m lit_ascent.results.webshop_clicks --runs docs/results/webshop_efficacy/runs \
        --out docs/results/webshop_efficacy/clicks.md
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lit_ascent.envs.webshop import catalog, parse_web_action
from lit_ascent.envs.webshop_data import goal_asin, resolve_data_dir
from lit_ascent.options import parse_options
from lit_ascent.results.heldout_table import heldout_end
from lit_ascent.results.paired import Records
from lit_ascent.results.run_archive import HELDOUT_SUFFIX, load_archive

Search = Callable[[str], list[str]]
"""A query -> the ranked product ids (the shop's search)."""


def opened_rank(actions: list[str], search: Search, target: str) -> tuple[int | None, int | None]:
    """(1-based rank of the first search result the episode opened, rank of ``target`` in that search's
    results); None where no result was opened or the target is not among the results. A click on an
    id that the latest search did not return opens nothing (the env refuses it)."""
    hits: list[str] | None = None
    for action in actions:
        parsed = parse_web_action(action)
        if parsed is None:
            continue
        verb, arg = parsed
        if verb == "search" and arg:
            hits = [h.lower() for h in search(arg)]
        elif verb == "click" and hits is not None and arg.lower() in hits:
            return hits.index(arg.lower()) + 1, hits.index(target.lower()) + 1 if target.lower() in hits else None
    return None, None


def target_of(record: dict) -> str:
    """The goal's product id."""
    return goal_asin(record["task_id"])


def top_share(records: Records, search: Search) -> tuple[int, int]:
    """(episodes whose first opened result was the top hit, episodes)."""
    return sum(opened_rank(r["actions"], search, target_of(r))[0] == 1 for r in records), len(records)


def run_row(stream: Records, heldout: Records, search: Search) -> dict:
    """One run's click figures: each value an (episodes opening the top hit, episodes) pair, plus the
    held-out goals whose product is the top hit of the agent's own search, and those solved."""
    half = len(stream) // 2
    ranks = [opened_rank(r["actions"], search, target_of(r)) for r in heldout]
    return {"heldout_top": (sum(o == 1 for o, _ in ranks), len(heldout)),
            "heldout_target_top": (sum(t == 1 for _, t in ranks), len(heldout)),
            "heldout_solved": (sum(bool(r["verified"]) for r in heldout), len(heldout)),
            "stream_first_half": top_share(stream[:half], search),
            "stream_second_half": top_share(stream[half:], search),
            "stream_verified": top_share([r for r in stream if r["verified"]], search)}


def gains_by_top_hit(method: Records, base: Records, search: Search) -> dict[str, int]:
    """Goals only the method solved (``gained``) or only the base (``lost``), matched by task id, and how
    many of each the top hit explains: gained where the method opened the top hit, it was the goal's
    product and the base opened another result; lost where the method opened the top hit and it was not."""
    theirs = {r["task_id"]: r for r in base}
    out = dict.fromkeys(("gained", "gained_top_hit", "lost", "lost_top_hit"), 0)
    for r in method:
        b = theirs.get(r["task_id"])
        if b is None or bool(r["verified"]) == bool(b["verified"]):
            continue
        opened, target = opened_rank(r["actions"], search, target_of(r))
        if r["verified"]:
            out["gained"] += 1
            out["gained_top_hit"] += opened == target == 1 and opened_rank(b["actions"], search, target_of(b))[0] != 1
        else:
            out["lost"] += 1
            out["lost_top_hit"] += opened == 1 and target != 1
    return out


def fraction(pair: tuple[int, int]) -> str:
    return f"{pair[0]}/{pair[1]}"


def clicks_markdown(rows: dict[str, dict[str, dict]], gains: dict[str, dict[str, int]], method: str, base: str) -> str:
    """``rows``: method -> seed -> ``run_row``; ``gains``: seed -> ``gains_by_top_hit`` of method against base."""
    head = ["method", "seed", "held out: opened the top hit", "held out: goal's product is the top hit",
            "held out: solved", "stream, 1st half: opened the top hit", "stream, 2nd half", "verified stream episodes"]
    keys = ["heldout_top", "heldout_target_top", "heldout_solved", "stream_first_half", "stream_second_half",
            "stream_verified"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, seeds in rows.items():
        lines += [f"| {name} | {seed} | " + " | ".join(fraction(row[k]) for k in keys) + " |"
                  for seed, row in sorted(seeds.items())]
    lines += ["", f"Held-out goals only `{method}` or only `{base}` solved (same seed), and how many the top hit explains "
              "(gained: the method opened the top hit, the goal's product, where the base opened another result; "
              "lost: the method opened the top hit and the goal's product was lower).", "",
              "| seed | gained | by the top hit | lost | by the top hit |", "|---|---|---|---|---|"]
    lines += [f"| {seed} | {g['gained']} | {g['gained_top_hit']} | {g['lost']} | {g['lost_top_hit']} |"
              for seed, g in sorted(gains.items())]
    return "\n".join(lines) + "\n"


@dataclass
class ClicksArgs:
    """Which search result the agent opens, per run of a WebShop report archive."""

    runs: str
    """The report's archive (``<method>/<seed>.jsonl.gz`` and ``.heldout.jsonl.gz``)."""
    out: str
    """The markdown table to write."""
    method: str = "ascent"
    """The method paired with the base in the gains table."""
    base: str = "base"
    """The base run of the same seed."""
    data_dir: str | None = None
    """WebShop data (None: ``$WEBSHOP_DATA``, else ../shared/data/webshop)."""


def main(argv: list[str] | None = None) -> Path:
    args = parse_options(ClicksArgs, argv, prog="python -m lit_ascent.results.webshop_clicks")
    index = catalog(resolve_data_dir(args.data_dir))[1]
    streams, heldout = load_archive(Path(args.runs)), load_archive(Path(args.runs), HELDOUT_SUFFIX)
    ends = {m: {s: heldout_end(recs)[0] for s, recs in seeds.items()} for m, seeds in heldout.items()}
    rows = {m: {s: run_row(streams.get(m, {}).get(s, []), ends[m][s], index.search) for s in seeds}
            for m, seeds in ends.items() if m in (args.method, args.base)}
    gains = {s: gains_by_top_hit(ends[args.method][s], ends[args.base][s], index.search)
             for s in ends.get(args.method, {}) if s in ends.get(args.base, {})}
    out = Path(args.out)
    out.write_text(f"Which search result the agent opens first, from `{args.runs}` (lit_ascent/results/webshop_clicks.py: "
                   "the recorded actions replayed against the shop's own search).\n\n"
                   + clicks_markdown(rows, gains, args.method, args.base))
    print(out.read_text())
    return out


if __name__ == "__main__":
    main()
