"""The per-task hand-off from the module to the callbacks: one ``TaskOutcome`` per task of the stream.

``OaTTTModule.training_step`` builds it and passes it explicitly, in this order:

1. ``EpisodeCallback.on_episode`` of every episode callback (``trainer.callbacks`` order), after the
   rollout and before the update: a callback may veto the update (``episode.trainable``), change
   what the teacher sees (``episode.pi_valid_only``) or add diagnostics measured with the weights
   that acted;
2. the update (``outcome.stats``);
3. ``EpisodeCallback.on_after_update``: values that depend on the update (stream statistics);
4. ``finish()``: the task's JSON record is built, with every diagnostic the hooks added.

``training_step`` returns ``{"outcome": outcome}``, so every callback's ``on_train_batch_end``
receives the finished outcome as ``outputs["outcome"]``; the readers there (experience log, report,
transcripts) see the same values in whatever order Lightning calls them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import lightning as L

from lit_ascent.trajectory import Episode


def task_record(episode: Episode, stats: dict, diagnostics: dict[str, float], dtype: str) -> dict[str, Any]:
    """The JSON record of one task: the episode's summary, the diagnostics, each turn's generated text
    (why no action parsed shows there), the weights' dtype (outcomes reproduce per dtype), the update's
    numbers and the timings; with an in-context memory, the block the episode was shown (``memory_text``)."""
    memory = {"memory_text": episode.memory["text"]} if episode.memory is not None else {}
    return {**episode.summary(), **diagnostics, **memory, "texts": [turn.text for turn in episode.turns], "dtype": dtype,
            "updates": stats.get("updates", 0),
            "loss": {k: v for k, v in stats.items() if k.startswith("loss/")},
            "update": {k: v for k, v in stats.items() if k.startswith(("update/", "replay/"))},
            "timings": {**episode.timings, "update_s": stats.get("perf/update_s", 0.0)}}


@dataclass
class TaskOutcome:
    """One task of the stream: its episode, what the update did, the diagnostics and the record."""

    episode: Episode
    """The episode the policy played (or playback replayed) on the task."""
    dtype: str
    """The policy's weight dtype when it acted (``float32``, ``bfloat16``, ...)."""
    stats: dict[str, Any] = field(default_factory=dict)
    """The update's numbers (``OaTTTModule.learn``): ``updates``, ``loss/*``, ``update/*``, ``replay/*``,
    ``perf/update_s``; empty until the update ran."""
    diagnostics: dict[str, float] = field(default_factory=dict)
    """Values the episode callbacks add (first-token entropy, drift, stream statistics), in the order added."""
    record: dict[str, Any] | None = None
    """The task's JSON record (the experience log's line), built by ``finish()`` after every hook."""

    def finish(self) -> dict[str, Any]:
        """Build (and return) the record from the episode, the update and the diagnostics."""
        self.record = task_record(self.episode, self.stats, self.diagnostics, self.dtype)
        return self.record


class EpisodeCallback(L.Callback):
    """A callback the module hands each task's ``TaskOutcome`` to, inside the task's training step.

    Both hooks run before the task's record is built, so what they add to ``outcome.diagnostics``
    is in it. ``OaTTTModule`` finds these callbacks by type among ``trainer.callbacks``.
    """

    def on_episode(self, trainer, pl_module, outcome: TaskOutcome) -> None:
        """After the rollout, before the update: inspect or annotate the episode (e.g. veto the update)."""

    def on_after_update(self, trainer, pl_module, outcome: TaskOutcome) -> None:
        """After the update (``outcome.stats`` is set), before the record is built."""
