"""``lit_ascent.bench.cuda``'s report: the committed GPU run renders to its committed table, and its
model has SmolLM2's shapes (the bench itself runs where a GPU is: scripts/gpu_check.sh)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from lit_ascent.bench.cuda import SMOLLM2, markdown

RUN = Path(__file__).resolve().parents[1] / "docs" / "results" / "gpu" / "bench_cuda"


def test_committed_gpu_run_renders_to_its_table():
    r = json.loads(RUN.with_suffix(".json").read_text())
    assert markdown(r) == RUN.with_suffix(".md").read_text()
    fp32, bf16 = r["rows"]["float32"], r["rows"]["bfloat16"]
    assert fp32["weight_bytes"] == 2 * bf16["weight_bytes"]


def test_smollm2_architecture_has_135m_parameters():
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2))
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
