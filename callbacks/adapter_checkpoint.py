"""Save the LoRA fast weights in PEFT format (safetensors)."""
from __future__ import annotations

import lightning as L

from callbacks.base import run_dir


class AdapterCheckpoint(L.Callback):
    """Writes ``adapter/task-XXXXX`` every k tasks and ``adapter/final`` at the end.

    Load one with ``PeftModel.from_pretrained(base_model, path)``.
    """

    def __init__(self, every_n_tasks: int = 0, dirname: str = "adapter"):
        """
        Args:
            every_n_tasks: Save every k tasks (0: only at the end of the stream).
            dirname: Folder inside the run folder.
        """
        if every_n_tasks < 0:
            raise ValueError(f"adapter_checkpoint.every_n_tasks must be >= 0, got {every_n_tasks}")
        self.every_n_tasks, self.dirname = every_n_tasks, dirname

    def save(self, trainer, pl_module, name: str) -> None:
        if trainer.global_rank == 0:
            path = run_dir(trainer) / self.dirname / name
            pl_module.policy.save_adapter(path)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        k = self.every_n_tasks
        if k and (batch[0].index + 1) % k == 0:
            self.save(trainer, pl_module, f"task-{batch[0].index + 1:05d}")

    def on_train_end(self, trainer, pl_module) -> None:
        self.save(trainer, pl_module, "final")
