"""One JSONL line per task, appended and flushed as the stream goes.

The line is the task's record (``TaskOutcome.record``, built once by the module after every episode
callback added its diagnostics); ``lit_ascent.records.read_records`` reads the log back.
The log is append-only. Its state for a resumed stream is its byte offset at the
checkpoint; on resume, everything after it (a partial last line from a crash,
or lines of tasks the checkpoint does not cover) is cut, and those tasks are redone.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import lightning as L

from callbacks.base import run_dir

log = logging.getLogger(__name__)


def truncate_log(path: Path, offset: int) -> int:
    """Cut the log at ``offset`` bytes (the checkpoint's); returns how many bytes were dropped."""
    size = path.stat().st_size if path.exists() else 0
    if size < offset:
        raise RuntimeError(f"experience log {path} has {size} bytes, the checkpoint expects {offset}: "
                           "records of checkpointed tasks are missing, the run cannot be resumed exactly")
    with open(path, "ab") as f:
        f.truncate(offset)
        os.fsync(f.fileno())
    return size - offset


class ExperienceLog(L.Callback):
    """Appends {task, verified, turns, invalid, actions, diagnostics, texts, dtype, loss, update (absorbed
    fraction, replay), timings} per task; ``texts`` holds each turn's generated text (why no action parsed
    shows there)."""

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
        if trainer.global_rank != 0:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(outputs["outcome"].record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def state_dict(self) -> dict:
        return {"offset": self.path.stat().st_size if self.path and self.path.exists() else 0}

    def load_state_dict(self, state: dict) -> None:
        dropped = truncate_log(self.path, state["offset"])
        if dropped:
            log.warning("experience log: dropped %d bytes written after the checkpoint", dropped)
