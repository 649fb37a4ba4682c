"""The CLI end to end on configs/debug.yaml: events, JSONL log, a loadable PEFT adapter."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def run_cli(tmp_path: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "train.py", "fit", *args, "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
           "--trainer.logger.init_args.version", "0"]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_debug_config_end_to_end(tmp_path):
    proc = run_cli(tmp_path, "--config", "configs/debug.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "stream summary: tasks=4" in out and "[task    0]" in out
    run = tmp_path / "runs" / "debug" / "version_0"
    assert list(run.glob("events.out.tfevents.*"))
    records = [json.loads(line) for line in (run / "experience.jsonl").read_text().splitlines()]
    assert [r["task_index"] for r in records] == [0, 1, 2, 3]
    assert sum(r["updates"] for r in records) == sum(r["verified"] for r in records) == 2  # gated
    assert all("diagnostics/first_token_entropy" in r for r in records)

    from peft import PeftModel

    from lit_ascent.tiny import tiny_model_and_tokenizer

    base, tok = tiny_model_and_tokenizer()
    model = PeftModel.from_pretrained(base, str(run / "adapter" / "final"))
    ids = torch.tensor([tok("hello", add_special_tokens=False).input_ids])
    assert torch.isfinite(model(input_ids=ids).logits).all()
    assert (run / "adapter" / "final" / "adapter_model.safetensors").exists()


def test_the_projects_own_log_lines_reach_the_run_log(tmp_path):
    """train.py prints the package loggers' INFO records (here: the lessons a playbook writes) with Lightning's."""
    proc = run_cli(tmp_path, "--config", "configs/debug.yaml", "--model.memory", "lit_ascent.memory.Playbook")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "lit_ascent.memory: playbook lesson (task " in proc.stderr


def test_default_root_dir_decides_where_a_run_writes(tmp_path):
    """The config says ``save_dir: runs``; ``--trainer.default_root_dir`` moves the run, and its resume."""
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "train.py"), "fit", "--config", str(ROOT / "configs/debug.yaml"),
           "--trainer.default_root_dir", str(out), "--trainer.enable_progress_bar", "false"]
    fresh = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    run = out / "debug" / "version_0"
    assert list(run.glob("events.out.tfevents.*")) and (run / "adapter" / "final").is_dir()
    assert len((run / "experience.jsonl").read_text().splitlines()) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no ./runs, nothing else

    # stopped in its end-of-stream hooks: `--ckpt_path last` must find it under the same root and finish it there
    from callbacks.stream_checkpoint import load_state, save_atomic

    save_atomic({**load_state(run / "stream_state.pt"), "finished": False}, run / "stream_state.pt")
    shutil.rmtree(run / "adapter" / "final")
    resumed = subprocess.run([*cmd, "--ckpt_path", "last"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "ran all 4 tasks but was stopped in its end-of-stream hooks" in resumed.stdout + resumed.stderr
    assert (run / "adapter" / "final").is_dir() and load_state(run / "stream_state.pt")["finished"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and not (out / "debug" / "version_1").exists()


def test_save_dir_on_the_command_line_wins_over_default_root_dir(tmp_path):
    from lit_ascent.cli import main

    args = ["--config", "configs/debug.yaml", "--trainer.default_root_dir", str(tmp_path / "root")]
    assert main(args, run=False).trainer.logger.save_dir == str(tmp_path / "root")
    pinned = main([*args, "--trainer.logger.init_args.save_dir", str(tmp_path / "pinned")], run=False)
    assert pinned.trainer.logger.save_dir == str(tmp_path / "pinned")  # as lit_ascent.results.compare pins its cells
    assert main(["--config", "configs/debug.yaml"], run=False).trainer.logger.save_dir == "runs"
