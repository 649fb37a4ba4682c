"""TaskStreamDataModule: a seeded, one-pass order of cheap task descriptors.

The stream yields ``Task`` records, never episodes: Lightning fetches the next
batch before the current step runs, so an episode generated here would use the
weights from before the previous update. The module generates each episode at
the start of its training step instead.
"""
from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader

from lit_ascent.envs.base import TextEnv
from lit_ascent.envs.guarded import GuardedEnv
from lit_ascent.stream_order import stream_tasks
from lit_ascent.trajectory import Task


class TaskStreamDataModule(L.LightningDataModule):
    """One pass over an environment's tasks, one attempt each."""

    def __init__(self, env: TextEnv, num_tasks: int | None = None, seed: int = 0, shuffle: bool = True,
                 balance_by: str | None = None, step_timeout_s: float = 300.0):
        """
        Args:
            env: The environment (tasks, prompt, verifier).
            num_tasks: Length of the stream (a prefix of the ordered tasks); None = all.
            seed: Seed of the order and of each task's reset seed.
            shuffle: Shuffle the task order (False keeps the environment's order).
            balance_by: Interleave tasks by this meta key (e.g. 'family') so prefixes are balanced.
            step_timeout_s: Seconds an environment reset/step may take; a fault or a hang fails
                that episode and the environment is rebuilt (0: no time limit, faults still caught).
        """
        super().__init__()
        if num_tasks is not None and num_tasks < 1:
            raise ValueError(f"data.num_tasks must be >= 1 or null, got {num_tasks}")
        self.env = GuardedEnv(env, step_timeout_s)
        self.num_tasks, self.seed = num_tasks, seed
        self.shuffle, self.balance_by = shuffle, balance_by
        self.stream: list[Task] = []
        self.start = 0
        """Stream cursor: the first task to run (set by ``StreamCheckpoint`` on resume)."""

    def setup(self, stage: str | None = None) -> None:
        if self.stream:
            return
        tasks = self.env.tasks()
        if self.num_tasks and self.num_tasks > len(tasks):
            rank_zero_warn(f"data.num_tasks={self.num_tasks} but {type(self.env.inner).__name__} offers "
                           f"{len(tasks)} tasks: the stream runs {len(tasks)}")
        self.stream = stream_tasks(tasks, self.num_tasks, self.seed, self.shuffle, self.balance_by)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.stream[self.start:], batch_size=1, shuffle=False, collate_fn=list, num_workers=0)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch  # task descriptors stay on the host; the rollout builds its own tensors

    def teardown(self, stage: str | None = None) -> None:
        self.env.close()
