"""Held-out evaluation: the fast weights, frozen, on a fixed task set the stream never shows,
paired task by task with the initial model.

At the end of the stream (and every ``every_n_tasks`` tasks) the policy plays
each held-out task once, greedily, with no update. The weights are cast to
``dtype`` (float32 by default) for the evaluation, so batched decoding gives the
same episodes as one-at-a-time decoding (``lit_ascent/evaluate.py``), and cast
back exactly afterwards. Before the first task the initial model (the adapter
disabled, ``Policy.teacher``) plays the same tasks once, so every run carries
its own paired base: the exact McNemar p and Newcombe's 95% interval for the
difference in success (``lit_ascent/results/paired.py``).

Per evaluation point, one JSONL line per task goes to ``heldout.jsonl`` in the
run folder (``model``: ``adapted`` | ``initial``, ``tasks_seen``, ``task_id``,
``verified``, ``turns``, ``invalid``), which ``python -m lit_ascent.results.report``
turns into its held-out table; the loggers get ``heldout/*`` metrics.
"""
from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from callbacks.base import PeriodicEval, record_metrics, run_dir
from callbacks.experience_log import truncate_log
from callbacks.transfer import fixed_tasks
from lit_ascent.envs.base import TextEnv
from lit_ascent.envs.guarded import GuardedEnv
from lit_ascent.evaluate import evaluate
from lit_ascent.records import read_records, record_rates
from lit_ascent.results.paired import paired_counts, paired_stats
from lit_ascent.trajectory import Episode, Task

log = logging.getLogger(__name__)
DTYPES = ("float32", "bfloat16", "float16")


@contextlib.contextmanager
def cast_weights(model: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Run the block with every floating-point parameter and buffer of ``model`` in ``dtype``.

    Each tensor's ``.data`` is swapped, so the parameter objects (those the
    optimiser holds) stay the same. Afterwards every tensor gets its own dtype
    back bit for bit: a widening cast (bf16/fp16 -> fp32) is undone by casting
    back, which is exact; for any other cast the original data is kept aside.
    """
    saved = []
    for t in [*model.parameters(), *model.buffers()]:
        if not t.is_floating_point() or t.dtype == dtype:
            continue
        widening = torch.finfo(dtype).bits > torch.finfo(t.dtype).bits
        saved.append((t, t.dtype, None if widening else t.data))
        t.data = t.data.to(dtype)
    try:
        yield
    finally:
        for t, original, kept in saved:
            t.data = kept if kept is not None else t.data.to(original)


def episode_records(episodes: list[Episode], model: str, tasks_seen: int) -> list[dict]:
    """One JSON-ready record per held-out episode."""
    return [{"model": model, "tasks_seen": tasks_seen, "task_index": e.task.index, "task_id": e.task.task_id,
             "verified": e.verified, "turns": len(e.turns), "invalid": e.num_invalid, "actions": e.actions,
             "error": e.error, "score": e.score}
            for e in episodes]


def heldout_metrics(adapted: list[dict], initial: list[dict]) -> dict[str, float]:
    """``heldout/*`` metrics of one evaluation point; paired with the initial model when it has records."""
    metrics = {f"heldout/{k}": v for k, v in record_rates(adapted).items()}
    if initial:
        counts = paired_counts(adapted, initial)
        stats = paired_stats(counts)
        metrics.update({"heldout/initial_success_rate": record_rates(initial)["success_rate"],
                        "heldout/only_adapted": float(counts["only_method"]),
                        "heldout/only_initial": float(counts["only_base"]),
                        "heldout/mcnemar_p": stats["p"],
                        "heldout/diff_low": stats["diff_low"], "heldout/diff_high": stats["diff_high"]})
    return metrics


def recorded_initial(path: str, tasks: list[Task]) -> list[dict]:
    """The initial model's records of ``tasks`` from an earlier run's held-out log (``heldout.initial_log``)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"heldout.initial_log: no file {path!r}")
    records = [r for r in read_records(file) if r["model"] == "initial"]
    got = sorted((r["task_index"], r["task_id"]) for r in records)
    want = sorted((t.index, t.task_id) for t in tasks)
    if got != want:
        raise ValueError(f"heldout.initial_log {path}: its initial-model records are {len(got)} tasks, not this run's "
                         f"{len(want)} held-out tasks at the same indices (heldout.env, num_tasks and seed must match "
                         "the run that wrote it, with include_initial: true)")
    return records


def check_disjoint(heldout: list[Task], stream: list[Task]) -> None:
    """Fail when a held-out task is also a stream task (same environment name and task id)."""
    seen = {(t.env, t.task_id) for t in stream}
    shared = [t.task_id for t in heldout if (t.env, t.task_id) in seen]
    if shared:
        raise ValueError(f"heldout.env: {len(shared)} held-out tasks are also in the stream (e.g. {shared[:3]}); "
                         "held-out tasks must be disjoint from the stream (TextCraft: data partition 'stream', "
                         "held-out partition 'heldout'; see configs/heldout/)")


class HeldOutEval(PeriodicEval):
    """Frozen evaluation of the fast weights on a fixed held-out task set, paired with the initial model.

    Off unless ``env`` is set. Logs ``heldout/success_rate``, ``heldout/turns``,
    ``heldout/invalid_rate`` and, with the initial model, ``heldout/initial_success_rate``,
    ``heldout/only_adapted``, ``heldout/only_initial``, ``heldout/mcnemar_p``,
    ``heldout/diff_low``, ``heldout/diff_high`` (95% interval of adapted - initial success).
    """

    def __init__(self, env: TextEnv | None = None, num_tasks: int | None = None, seed: int = 0,
                 every_n_tasks: int = 0, batch_size: int = 8, dtype: str = "float32",
                 include_initial: bool = True, initial_log: str | None = None,
                 filename: str | None = "heldout.jsonl"):
        """
        Args:
            env: The held-out environment, its own instance, disjoint from the stream (None: off).
            num_tasks: Size of the held-out set (None: all of the env's tasks).
            seed: Seed of the held-out subset and its reset seeds (fixed: the same set for every stream seed).
            every_n_tasks: Also evaluate every k stream tasks (0: only at the end of the stream).
            batch_size: Held-out episodes decoded together.
            dtype: The weights' dtype during the evaluation (float32: batched episodes equal one-at-a-time ones).
            include_initial: Also evaluate the initial model (adapter disabled) once, before the first task.
            initial_log: Take the initial model's records from an earlier run's held-out log (its
                ``heldout.jsonl`` or archived ``.heldout.jsonl.gz``) on the same tasks instead of playing
                them again: the initial model and its greedy float32 episodes are the same in every run
                (None: play them). Checked at setup: the same task ids at the same indices.
            filename: Per-task JSONL records in the run folder (None: loggers only).
        """
        if num_tasks is not None and num_tasks < 1:
            raise ValueError(f"heldout.num_tasks must be >= 1 or null, got {num_tasks}")
        if every_n_tasks < 0:
            raise ValueError(f"heldout.every_n_tasks must be >= 0, got {every_n_tasks}")
        if batch_size < 1:
            raise ValueError(f"heldout.batch_size must be >= 1, got {batch_size}")
        if dtype not in DTYPES:
            raise ValueError(f"heldout.dtype must be one of {DTYPES}, got {dtype!r}")
        if filename is not None and (not filename or Path(filename).name != filename):
            raise ValueError(f"heldout.filename must be a plain file name or null, got {filename!r}")
        super().__init__(every_n_tasks, None)  # metrics go to the loggers; the JSONL holds per-task records
        self.env, self.num_tasks, self.seed = env, num_tasks, seed
        if initial_log is not None and not include_initial:
            raise ValueError("heldout.initial_log is set but heldout.include_initial is false")
        self.batch_size, self.dtype, self.include_initial = batch_size, dtype, include_initial
        self.initial_log = initial_log
        self.records_file = filename
        self.tasks: list[Task] = []
        self.initial: list[dict] = []
        """Records of the initial model (evaluated once per run; kept across a resume)."""
        self.path: Path | None = None
        self._guarded: GuardedEnv | None = None
        self._resume_offset: int | None = None
        self._initial_written = False

    @property
    def enabled(self) -> bool:
        return self.env is not None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not self.enabled or stage != "fit":
            return
        if not self.tasks:
            available = len(self.env.tasks())
            if self.num_tasks and self.num_tasks > available:
                raise ValueError(f"heldout.num_tasks is {self.num_tasks}, but heldout.env offers {available} tasks")
            self.tasks = fixed_tasks(self.env, self.num_tasks, self.seed)
        datamodule = trainer.datamodule
        check_disjoint(self.tasks, getattr(datamodule, "stream", []))
        if self.initial_log and not self.initial:
            self.initial = recorded_initial(self.initial_log, self.tasks)
        timeout = getattr(getattr(datamodule, "env", None), "step_timeout_s", 300.0)
        self._guarded = GuardedEnv(self.env, timeout)  # a fault fails one held-out episode, not the run
        if self.records_file:
            self.path = run_dir(trainer) / self.records_file
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def play(self, pl_module, initial: bool) -> list[Episode]:
        """The held-out episodes of the adapted (or, with ``initial``, the initial) model, weights in ``dtype``;
        the adapted agent keeps its in-context memory (read only), the initial one has none."""
        policy = pl_module.policy
        with cast_weights(policy.model, getattr(torch, self.dtype)), \
                (policy.teacher() if initial else contextlib.nullcontext()):
            return evaluate(policy, self._guarded, self.tasks, pl_module.rollout_cfg, batch_size=self.batch_size,
                            memory=None if initial else getattr(pl_module, "memory", None))

    def write(self, trainer, records: list[dict]) -> None:
        if self.path is None or trainer.global_rank != 0:
            return
        if self._resume_offset is not None:  # the first write after a resume: drop what the checkpoint lacks
            dropped = truncate_log(self.path, self._resume_offset)
            if dropped:
                log.warning("held-out log: dropped %d bytes written after the checkpoint", dropped)
            self._resume_offset = None
        with open(self.path, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)

    def on_train_start(self, trainer, pl_module) -> None:
        if not (self.enabled and self.include_initial) or self._initial_written:
            return
        if not self.initial:
            self.initial = episode_records(self.play(pl_module, initial=True), "initial", 0)
        self.write(trainer, self.initial)
        self._initial_written = True
        rate = record_rates(self.initial)["success_rate"]
        record_metrics(trainer, {"heldout/initial_success_rate": rate}, 0)
        log.info("held-out: initial model solved %d of %d tasks", sum(r["verified"] for r in self.initial),
                 len(self.initial))

    def measure(self, trainer, pl_module) -> dict[str, float] | None:
        if not self.enabled:
            return None
        adapted = episode_records(self.play(pl_module, initial=False), "adapted", self._tasks_seen)
        self.write(trainer, adapted)
        return heldout_metrics(adapted, self.initial)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self._guarded is not None:
            self._guarded.close()

    def state_dict(self) -> dict:
        if not self.enabled:
            return {}
        offset = self.path.stat().st_size if self.path is not None and self.path.exists() else 0
        if self._resume_offset is not None:  # resumed, nothing written yet: the bytes past it are still to go
            offset = self._resume_offset
        return {"history": self.history, "tasks_seen": self._tasks_seen, "last_step": self._last_step,
                "initial": self.initial, "offset": offset}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a stream checkpoint. Records written after it are cut before the next write
        (they are redone); a finished stream writes nothing more and keeps its end-of-stream records."""
        self.history, self.initial = list(state["history"]), list(state["initial"])
        self._initial_written = bool(self.initial)
        self._tasks_seen, self._last_step = state["tasks_seen"], state["last_step"]
        self._resume_offset = state["offset"]
