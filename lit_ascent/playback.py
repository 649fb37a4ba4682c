"""Learn from a recorded stream instead of acting: each task's episode is the one an earlier run logged.

With ``model.playback.log`` set, the stream does not generate: for each task the turns' texts of that
task's record in the log (an ``experience.jsonl`` or an archived ``.jsonl.gz`` of a run on the same
stream) go through the environment again (``lit_ascent.replay``: the rollout's own bookkeeping, the
environment's own verdict), and the episode goes to the callbacks and the update as a generated one
would. Every other part of the run is unchanged: the update step, replay, diagnostics, the held-out
evaluation, the logs and the checkpoint (playback holds no state, so a resumed run is exact).

Its use is a cheap proxy for an update regime: the base stream's verified episodes, distilled in
stream order with the regime's budget, then the held-out evaluation of the frozen fast weights, for a
few minutes of updates instead of a whole stream of rollouts. The episodes are the base model's own
(off-policy once the weights move), and a turn ends with the end-of-turn token even where the recorded
generation ran out of budget. The stream's success figures of such a run are the log's, not the adapted
model's: read its held-out table.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from lit_ascent.envs.base import TextEnv
from lit_ascent.records import read_records
from lit_ascent.replay import replay
from lit_ascent.rollout import EpisodeRun, RolloutConfig
from lit_ascent.trajectory import Episode, Task

log = logging.getLogger(__name__)


@dataclass
class PlaybackConfig:
    """Episodes from a recorded run instead of rollouts (``lit_ascent.playback``)."""

    log: str | None = None
    """Experience log (``experience.jsonl`` or archived ``.jsonl.gz``) of a run on the same stream; None: act."""


class Playback:
    """The recorded turns of each task of ``log``, by ``task_id``; the file is checked when built."""

    def __init__(self, path: str):
        file = Path(path).expanduser()
        if not file.is_file():
            raise ValueError(f"model.playback.log: no file {path!r}")
        records = read_records(file)
        old = [r["task_id"] for r in records if "texts" not in r]
        if old:
            raise ValueError(f"model.playback.log {path}: {len(old)} of {len(records)} records have no turn texts "
                             "(a log written before they were logged); run the stream again to record them")
        self.path = str(file)
        self.records = {r["task_id"]: r for r in records}
        self.mismatches = 0

    def check(self, tasks: list[Task]) -> None:
        """Raise ValueError, before the first task, when the log lacks any of the stream's ``tasks``."""
        missing = [t.task_id for t in tasks if t.task_id not in self.records]
        if missing:
            raise ValueError(f"model.playback.log {self.path} has no record of {len(missing)} of the stream's "
                             f"{len(tasks)} tasks (first: {missing[0]!r}): it must come from a run on the same "
                             "stream (data.env, data.seed, at least data.num_tasks tasks)")

    def episode(self, tokenizer, env: TextEnv, task: Task) -> Episode:
        """``task``'s recorded turns replayed through ``env``; a verdict that differs from the log's is
        counted (``mismatches``) and warned about (the environment or its data changed since)."""
        record = self.records[task.task_id]  # every stream task is there (``check``)
        texts = record["texts"]
        ep = replay(tokenizer, env, task, texts) if texts else EpisodeRun(tokenizer, env, task, RolloutConfig()).finish()
        if ep.verified != record["verified"] or len(ep.turns) != record["turns"]:
            self.mismatches += 1
            log.warning("playback: task %s replays to verified=%s in %d turns, the log says verified=%s in %d",
                        task.task_id, ep.verified, len(ep.turns), record["verified"], record["turns"])
        ep.timings["playback_mismatches"] = float(self.mismatches)
        return ep
