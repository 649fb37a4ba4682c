"""Transfer evaluation: the current adapter, frozen, on a fixed task set of another env."""
from __future__ import annotations

from callbacks.base import PeriodicEval
from lit_ascent.envs.base import TextEnv
from lit_ascent.evaluate import evaluate
from lit_ascent.records import outcome_rates
from lit_ascent.stream_order import stream_tasks
from lit_ascent.trajectory import Task


def fixed_tasks(env: TextEnv, num_tasks: int | None, seed: int) -> list[Task]:
    """A seeded, fixed subset of ``env``'s tasks, with per-task reset seeds (as the stream does)."""
    return stream_tasks(env.tasks(), num_tasks, seed)


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
