"""Transfer evaluation: the current adapter, frozen, on a fixed task set of another env."""
from __future__ import annotations

import json
import random
from dataclasses import replace

import lightning as L

from callbacks.experience_log import run_dir
from datamodules.stream import stream_order
from lit_ascent.envs.base import TextEnv
from lit_ascent.evaluate import evaluate, outcome_rates
from lit_ascent.trajectory import Task


def fixed_tasks(env: TextEnv, num_tasks: int | None, seed: int) -> list[Task]:
    """A seeded, fixed subset of ``env``'s tasks, with per-task reset seeds (as the stream does)."""
    ordered = stream_order(env.tasks(), seed)
    ordered = ordered[:num_tasks] if num_tasks else ordered
    rng = random.Random(seed + 1)
    return [replace(t, index=i, seed=rng.randrange(2**31)) for i, t in enumerate(ordered)]


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


class TransferEval(PeriodicEval):
    """Every k tasks and at the end of the stream, evaluate the adapter as it is (no
    updates, no copy) on a fixed subset of its own env, e.g. ALFWorld valid_unseen.

    Logs ``transfer/success_rate``, ``transfer/turns``, ``transfer/invalid_rate``.
    """

    def __init__(self, env: TextEnv, every_n_tasks: int = 0, num_tasks: int | None = None, seed: int = 0,
                 filename: str | None = "transfer.jsonl"):
        """
        Args:
            env: The transfer environment (its own instance, never the stream's).
            every_n_tasks: Evaluate every k stream tasks (0: only at the end of the stream).
            num_tasks: Size of the fixed evaluation subset (None: all of the env's tasks).
            seed: Seed of the subset's order and of the tasks' reset seeds.
            filename: JSONL file in the run folder (None: loggers only).
        """
        if every_n_tasks < 0:
            raise ValueError(f"transfer.every_n_tasks must be >= 0, got {every_n_tasks}")
        if num_tasks is not None and num_tasks < 1:
            raise ValueError(f"transfer.num_tasks must be >= 1 or null, got {num_tasks}")
        super().__init__(every_n_tasks, filename)
        self.env, self.num_tasks, self.seed = env, num_tasks, seed
        self.tasks: list[Task] = []

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not self.tasks:
            self.tasks = fixed_tasks(self.env, self.num_tasks, self.seed)

    def measure(self, trainer, pl_module) -> dict[str, float]:
        episodes = evaluate(pl_module.policy, self.env, self.tasks, pl_module.rollout_cfg)
        return {f"transfer/{k}": v for k, v in outcome_rates(episodes).items()}

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.env.close()
