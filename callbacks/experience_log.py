"""One JSONL line per task, appended and flushed as the stream goes."""
from __future__ import annotations

import json
import os
from pathlib import Path

import lightning as L


def run_dir(trainer) -> Path:
    """The run's folder (the logger's version dir, else the trainer's root dir)."""
    return Path(trainer.log_dir or trainer.default_root_dir)


class ExperienceLog(L.Callback):
    """Appends {task, verified, turns, invalid, actions, loss, timings} per task."""

    def __init__(self, filename: str = "experience.jsonl"):
        """
        Args:
            filename: File name inside the run folder.
        """
        self.filename = filename
        self.path: Path | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        self.path = run_dir(trainer) / self.filename
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if pl_module.last is None or trainer.global_rank != 0:
            return
        episode, stats = pl_module.last
        record = {**episode.summary(), "updates": stats.get("updates", 0),
                  "loss": {k: v for k, v in stats.items() if k.startswith("loss/")},
                  "timings": {**episode.timings, "update_s": stats.get("perf/update_s", 0.0)}}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
