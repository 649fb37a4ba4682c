"""Each task's transcript in TensorBoard's Text tab, and the run's settings in its HParams tab."""
from __future__ import annotations

import lightning as L
from lightning.pytorch.cli import SaveConfigCallback

from lit_ascent.transcript import render


def text_writers(trainer) -> list:
    """The loggers' writers that take text (TensorBoard's ``SummaryWriter.add_text``)."""
    writers = [getattr(logger, "experiment", None) for logger in trainer.loggers]
    return [w for w in writers if hasattr(w, "add_text")]


class EpisodeTranscripts(L.Callback):
    """Logs ``transcript/task_NNNN``: the episode as markdown (task, each turn's thought, action and
    observation with invalid turns marked, verdict, the update's numbers, diagnostics).

    One tag per task, so TensorBoard keeps every task's text (it samples a tag's steps).
    The diagnostics are those of the task's outcome, complete before any ``on_train_batch_end``.
    """

    def __init__(self, enabled: bool = True, max_chars: int = 2000):
        """
        Args:
            enabled: Log the transcripts (loggers without text, e.g. CSV, are skipped anyway).
            max_chars: Each text (task, turn, observation) is cut to this many characters, the cut noted.
        """
        if max_chars < 1:
            raise ValueError(f"transcripts.max_chars must be >= 1, got {max_chars}")
        self.enabled, self.max_chars = enabled, max_chars

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.enabled or trainer.global_rank != 0:
            return
        outcome = outputs["outcome"]
        episode = outcome.episode
        text = render(episode, outcome.stats, self.max_chars, outcome.diagnostics)
        for writer in text_writers(trainer):
            writer.add_text(f"transcript/task_{episode.task.index:04d}", text, global_step=episode.task.index)


def flat_settings(config: dict, prefix: str = "") -> dict[str, object]:
    """A nested config as ``{"model.optim.lr": 1e-4, ...}``: numbers, strings and booleans kept,
    a list as its items' strings joined by commas, anything else (None, paths) as its string (what
    TensorBoard's HParams tab can show)."""
    out: dict[str, object] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_settings(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return out


class LoggedConfig(SaveConfigCallback):
    """Saves ``config.yaml`` (as Lightning does) and gives the loggers the run's settings as
    hyperparameters; at the end of the stream ``hp_metric`` becomes the stream's success rate,
    so TensorBoard's HParams tab compares runs by their settings and outcome."""

    def save_config(self, trainer, pl_module, stage: str) -> None:
        settings = flat_settings(self.config.clone().as_dict())
        for logger in trainer.loggers:
            logger.log_hyperparams(settings)

    def on_train_end(self, trainer, pl_module) -> None:
        tasks = pl_module.success_rate.update_count
        if trainer.global_rank != 0 or not tasks:
            return
        for logger in trainer.loggers:
            logger.log_metrics({"hp_metric": float(pl_module.success_rate.compute())}, step=tasks)
