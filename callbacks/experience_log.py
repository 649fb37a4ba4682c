"""One JSONL line per task, appended and flushed as the stream goes.

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

log = logging.getLogger(__name__)


def run_dir(trainer) -> Path:
    """The run's folder (the logger's version dir, else the trainer's root dir)."""
    return Path(trainer.log_dir or trainer.default_root_dir)


def read_experience(path: str | os.PathLike) -> list[dict]:
    """The complete records of a log; a partial last line (a crash mid-write) is dropped."""
    lines = Path(path).read_bytes().split(b"\n")
    return [json.loads(line) for line in lines[:-1] if line.strip()]  # the last piece has no newline


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
    """Appends {task, verified, turns, invalid, actions, texts, dtype, loss, update (absorbed fraction,
    replay), timings} per task; ``texts`` holds each turn's generated text (why no action parsed shows there)."""

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
        record = {**episode.summary(), "texts": [turn.text for turn in episode.turns],
                  "dtype": str(pl_module.policy.model.dtype).removeprefix("torch."),  # outcomes reproduce per dtype
                  "updates": stats.get("updates", 0),
                  "loss": {k: v for k, v in stats.items() if k.startswith("loss/")},
                  "update": {k: v for k, v in stats.items() if k.startswith(("update/", "replay/"))},
                  "timings": {**episode.timings, "update_s": stats.get("perf/update_s", 0.0)}}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def state_dict(self) -> dict:
        return {"offset": self.path.stat().st_size if self.path and self.path.exists() else 0}

    def load_state_dict(self, state: dict) -> None:
        dropped = truncate_log(self.path, state["offset"])
        if dropped:
            log.warning("experience log: dropped %d bytes written after the checkpoint", dropped)
