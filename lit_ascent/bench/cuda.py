"""The rollout engines and the update on a CUDA GPU, against the GPU's own bounds.

    python -m lit_ascent.bench.cuda --out docs/results/bench_cuda   # where a GPU is (scripts/gpu_check.sh)

The model is SmolLM2-135M's architecture (30 layers, width 576, 9 query / 3 key-value heads, 49,152
tokens) with seeded random weights and a rank-16 LoRA with non-zero B, as after an update: the same
bytes read per decoded token as the embedded model, whose file is not on the lent GPU machine. Per
dtype: decode tokens/s of each engine after a 256-token prompt against the bandwidth bound (a large
copy's bandwidth / weight bytes), how many of the greedy tokens equal ``hf``'s, one ASCENT update on a
1,024-token episode against the matmul rate, and batched evaluation (batch 8 vs 1, scripted
environment). Times are wall seconds between CUDA synchronisations (``bench.Clock.spent``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from lit_ascent.bench.throughput import Clock, batched_eval, copy_bandwidth, matmul_flops, save, update_flops
from lit_ascent.bench.engines import perturb
from lit_ascent.bench.memory import synthetic_episode
from lit_ascent.engines import close_engines, engine_for
from lit_ascent.envs import ScriptedEnv
from lit_ascent.models import LoraSettings, Policy, attach_fast_weights
from lit_ascent.options import parse_options
from lit_ascent.rollout import RolloutConfig

SMOLLM2 = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
           "num_attention_heads": 9, "num_key_value_heads": 3, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
           "max_position_embeddings": 8192, "rope_theta": 100000.0}
"""SmolLM2-135M-Instruct's architecture (read from the embedded GGUF's config)."""
ENGINES = ["hf", "fused"]


def smollm2_shaped(dtype: torch.dtype, device: str, seed: int = 0) -> Policy:
    """SmolLM2's architecture with seeded random weights + LoRA r16 (the byte tokenizer: ids only matter)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lit_ascent.tiny import byte_tokenizer

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**SMOLLM2)).to(dtype)
    return Policy(attach_fast_weights(model, LoraSettings()).to(device).eval(), byte_tokenizer())


def greedy(policy: Policy, engine: str, ids: list[int], tokens: int) -> tuple[list[int], float]:
    """``tokens`` greedy ids after ``ids`` with ``engine`` and the decode tokens/s (pre-fill not timed)."""
    dec = engine_for(engine, policy.model).decoder(set())
    dec.extend(ids)
    first, _ = dec.generate(1)
    with Clock() as c:
        rest, _ = dec.generate(tokens)
    close_engines(policy.model)
    return first + rest, tokens / c.spent


def measure(dtype: torch.dtype, device: str, bandwidth: float, tokens: int) -> dict:
    policy = smollm2_shaped(dtype, device)
    perturb(policy.model)
    weight_bytes = sum(p.numel() * p.element_size() for p in {id(p): p for p in policy.model.parameters()}.values()
                       if not p.requires_grad)
    ids = torch.randint(100, 20000, (256,), generator=torch.Generator().manual_seed(0)).tolist()
    row: dict = {"weight_bytes": weight_bytes, "bound_tok_s": bandwidth / weight_bytes, "decode": {}}
    ref = None
    for engine in ENGINES:
        greedy(policy, engine, ids, 8)  # warm-up: kernels and allocator
        out, rate = greedy(policy, engine, ids, tokens)
        ref = ref or out
        same = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), len(out))
        row["decode"][engine] = {"tok_s": rate, "of_bound": rate * weight_bytes / bandwidth, "equal_prefix": same,
                                 "tokens": len(out)}
        print(f"  {dtype} {engine}: {rate:.0f} tok/s, {same}/{len(out)} tokens equal to hf", flush=True)
    matmul = matmul_flops(dtype, 4096, device=device)
    update_flops(policy, synthetic_episode(policy.tokenizer, 1024), matmul)  # warm-up
    row["update"] = update_flops(policy, synthetic_episode(policy.tokenizer, 1024), matmul)
    env = ScriptedEnv(num_tasks=8, episode_steps=4, verify_every=2)
    row["batched_eval"] = batched_eval(policy, env, env.tasks(), RolloutConfig(max_turns=2, max_new_tokens=48), [1, 8])
    return row


def run(device: str, tokens: int) -> dict:
    t0 = time.perf_counter()
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    r = {"device": name, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    r["copy_gb_s"] = copy_bandwidth(1024 if device == "cuda" else 256, device=device) / 1e9
    r["rows"] = {str(dt).removeprefix("torch."): measure(dt, device, r["copy_gb_s"] * 1e9, tokens)
                 for dt in (torch.float32, torch.bfloat16)}
    r["total_s"] = time.perf_counter() - t0
    return r


def markdown(r: dict) -> str:
    lines = [f"# Bench: engines and update on {r['device']}, SmolLM2-135M architecture (random weights)", "",
             f"{r['date']}; torch {r['torch']}; `python -m lit_ascent.bench.cuda` in {r['total_s']:.0f} s. "
             f"Copy bandwidth {r['copy_gb_s']:.0f} GB/s.", "",
             "| dtype | engine | decode tok/s | of the bandwidth bound | greedy tokens equal to hf |",
             "|---|---|---|---|---|"]
    for dt, row in r["rows"].items():
        for engine, d in row["decode"].items():
            lines.append(f"| {dt} | {engine} | {d['tok_s']:.0f} | {d['of_bound']:.1%} | "
                         f"{d['equal_prefix']}/{d['tokens']} |")
    lines += ["", "| dtype | update s (1,024 tokens) | of the matmul rate | eval batch 8 vs 1 (tokens/s) |",
              "|---|---|---|---|"]
    for dt, row in r["rows"].items():
        u, b = row["update"], row["batched_eval"][-1]
        lines.append(f"| {dt} | {u['update_s']:.3f} | {u['of_matmul']:.1%} | {b['speedup']:.2f}x |")
    lines += ["", "Decode: greedy tokens after a 256-token random prompt, LoRA non-zero (hf runs it, fused folds "
              "it in). Update: teacher forward + student forward/backward (ASCENT), FLOPs 8 x params x tokens.", ""]
    return "\n".join(lines)


@dataclass
class CudaBenchOptions:
    """The command line of ``python -m lit_ascent.bench.cuda``."""

    out: str = "docs/results/bench_cuda"
    """Output path without extension."""
    device: str = "cuda"
    """cuda (the bench) | cpu (a dry run of the bench itself)."""
    tokens: int = 128
    """Greedy tokens timed per engine."""

    def __post_init__(self) -> None:
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA GPU here (use --device cpu for a dry run)")


def main(argv: list[str] | None = None) -> None:
    args = parse_options(CudaBenchOptions, argv, prog="python -m lit_ascent.bench.cuda",
                         description=__doc__.split("\n\n")[0])
    result = run(args.device, args.tokens)
    save(args.out, result, markdown(result))


if __name__ == "__main__":
    main()
