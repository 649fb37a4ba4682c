"""The loop on a CUDA GPU: the same code path as on the CPU, checked where a GPU is (skipped elsewhere).

``pytest -m gpu`` on a machine with CUDA (``scripts/gpu_check.sh`` is the lent-GPU script). The tiny
random model and the scripted environment keep it to seconds; ``lit_ascent.bench.cuda`` measures speed.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_ascent.bench.engines import perturb
from lit_ascent.engines import close_engines
from lit_ascent.envs import ScriptedEnv
from lit_ascent.models import load_policy, resolve_dtype
from lit_ascent.rollout import RolloutConfig, rollout
from tests.conftest import TINY

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parents[1]
GPU = ["--trainer.accelerator", "gpu", "--trainer.devices", "1"]


def _episodes(device: str, engine: str) -> list:
    """A tiny policy's episodes on ``device``: the base, then after two 'updates' (new LoRA B)."""
    torch.manual_seed(0)
    policy = load_policy(TINY, device)
    policy.model.eval()
    env = ScriptedEnv(num_tasks=2, episode_steps=6, verify_every=1)
    cfg = RolloutConfig(max_turns=4, max_new_tokens=12, engine=engine)
    out = []
    for seed in (None, 1, 2):
        if seed is not None:
            perturb(policy.model, 0.5, seed)
        out.append(rollout(policy.model, policy.tokenizer, env, env.tasks()[1], cfg))
    close_engines(policy.model)
    return out


@pytest.mark.parametrize("engine", ["hf", "fused"])
def test_cuda_episodes_equal_the_cpu_reference(engine):
    """float32: the CUDA episode of each engine equals the CPU ``hf`` episode, before and after updates."""
    ref = _episodes("cpu", "hf")
    got = _episodes("cuda", engine)
    assert [e.token_ids for e in got] == [e.token_ids for e in ref]
    assert [[t.action for t in e.turns] for e in got] == [[t.action for t in e.turns] for e in ref]
    assert ref[0].token_ids != ref[1].token_ids  # the updates changed the episodes


def test_dtype_auto_is_bf16_on_cuda():
    assert resolve_dtype("auto", "cuda") == (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32)


def _fit(tmp_path: Path, name: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "train.py", "fit", "--config", "configs/debug.yaml", *args,
           "--trainer.default_root_dir", str(tmp_path), "--trainer.logger.init_args.name", name,
           "--trainer.enable_progress_bar", "false"]
    path = [str(ROOT / "tests"), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), **(env or {})}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


def _records(tmp_path: Path, name: str) -> list[dict]:
    path = tmp_path / name / "version_0" / "experience.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _outcome(r: dict) -> tuple:
    return r["task_id"], r["verified"], r["turns"], r["actions"], r["updates"]


def test_cuda_stream_equals_the_cpu_stream(tmp_path):
    """``train.py fit`` with ``trainer.accelerator: gpu``: the stream runs, updates after verified episodes
    only, and (float32) gives the CPU stream's outcomes and actions task by task, losses within rounding."""
    cpu, gpu = _fit(tmp_path, "cpu"), _fit(tmp_path, "gpu", *GPU)
    assert cpu.returncode == 0, cpu.stderr[-3000:]
    assert gpu.returncode == 0, gpu.stderr[-3000:]
    a, b = _records(tmp_path, "cpu"), _records(tmp_path, "gpu")
    assert [_outcome(r) for r in b] == [_outcome(r) for r in a]
    assert sum(r["updates"] for r in b) == sum(r["verified"] for r in b) > 0
    for x, y in zip(a, b):  # the tiny model's teacher/student KL is ~5e-6 nats, float32 rounding's own scale
        for key in ("update/loss_before", "update/loss_after"):
            if key in x.get("update", {}):
                assert y["update"][key] == pytest.approx(x["update"][key], abs=1e-5), key
    assert (tmp_path / "gpu" / "version_0" / "adapter" / "final" / "adapter_model.safetensors").is_file()


def test_cuda_bf16_stream_runs(tmp_path):
    """``dtype: auto`` on the GPU is bf16: the stream runs and every update is finite."""
    proc = _fit(tmp_path, "bf16", *GPU, "--model.llm.dtype", "auto")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = _records(tmp_path, "bf16")
    assert {r["dtype"] for r in records} == {"bfloat16"}
    updated = [r for r in records if r["updates"]]
    assert updated and all(math.isfinite(r["update"]["update/loss_after"]) for r in updated)


def test_cuda_stream_killed_mid_update_resumes_exactly(tmp_path):
    """SIGKILL after task 3's episode, ``--ckpt_path last``: the records of the uninterrupted GPU stream."""
    kill = ["--trainer.callbacks+=test_resume.KillSwitch", "--stream_checkpoint.every_n_tasks", "1",
            "--data.env.init_args.num_tasks", "6"]
    ref = _fit(tmp_path, "ref", *GPU, *kill)
    assert ref.returncode == 0, ref.stderr[-3000:]
    killed = _fit(tmp_path, "run", *GPU, *kill, env={"LIT_ASCENT_TEST_KILL": "3:episode"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = _fit(tmp_path, "run", *GPU, *kill, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    strip = lambda rs: [{k: v for k, v in r.items() if k != "timings"} for r in rs]  # noqa: E731
    assert strip(_records(tmp_path, "run")) == strip(_records(tmp_path, "ref"))
