"""Does a stream reproduce? Task-by-task agreement of two experience logs of the same stream.

    python -m lit_ascent.results.reproduce docs/results/textcraft_efficacy/runs/base/seed1.jsonl.gz \
        runs/repro/textcraft_float32/seed1/experience.jsonl --labels committed float32

Two records agree on the outcome when both verified or both failed, and on the trajectory when
every action is the same; for a differing trajectory the first turn whose action differs is
given (greedy decoding: once one token differs, the rest of the episode follows another path).
Tasks are matched by stream position and must have the same task id.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lit_ascent.options import options_parser, parse_options
from lit_ascent.results.paired import Records
from lit_ascent.records import read_records

PROG = "python -m lit_ascent.results.reproduce"


def first_difference(a: list, b: list) -> int | None:
    """The first index where the two action lists differ (a shorter list differs where it ends); None if equal."""
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


def agreement(a: Records, b: Records) -> list[dict]:
    """Per task of the common prefix: id, the two outcomes and turn counts, same outcome, same actions,
    first differing turn (1-based, None when the actions are equal)."""
    rows = []
    for x, y in zip(a, b):
        if x["task_id"] != y["task_id"]:
            raise ValueError(f"task {x['task_index']}: {x['task_id']} vs {y['task_id']}: not the same stream")
        diff = first_difference(x["actions"], y["actions"])
        rows.append({"task_index": x["task_index"], "task_id": x["task_id"],
                     "a": (x["verified"], x["turns"]), "b": (y["verified"], y["turns"]),
                     "same_outcome": x["verified"] == y["verified"], "same_actions": diff is None,
                     "first_difference": None if diff is None else diff + 1})
    return rows


def table(rows: list[dict], labels: tuple[str, str]) -> str:
    """Markdown: one row per task, then the counts of equal outcomes and equal trajectories."""
    def outcome(v: tuple[bool, int]) -> str:
        return f"solved in {v[1]}" if v[0] else f"failed ({v[1]} turns)"

    lines = [f"| # | task | {labels[0]} | {labels[1]} | same actions | first different turn |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task_index']} | {r['task_id']} | {outcome(r['a'])} | {outcome(r['b'])} | "
                     f"{'yes' if r['same_actions'] else 'no'} | {r['first_difference'] or '-'} |")
    n = len(rows)
    lines += ["", f"same outcome: {sum(r['same_outcome'] for r in rows)}/{n}; "
                  f"same trajectory: {sum(r['same_actions'] for r in rows)}/{n}; "
                  f"solved: {labels[0]} {sum(r['a'][0] for r in rows)}/{n}, {labels[1]} {sum(r['b'][0] for r in rows)}/{n}"]
    return "\n".join(lines)


@dataclass
class ReproduceOptions:
    """The command line of ``python -m lit_ascent.results.reproduce``."""

    logs: list[Path] = field(metadata={"positional": True, "nargs": 2})
    """Two experience logs (.jsonl or archived .jsonl.gz)."""
    labels: list[str] = field(default_factory=lambda: ["a", "b"], metadata={"nargs": 2})
    """Column names of the two logs."""

    def __post_init__(self) -> None:
        for path in self.logs:
            if not path.is_file():
                raise ValueError(f"no such log: {path}")


def main(argv: list[str] | None = None) -> str:
    description = __doc__.split("\n")[0]
    args = parse_options(ReproduceOptions, argv, PROG, description)
    try:
        text = table(agreement(*(read_records(path) for path in args.logs)), tuple(args.labels))
    except ValueError as err:
        options_parser(ReproduceOptions, PROG, description).error(str(err))
    print(text)
    return text


if __name__ == "__main__":
    main()
