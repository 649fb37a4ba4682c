"""What a cycles run (``lit_ascent.cycles``) writes to its ``log_dir`` and reads back to resume.

- ``cycles.jsonl``: one row per cycle (deployed and PI-conditioned success, diagnostics, update metrics);
- ``tasks.jsonl``: one row per task and cycle, for the deployment (``kind: deployed``) and the
  PI-conditioned probe (``kind: probe``): the outcomes a paired comparison of two runs needs;
- TensorBoard scalars (per cycle and per update);
- ``cycle_state.pt``, written after every finished cycle: the fast weights, AdamW's moments, the rows so
  far, the probe set and the drift probes. A run resumed from it repeats nothing and gives the rows of
  an uninterrupted one: deployment is greedy and each cycle's batches come from ``Random(seed + cycle)``.
"""
from __future__ import annotations

import json
from pathlib import Path

from lit_ascent.checkpoint_io import read_checkpoint, save_atomic
from lit_ascent.records import read_jsonl
from lit_ascent.trajectory import Episode

STATE_NAME, FORMAT = "cycle_state.pt", 1


def task_rows(cycle: int, kind: str, episodes: list[Episode]) -> list[dict]:
    """One row per episode: the cycle, ``kind`` (deployed | probe), the task and its outcome."""
    return [{"cycle": cycle, "kind": kind, "task_id": e.task.task_id, "verified": bool(e.verified),
             "turns": len(e.turns), "invalid": e.num_invalid, "actions": e.actions} for e in episodes]


class CycleLog:
    """The run's rows and scalars. A resumed run (``finished`` >= 0, its last checkpointed cycle) keeps the
    rows of cycles up to ``finished`` and drops later ones (a cycle stopped before its checkpoint, which the
    resumed run plays again); a fresh run starts the files empty."""

    def __init__(self, log_dir: str | Path, finished: int = -1):
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(log_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(str(self.dir))
        self.path, self.tasks_path = self.dir / "cycles.jsonl", self.dir / "tasks.jsonl"
        for path in (self.path, self.tasks_path):
            kept = [r for r in read_jsonl(path) if r["cycle"] <= finished] if finished >= 0 and path.is_file() else []
            path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def scalars(self, metrics: dict, step: int) -> None:
        for k, v in metrics.items():
            if "/" in k and isinstance(v, (int, float)):
                self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def row(self, record: dict, tasks: list[dict]) -> None:
        self.scalars(record, record["cycle"])
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        with open(self.tasks_path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in tasks)

    def task_rows_of(self, source: int, cycle: int) -> list[dict]:
        """The task rows written for cycle ``source``, relabelled as cycle ``cycle`` (a carried row's)."""
        return [{**r, "cycle": cycle} for r in read_jsonl(self.tasks_path) if r["cycle"] == source]

    def close(self) -> None:
        self.writer.close()


def save_state(log_dir: str | Path, state: dict) -> None:
    """``state`` (plain values and tensors) to ``log_dir/cycle_state.pt``, atomically."""
    save_atomic({"format": FORMAT, **state}, Path(log_dir) / STATE_NAME)


def load_state(log_dir: str | Path, config: str) -> dict | None:
    """The state of the last finished cycle in ``log_dir``, or None when there is none. ``config`` (the run's
    dumped config) must equal the one the state was written with: a changed setting fails, named."""
    path = Path(log_dir) / STATE_NAME
    if not path.is_file():
        return None
    state = read_checkpoint(path, FORMAT, "resume", "cycles checkpoint")
    if state["config"] != config:
        raise ValueError(f"resume: the config differs from the one {str(path)!r} was written with; "
                         f"resume with the same settings or use a new log_dir")
    return state
