"""Per-task records of a stream: reading an experience log back, and the rates over records.

A record is one JSON object per task (``TaskOutcome.record``, ``lit_ascent/outcome.py``): at least
``task_index``, ``verified``, ``turns`` and ``invalid``. One rule gives the success, turns and
invalid-action rates of the stream's summary, the held-out and transfer evaluations, the probes and
the reports. Plain Python, no torch: the results tooling reads logs without it.
"""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The JSON objects of a ``.jsonl`` (or gzipped ``.jsonl.gz``) log, in file order.

    Blank lines are ignored; a last line that is not a complete object (a crash mid-write, the line's
    newline never written) is dropped. A proper prefix of a JSON object never parses, so a complete last
    line is kept with or without its newline.
    """
    with (gzip.open if Path(path).suffix == ".gz" else open)(path, "rb") as f:
        lines = [line for line in f.read().split(b"\n") if line.strip()]
    rows = [json.loads(line) for line in lines[:-1]]
    if lines:
        try:
            rows.append(json.loads(lines[-1]))
        except json.JSONDecodeError:
            pass  # the partial line of an interrupted write
    return rows


def read_records(path: str | os.PathLike) -> list[dict]:
    """One run's records in stream order, from an experience log (``read_jsonl``)."""
    return sorted(read_jsonl(path), key=lambda r: r["task_index"])


def record_rates(records: list[dict]) -> dict[str, float]:
    """success_rate, mean turns per task and invalid-action rate (invalid actions / turns) of records
    with ``verified``, ``turns``, ``invalid`` (``Episode.summary()``); 0 for no records or no turns.
    Where the environment grades episodes (a ``score``, e.g. WebShop's reward), also ``mean_score``: the
    mean over all records, an episode that ended without a score (turn limit, error) counting 0."""
    n = max(len(records), 1)
    turns = sum(r["turns"] for r in records)
    rates = {
        "success_rate": sum(r["verified"] for r in records) / n,
        "turns": turns / n,
        "invalid_rate": sum(r["invalid"] for r in records) / max(turns, 1),
    }
    if any(r.get("score") is not None for r in records):
        rates["mean_score"] = sum(r.get("score") or 0.0 for r in records) / n
    return rates


def outcome_rates(episodes: list) -> dict[str, float]:
    """``record_rates`` of a set of episodes."""
    return record_rates([{"verified": e.verified, "turns": len(e.turns), "invalid": e.num_invalid, "score": e.score}
                         for e in episodes])


def summarize(records: list[dict]) -> dict[str, float]:
    """Stream summary from per-task records (verified, turns, invalid, updates): ``record_rates`` over
    the stream (``mean_score`` where it has one), the success rate of its second half, and the optimiser
    steps taken."""
    rates = record_rates(records)
    summary = {
        "tasks": len(records),
        "success_rate": rates["success_rate"],
        "second_half_success_rate": record_rates(records[len(records) // 2:])["success_rate"],
        "mean_turns": rates["turns"],
        "invalid_rate": rates["invalid_rate"],
        "updates": sum(r["updates"] for r in records),
    }
    if "mean_score" in rates:
        summary["mean_score"] = rates["mean_score"]
    return summary
