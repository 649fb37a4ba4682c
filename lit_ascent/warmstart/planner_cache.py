"""Cache ALFWorld planner demonstrations as JSONL (training games only).

    python -m lit_ascent.warmstart.planner_cache --split valid_train --out demos.jsonl [--limit N]

One line per game: ``{"game", "family", "actions", "observations", "won", "cpu_s"}``.
The file is written append-only and flushed per game, so an interrupted run resumes
where it stopped (a partial last line is dropped and redone). Evaluation splits are
refused: their planner solutions must never reach training.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lit_ascent.envs.alfworld import ALFWorldEnv
from lit_ascent.options import parse_options

DEMO_SPLITS = ("valid_train",)


def load_done(out: Path) -> set[str]:
    """Games already in ``out``; a partial (unparseable) last line is dropped from the file."""
    if not out.exists():
        return set()
    data = out.read_bytes()
    lines = [line for line in data.split(b"\n") if line.strip()]
    done, good = set(), []
    for k, line in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if k + 1 < len(lines):
                raise ValueError(f"{out}: corrupt record {k + 1} of {len(lines)} (not the last one)") from None
            break  # an interrupted write: redo that game
        done.add(record["game"])
        good.append(line + b"\n")
    clean = b"".join(good)
    if clean != data:
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_bytes(clean)
        os.replace(tmp, out)
    return done


def write_demos(out: str | Path, split: str = "valid_train", limit: int | None = None,
                data_root: str | None = None, log=sys.stderr) -> int:
    """Append the planner's demonstration of every missing game; return how many were written."""
    if split not in DEMO_SPLITS:
        raise ValueError(
            f"demos: split {split!r} refused: demonstrations are only cached for {DEMO_SPLITS} "
            "(valid_seen / valid_unseen are evaluation streams; their solutions must not reach training)"
        )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = ALFWorldEnv(split=split, data_root=data_root)
    tasks = env.tasks()[:limit]
    done = load_done(out)
    written = 0
    with open(out, "a") as f:
        for k, task in enumerate(tasks):
            if task.task_id in done:
                continue
            start = time.process_time()
            demo = env.expert_demo(task)
            cpu_s = time.process_time() - start
            record = {"game": task.task_id, "family": task.info()["family"], "actions": demo.actions,
                      "observations": demo.observations, "won": demo.won, "cpu_s": round(cpu_s, 2)}
            f.write(json.dumps(record) + "\n")
            f.flush()
            written += 1
            if log is not None:
                print(f"[{k + 1}/{len(tasks)}] won={demo.won} steps={len(demo.actions)} cpu={cpu_s:.1f}s "
                      f"{task.task_id}", file=log, flush=True)
    return written


@dataclass
class PlannerCacheOptions:
    """The command line of ``python -m lit_ascent.warmstart.planner_cache``."""

    out: str
    """Output JSONL file (appended to, resumable)."""
    split: str = "valid_train"
    """Game split (only valid_train is allowed)."""
    limit: int | None = None
    """Only the first N games of the split."""
    data_root: str | None = None
    """Folder holding json_2.1.1/ (None: see ALFWorldEnv)."""

    def __post_init__(self) -> None:
        if self.split not in DEMO_SPLITS:
            raise ValueError(f"--split {self.split!r} refused: planner demonstrations are only cached for "
                             f"{', '.join(DEMO_SPLITS)}; valid_seen / valid_unseen are evaluation streams")
        if self.limit is not None and self.limit < 1:
            raise ValueError("--limit must be >= 1")


def main(argv: list[str] | None = None) -> int:
    args = parse_options(PlannerCacheOptions, argv, prog="python -m lit_ascent.warmstart.planner_cache",
                         description=__doc__.split("\n")[0])
    written = write_demos(args.out, args.split, args.limit, args.data_root)
    print(f"wrote {written} demonstrations to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
