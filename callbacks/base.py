"""What the callbacks share: the run folder, the episode-callback base class and periodic evaluation.

``EpisodeCallback`` is defined beside the hand-off it receives (``lit_ascent/outcome.py``), so the
module can find episode callbacks without importing this package; callbacks import it from here.
"""
from __future__ import annotations

import json
from pathlib import Path

import lightning as L

from lit_ascent.outcome import EpisodeCallback

__all__ = ["EpisodeCallback", "PeriodicEval", "record_metrics", "run_dir"]


def run_dir(trainer) -> Path:
    """The run's folder (the logger's version dir, else the trainer's root dir)."""
    return Path(trainer.log_dir or trainer.default_root_dir)


def record_metrics(trainer, metrics: dict[str, float], step: int, filename: str | None = None) -> None:
    """Send ``metrics`` to every logger at ``step`` (works outside training_step, e.g. at the end)
    and append them as one JSONL line in the run folder."""
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)
        logger.save()
    if filename and trainer.global_rank == 0:
        path = run_dir(trainer) / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps({"tasks_seen": step, **metrics}) + "\n")


class PeriodicEval(L.Callback):
    """Runs ``measure`` every ``every_n_tasks`` stream tasks and at the end (once per point),
    and records its metrics to the loggers and ``filename``."""

    def __init__(self, every_n_tasks: int, filename: str | None):
        self.every_n_tasks, self.filename = every_n_tasks, filename
        self.history: list[dict] = []
        self._tasks_seen, self._last_step = 0, -1

    def measure(self, trainer, pl_module) -> dict[str, float] | None:
        raise NotImplementedError(f"{type(self).__name__} must implement measure()")

    def evaluate(self, trainer, pl_module) -> dict[str, float] | None:
        if self._last_step == self._tasks_seen:  # already done at this point of the stream
            return self.history[-1] if self.history else None
        metrics = self.measure(trainer, pl_module)
        if metrics is None:
            return None
        record_metrics(trainer, metrics, self._tasks_seen, self.filename)
        self.history.append(metrics)
        self._last_step = self._tasks_seen
        return metrics

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._tasks_seen = batch[0].index + 1
        k = self.every_n_tasks
        if k and self._tasks_seen % k == 0:
            self.evaluate(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self.evaluate(trainer, pl_module)
