"""Resume a stream exactly where it stopped: one pass, one attempt per task, even across a crash.

After every k tasks ``StreamCheckpoint`` writes ``<run_dir>/stream_state.pt``
atomically (temp file, fsync, ``os.replace``): the stream cursor, the LoRA
adapter, the AdamW state, the objective's running statistics, the module's
metrics and counters, every callback's ``state_dict()`` (the experience log's
byte offset, the report's records, ...), the loop counters that give the
TensorBoard steps, and the RNG states. Only plain tensors, numbers, strings,
lists and dicts are stored; the file is read with ``torch.load(weights_only=True)``.

Resuming (the same config, plus one flag)::

    python train.py fit --config configs/debug.yaml --ckpt_path last
    python train.py fit --config configs/debug.yaml --ckpt_path runs/debug/version_3

``--ckpt_path`` takes ``last`` (the most recently checkpointed run under the
configured logger's ``save_dir/name``; ``--trainer.default_root_dir`` moves ``save_dir``
before this is looked up, ``lit_ascent/cli.py``), a run folder, or its ``stream_state.pt``.
The CLI then pins the logger to that run folder (TensorBoardLogger / CSVLogger:
``save_dir``, ``name`` and ``version`` are set from the path; no logger:
``trainer.default_root_dir``), so the curves, the experience log and the
adapters continue in place. On resume the experience log is cut at the
checkpoint's offset: a partial last line from the crash and the lines of tasks
after the checkpoint are dropped, and those tasks are redone, so no task is
missing or repeated. TensorBoard may keep the scalars of the one task that was
interrupted (they are logged again, at the same step, when it is redone).

A stream that ran all its tasks but was stopped before its end-of-stream hooks
had finished (final adapter, summary, a transfer evaluation) runs those hooks
when it is resumed; once they have run, the checkpoint is marked ``finished``
and a resume has nothing left to do.

A fresh run refuses a run folder that already holds a checkpoint (pass
``--ckpt_path`` to continue it, or choose another logger version).
"""
from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.utilities import rank_zero_info

from callbacks.base import run_dir
from lit_ascent.checkpoint_io import read_checkpoint, save_atomic
from lit_ascent.results.run_archive import STATE_FILE

FORMAT = 1


def stream_fingerprint(stream: list) -> str:
    """Identity of the task order (env, id, reset seed): a resume must see the same stream."""
    text = "\n".join(f"{t.env}/{t.task_id}/{t.seed}" for t in stream)
    return hashlib.sha1(text.encode()).hexdigest()


def rng_states() -> dict[str, Any]:
    """Python, NumPy and torch (CPU, CUDA) generator states as plain values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    states = {"python": random.getstate(), "numpy": [kind, keys.tolist(), pos, has_gauss, gauss],
              "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def load_state(path: Path) -> dict:
    """Read a stream checkpoint (plain values only: ``weights_only=True``)."""
    if not path.is_file():
        raise FileNotFoundError(f"ckpt_path: no stream checkpoint at {str(path)!r}")
    return read_checkpoint(path, FORMAT, "ckpt_path", "stream checkpoint")


def _loop_state(trainer) -> dict:
    loop = trainer.fit_loop.epoch_loop
    # saved in on_train_batch_end, before Lightning counts the batch as stepped
    return {"batches_that_stepped": loop._batches_that_stepped + 1,
            "optim_steps": loop.manual_optimization.optim_step_progress.state_dict()}


def _load_loop_state(trainer, state: dict) -> None:
    loop = trainer.fit_loop.epoch_loop
    loop._batches_that_stepped = state["batches_that_stepped"]
    loop.manual_optimization.optim_step_progress.load_state_dict(state["optim_steps"])


class StreamCheckpoint(Checkpoint):
    """Saves the whole stream state every k tasks; restores it when the run is resumed.

    A ``Checkpoint`` subclass, so Lightning runs it after every other callback:
    the state it saves includes what they wrote for the task (log lines, records).
    """

    def __init__(self, every_n_tasks: int = 1, filename: str = STATE_FILE, resume: bool = False):
        """
        Args:
            every_n_tasks: Save after every k tasks (and after the last); a crash redoes at most k tasks.
            filename: File name inside the run folder.
            resume: Continue the stream saved in the run folder (set by ``--ckpt_path``).
        """
        if every_n_tasks < 1:
            raise ValueError(f"stream_checkpoint.every_n_tasks must be >= 1, got {every_n_tasks}")
        if not filename or Path(filename).name != filename:
            raise ValueError(f"stream_checkpoint.filename must be a plain file name, got {filename!r}")
        self.every_n_tasks, self.filename, self.resume = every_n_tasks, filename, resume
        self.path: Path | None = None
        self._state: dict | None = None
        self._rng: dict | None = None
        self._cursor = 0
        self._end_hooks_pending = False

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        self.path = run_dir(trainer) / self.filename
        if not self.resume:
            if self.path.exists():
                raise FileExistsError(
                    f"{self.path} exists: this run folder already holds a stream. Continue it with "
                    f"--ckpt_path {self.path.parent}, or choose another trainer.logger version")
            return
        state = load_state(self.path)
        stream = trainer.datamodule.stream
        if state["fingerprint"] != stream_fingerprint(stream):
            raise ValueError(f"ckpt_path: {self.path} was written for another task stream "
                             "(data.env, data.num_tasks, data.seed, data.shuffle, data.balance_by must match)")
        trainer.datamodule.start = state["cursor"]
        self._state = state
        where = f"the stream in {self.path.parent}"
        self._end_hooks_pending = state["cursor"] == len(stream) and not state.get("finished")
        if state["cursor"] < len(stream):
            rank_zero_info(f"resuming {where} at task {state['cursor']} of {len(stream)}")
        elif not self._end_hooks_pending:
            rank_zero_info(f"{where} has finished all {len(stream)} tasks: nothing left to run")
        else:
            rank_zero_info(f"{where} ran all {len(stream)} tasks but was stopped in its end-of-stream "
                           "hooks (final adapter, summary, transfer evaluation): running them now")

    def on_fit_start(self, trainer, pl_module) -> None:
        if self._state is None:
            return
        state, self._state = self._state, None
        pl_module.load_stream_state(state["module"])
        for cb in trainer.callbacks:
            if cb is not self and cb.state_key in state["callbacks"]:
                cb.load_state_dict(state["callbacks"][cb.state_key])
        _load_loop_state(trainer, state["loops"])
        self._rng = state["rng"]  # set when the first task starts, after the loader drew its seed
        self._cursor = state["cursor"]
        if self._end_hooks_pending:
            trainer.fit_loop.on_run_end()  # no batch is left, so Lightning would skip on_train_end

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._rng is not None:
            set_rng_states(self._rng)
            self._rng = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._cursor = cursor = batch[0].index + 1
        if cursor % self.every_n_tasks == 0 or cursor == len(trainer.datamodule.stream):
            self.save(trainer, pl_module, cursor)

    def on_train_end(self, trainer, pl_module) -> None:
        # a Checkpoint, so this runs after the other callbacks' end-of-stream hooks
        if trainer.global_rank == 0 and self._cursor == len(trainer.datamodule.stream):
            save_atomic({**load_state(self.path), "finished": True}, self.path)

    def save(self, trainer, pl_module, cursor: int) -> None:
        """Write the state after ``cursor`` tasks (rank 0 only)."""
        if trainer.global_rank != 0:
            return
        callbacks = {cb.state_key: cb.state_dict() for cb in trainer.callbacks if cb is not self}
        state = {"format": FORMAT, "cursor": cursor, "fingerprint": stream_fingerprint(trainer.datamodule.stream),
                 "module": pl_module.stream_state(), "callbacks": {k: v for k, v in callbacks.items() if v},
                 "loops": _loop_state(trainer), "rng": rng_states()}
        save_atomic(state, self.path)


# --- the CLI side: turn --ckpt_path into a pinned run folder -------------------------------------

def _get(ns: Any, key: str, default: Any = None) -> Any:
    return ns.get(key, default) if hasattr(ns, "get") else getattr(ns, key, default)


def logger_root(trainer_cfg: Any) -> Path:
    """Where the configured logger puts its run folders (``save_dir/name``), else the root dir."""
    logger = _get(trainer_cfg, "logger")
    args = _get(logger, "init_args") if logger not in (None, True, False) else None
    if args is not None and _get(args, "save_dir") is not None:
        return Path(_get(args, "save_dir")) / (_get(args, "name") or "")
    return Path(_get(trainer_cfg, "default_root_dir") or os.getcwd())


def resolve_resume(ckpt_path: str, search_root: Path, filename: str = STATE_FILE) -> Path:
    """The run folder to continue: ``last`` = the newest checkpoint under ``search_root``."""
    if ckpt_path == "last":
        found = sorted(search_root.glob(f"*/{filename}"), key=lambda p: p.stat().st_mtime)
        found += [search_root / filename] if (search_root / filename).is_file() else []
        if not found:
            raise FileNotFoundError(f"ckpt_path=last: no {filename} under {str(search_root)!r}")
        return max(found, key=lambda p: p.stat().st_mtime).parent
    path = Path(ckpt_path)
    folder = path.parent if path.is_file() else path
    if not (folder / filename).is_file():
        raise FileNotFoundError(f"ckpt_path: no {filename} in {str(folder)!r}")
    return folder


def pin_run_folder(trainer_cfg: Any, folder: Path) -> None:
    """Point the configured logger (or the root dir) at ``folder`` so the resumed run writes there."""
    logger = _get(trainer_cfg, "logger")
    if logger in (None, False):
        trainer_cfg["default_root_dir"] = str(folder)
        return
    args = _get(logger, "init_args")
    if args is None or "version" not in args:
        raise ValueError("ckpt_path: resuming needs a TensorBoardLogger/CSVLogger (trainer.logger) or no logger")
    args["save_dir"], args["name"], args["version"] = str(folder.parent.parent), folder.parent.name, folder.name


def prepare_resume(config: Any, key: str = "stream_checkpoint") -> None:
    """Turn ``config.ckpt_path`` into a stream resume: pin the run folder, arm the callback.

    Lightning's own checkpoint loading is switched off (``ckpt_path`` becomes None):
    the stream state is restored by ``StreamCheckpoint``.
    """
    ckpt_path = _get(config, "ckpt_path")
    if not ckpt_path:
        return
    trainer_cfg = config["trainer"]
    folder = resolve_resume(str(ckpt_path), logger_root(trainer_cfg), config[key]["filename"])
    pin_run_folder(trainer_cfg, folder)
    config[key]["resume"] = True
    config["ckpt_path"] = None
