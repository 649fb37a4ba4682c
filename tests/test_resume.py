"""Kill a debug stream with SIGKILL, resume it, and get exactly the uninterrupted run.

Each run is a separate process (forked from the test, or ``python train.py``), so
SIGKILL ends it the way a crash would: nothing is flushed or cleaned up.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from callbacks.base import EpisodeCallback, run_dir
from callbacks.experience_log import truncate_log
from callbacks.stream_checkpoint import load_state, resolve_resume
from lit_ascent.cli import main
from lit_ascent.objectives import Distillation
from lit_ascent.objectives.base import LossOutput
from lit_ascent.records import read_records

ROOT = Path(__file__).resolve().parents[1]
KILL = "LIT_ASCENT_TEST_KILL"
"""'<task index>:<point>', point: start (before the rollout) | episode (after the rollout,
before the update) | partial_line (crash in the middle of writing the task's log line) |
end (in the end-of-stream hooks, before the final adapter is saved; the index is ignored)."""
NUM_TASKS = 6

CONFIG = f"""
seed_everything: 0
trainer:
  accelerator: cpu
  enable_progress_bar: false
  logger:
    class_path: lightning.pytorch.loggers.TensorBoardLogger
    init_args: {{save_dir: SAVE_DIR, name: stream}}
  callbacks:
    - class_path: callbacks.VerificationGate
    - class_path: callbacks.InvalidTurnFilter
    - class_path: test_resume.KillSwitch
model:
  llm: {{name_or_path: tiny-random, dtype: float32, lora: {{rank: 4, alpha: 8.0}}}}
  objective:
    class_path: test_resume.RunningDistillation
    init_args: {{chunk_size: 64}}
  rollout: {{max_turns: 2, max_new_tokens: 8}}
  optim: {{lr: 1.0e-2, updates_per_task: 2}}
data:
  env:
    class_path: lit_ascent.envs.ScriptedEnv
    init_args: {{num_tasks: {NUM_TASKS}, episode_steps: 2, verify_every: 2}}
  seed: 0
report: {{verbose: false}}
"""


class RunningDistillation(Distillation):
    """ASCENT with a running statistic (as a REINFORCE baseline would keep) that the loss and
    the logged metrics depend on: a resume that lost ``state_dict()`` would show in both."""

    def __init__(self, chunk_size: int = 64):
        super().__init__(chunk_size=chunk_size)
        self.seen = torch.zeros(())

    def loss(self, policy, episode, prepared):
        out = super().loss(policy, episode, prepared)
        if out is None:
            return None
        self.seen += torch.is_grad_enabled()  # an update, not a measurement (the absorbed fraction)
        return LossOutput(out.loss / self.seen, {**out.metrics, "loss/seen": float(self.seen)})

    def state_dict(self) -> dict:
        return {"seen": self.seen.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.seen = state["seen"].clone()


class KillSwitch(EpisodeCallback):
    """Test-only: SIGKILL this very process at the point named by ``$LIT_ASCENT_TEST_KILL``."""

    def __init__(self):
        task, _, self.point = (os.environ.get(KILL) or "-1:").partition(":")
        self.task = int(task)

    def _at(self, index: int, point: str) -> bool:
        return index == self.task and point == self.point

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._at(batch[0].index, "start"):
            os.kill(os.getpid(), signal.SIGKILL)

    def on_episode(self, trainer, pl_module, outcome) -> None:
        if self._at(outcome.episode.task.index, "episode"):
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._at(batch[0].index, "partial_line"):  # runs before ExperienceLog writes the line
            with open(run_dir(trainer) / "experience.jsonl", "a") as f:
                f.write(json.dumps(outputs["outcome"].record)[:40])  # no newline: cut mid-write
            (run_dir(trainer) / "stream_state.pt.tmp").write_bytes(b"half a checkpoint")
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.point == "end":  # a user callback: runs before the CLI's AdapterCheckpoint
            os.kill(os.getpid(), signal.SIGKILL)


def _child(args: list[str], kill: str) -> None:
    torch.set_num_threads(1)
    os.environ[KILL] = kill
    main(args)


def fit_forked(args: list[str], kill: str = "") -> int:
    """Run ``train.py fit`` in a forked process (imports already paid); its exit code."""
    proc = mp.get_context("fork").Process(target=_child, args=(["fit", *args], kill))
    proc.start()
    proc.join(timeout=300)
    return proc.exitcode


def fit_cli(args: list[str], kill: str = "") -> int:
    """Run ``python train.py fit`` exactly as a user would."""
    env = {**os.environ, KILL: kill, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    proc = subprocess.run([sys.executable, "train.py", "fit", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr[-3000:]
    return proc.returncode


def outcomes(folder: Path) -> list[dict]:
    """Per-task records of the experience log, minus timings."""
    return [{k: v for k, v in r.items() if k != "timings"} for r in read_records(folder / "experience.jsonl")]


def curves(folder: Path, keys=("stream/success", "stream/success_rate", "train/updates")) -> dict:
    """TensorBoard scalars {key: {step: value}} over all event files of the run (a restart included)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {k: {e.step: e.value for e in acc.Scalars(k)} for k in keys}


def assert_same_adapter(folder: Path, ref: Path) -> None:
    a, b = (load_file(str(f / "adapter" / "final" / "adapter_model.safetensors")) for f in (folder, ref))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    cfg = root / "config.yaml"
    cfg.write_text(CONFIG.replace("SAVE_DIR", str(root)))
    torch.set_num_threads(1)
    assert fit_forked(["--config", str(cfg), "--trainer.logger.init_args.version", "reference"]) == 0
    return root, cfg


# (name, kill spec, checkpoint every k tasks, runner of the resume)
CASES = [
    ("early", "1:start", 1, "fork"),
    ("mid_update", "3:episode", 1, "fork"),
    ("lines_after_ckpt", "3:start", 2, "cli"),  # checkpoint after task 1; task 2's line must go
    ("partial_line", "4:partial_line", 1, "fork"),
]


@pytest.mark.parametrize("name,kill,every,runner", CASES, ids=[c[0] for c in CASES])
def test_killed_stream_resumes_exactly(runs, name, kill, every, runner):
    root, cfg = runs
    ref = root / "stream" / "reference"
    common = ["--config", str(cfg), "--stream_checkpoint.every_n_tasks", str(every),
              "--trainer.logger.init_args.name", name]
    assert fit_forked([*common, "--trainer.logger.init_args.version", "run"], kill=kill) == -signal.SIGKILL
    folder = root / name / "run"
    killed_at = int(kill.split(":")[0])
    saved = load_state(folder / "stream_state.pt")
    assert saved["cursor"] == killed_at - killed_at % every
    assert not (folder / "adapter" / "final").exists()

    resume = [*common, "--ckpt_path", "last" if runner == "cli" else str(folder)]
    assert (fit_cli if runner == "cli" else fit_forked)(resume) == 0

    got, want = outcomes(folder), outcomes(ref)
    assert [r["task_index"] for r in got] == list(range(NUM_TASKS))  # none missing, none repeated
    assert got == want
    logged = curves(folder)
    assert logged == curves(ref) and sorted(logged["stream/success"]) == list(range(NUM_TASKS))
    assert_same_adapter(folder, ref)
    final, ref_final = load_state(folder / "stream_state.pt"), load_state(ref / "stream_state.pt")
    assert final["module"]["counters"] == ref_final["module"]["counters"]
    assert final["module"]["counters"]["updates"] > 0  # the stream did learn something
    torch.testing.assert_close(final["module"]["objective"], ref_final["module"]["objective"], rtol=0, atol=0)
    assert float(final["module"]["objective"]["seen"]) == final["module"]["counters"]["updates"]
    torch.testing.assert_close(final["module"]["metrics"], ref_final["module"]["metrics"], rtol=0, atol=0)
    torch.testing.assert_close(final["module"]["optimizer"]["state"], ref_final["module"]["optimizer"]["state"],
                               rtol=0, atol=0)
    assert final["callbacks"]["StreamReport"] == ref_final["callbacks"]["StreamReport"]
    assert final["loops"] == ref_final["loops"]


def test_stream_killed_in_its_end_hooks_runs_them_on_resume(runs):
    root, cfg = runs
    ref = root / "stream" / "reference"
    assert load_state(ref / "stream_state.pt")["finished"] is True
    common = ["--config", str(cfg), "--trainer.logger.init_args.name", "end_hooks"]
    assert fit_forked([*common, "--trainer.logger.init_args.version", "run"], kill="0:end") == -signal.SIGKILL
    folder = root / "end_hooks" / "run"
    saved = load_state(folder / "stream_state.pt")
    assert saved["cursor"] == NUM_TASKS and not saved.get("finished")
    assert not (folder / "adapter" / "final").exists()

    resume = [*common, "--ckpt_path", str(folder)]
    assert fit_forked(resume) == 0  # nothing left to roll out: only the end-of-stream hooks run
    assert outcomes(folder) == outcomes(ref)
    assert_same_adapter(folder, ref)
    assert load_state(folder / "stream_state.pt")["finished"] is True

    shutil.rmtree(folder / "adapter" / "final")
    assert fit_forked(resume) == 0  # finished: a second resume runs nothing, not even the hooks
    assert outcomes(folder) == outcomes(ref)
    assert not (folder / "adapter" / "final").exists()


def test_resolve_resume_errors_name_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="ckpt_path=last"):
        resolve_resume("last", tmp_path)
    with pytest.raises(FileNotFoundError, match="ckpt_path.*nowhere"):
        resolve_resume(str(tmp_path / "nowhere"), tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "stream_state.pt").write_bytes(b"not a checkpoint")
    assert resolve_resume("last", tmp_path) == tmp_path / "a"
    with pytest.raises(ValueError, match="ckpt_path.*not a readable stream checkpoint"):
        load_state(tmp_path / "a" / "stream_state.pt")


def test_partial_last_line_is_dropped(tmp_path):
    log = tmp_path / "experience.jsonl"
    log.write_text('{"task_index": 0}\n{"task_index": 1}\n{"task_ind')
    assert [r["task_index"] for r in read_records(log)] == [0, 1]
    offset, size = len('{"task_index": 0}\n'), log.stat().st_size
    assert truncate_log(log, offset) == size - offset
    assert log.read_text() == '{"task_index": 0}\n'
    with pytest.raises(RuntimeError, match="experience log"):
        truncate_log(log, offset + 1)  # shorter than the checkpoint says: records were lost
