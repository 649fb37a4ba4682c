"""PI-conditioned success probe (ReSAIL): the model acting WITH the privileged
information in its context vs WITHOUT, on a fixed probe set of tasks.

Deployed success alone can hide a collapse of the teacher's competence; this
probe tracks it separately (METHOD.md section 3).
"""
from __future__ import annotations

import json
from pathlib import Path

from callbacks.base import EpisodeCallback, PeriodicEval
from lit_ascent.envs.base import TextEnv
from lit_ascent.evaluate import evaluate
from lit_ascent.privileged import PI_CONTENTS, render_actions, render_privileged
from lit_ascent.records import outcome_rates
from lit_ascent.trajectory import Task


def load_demonstrations(path: str | Path, env_name: str, limit: int) -> list[tuple[Task, str]]:
    """(task, PI text) of the first ``limit`` successful demonstrations in a JSONL file.

    A line is {"task_id" or "game": ..., "actions": [...], "seed": 0, "won": true} (the
    format of ``lit_ascent.warmstart.planner_cache``; "seed" and "won" optional, lines with won=false skipped).
    """
    probe = []
    with open(path) as f:
        for line in f:
            if not line.strip() or len(probe) >= limit:
                continue
            rec = json.loads(line)
            if not rec.get("won", True):
                continue
            task_id = str(rec["task_id"] if "task_id" in rec else rec["game"])
            task = Task(rec.get("env", env_name), task_id, seed=int(rec.get("seed", 0)))
            probe.append((task, render_actions(list(rec["actions"]))))
    return probe


class PIProbe(PeriodicEval, EpisodeCallback):
    """Every k tasks (and at the end), run the current model on the probe tasks with and
    without their PI; logs ``probe/pi_success``, ``probe/plain_success``, ``probe/size``.

    The probe set is read from ``demonstrations`` (JSONL) or else filled with the
    (task, rendered PI) of the stream's first ``num_tasks`` verified episodes. The
    model is only evaluated (no_grad, no update), in its own env instance.
    """

    def __init__(self, every_n_tasks: int = 10, num_tasks: int = 8, demonstrations: str | None = None,
                 pi_content: str = "reasoning_actions", env: TextEnv | None = None,
                 filename: str | None = "probe.jsonl"):
        """
        Args:
            every_n_tasks: Probe every k stream tasks (0: only at the end).
            num_tasks: Size of the probe set (>= 1).
            demonstrations: JSONL of {task_id | game, actions[, seed, won]}; None: the stream's verified episodes.
            pi_content: PI rendered from stream episodes: actions | reasoning_actions | full.
            env: Env instance for the probe (None: ``fresh()`` of the stream's env, made before use).
            filename: JSONL file in the run folder (None: loggers only).
        """
        if every_n_tasks < 0:
            raise ValueError(f"probe.every_n_tasks must be >= 0, got {every_n_tasks}")
        if num_tasks < 1:
            raise ValueError(f"probe.num_tasks must be >= 1, got {num_tasks}")
        if pi_content not in PI_CONTENTS:
            raise ValueError(f"probe.pi_content must be one of {PI_CONTENTS}, got {pi_content!r}")
        if demonstrations and not Path(demonstrations).is_file():
            raise ValueError(f"probe.demonstrations: no file at {demonstrations!r}")
        super().__init__(every_n_tasks, filename)
        self.num_tasks, self.demonstrations, self.pi_content, self.env = num_tasks, demonstrations, pi_content, env
        self.probe: list[tuple[Task, str]] = []

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.env is None:  # copied before the stream touches it: a clean, separate instance
            self.env = trainer.datamodule.env.fresh()
        if self.demonstrations and not self.probe:
            self.probe = load_demonstrations(self.demonstrations, self.env.name, self.num_tasks)

    def on_episode(self, trainer, pl_module, outcome) -> None:
        episode = outcome.episode
        if self.demonstrations or not episode.verified or len(self.probe) >= self.num_tasks:
            return
        self.probe.append((episode.task, render_privileged(episode.turns, self.pi_content, valid_only=True)))

    def measure(self, trainer, pl_module) -> dict[str, float] | None:
        if not self.probe:
            return None
        tasks, texts = [t for t, _ in self.probe], [z for _, z in self.probe]
        policy, cfg = pl_module.policy, pl_module.rollout_cfg
        with_pi = outcome_rates(evaluate(policy, self.env, tasks, cfg, texts))
        plain = outcome_rates(evaluate(policy, self.env, tasks, cfg))
        return {"probe/pi_success": with_pi["success_rate"], "probe/plain_success": plain["success_rate"],
                "probe/size": float(len(tasks))}

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self.env is not None:
            self.env.close()
