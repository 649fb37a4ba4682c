"""The CLI end to end on configs/debug.yaml: events, JSONL log, a loadable PEFT adapter."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
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


@pytest.mark.parametrize("override, name", [
    (["--model.llm.lora.rank", "-1"], "rank"),
    (["--model.objective.divergence", "wasserstein"], "divergence"),
    (["--model.objective.beta", "1.5"], "beta"),
])
def test_bad_config_values_name_the_argument(tmp_path, override, name):
    proc = run_cli(tmp_path, "--config", "configs/debug.yaml", *override, timeout=120)
    assert proc.returncode != 0
    assert name in proc.stderr
