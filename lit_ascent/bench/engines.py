"""Rollout engines side by side: decode speed against the machine's bounds, real episodes, a stream.

    python -m lit_ascent.bench.engines [--out docs/results/bench_engines] [--engines hf fused] [--stream-tasks 10]
    python -m lit_ascent.bench.engines --quick --out /tmp/bench_engines   # tiny model, scripted env

Measured in one process (the stream rows: one ``train.py`` per engine, one after the other), as
ratios of times taken minutes apart. Decode and episode times are process CPU seconds with one
intra-op thread (waiting for a shared core is not counted); the stream rows are wall-clock, what a
user waits for. Bounds: a decoded token reads every weight once, so tokens/s cannot exceed
bandwidth / weight bytes; the *copy* bound uses the bandwidth of a large tensor copy (read +
write, ``lit_ascent.bench``'s definition, where the 60% target is set), the *read* bound the rate at
which a matrix-vector product streams a 256 MiB matrix (what decoding does; the tighter bound).
Engines are compared on the SmolLM2 reference base (``adapters/textcraft-ref``) in float32, where
their greedy tokens must be equal (``--dtype bfloat16``: how often they are): the tables say.
"""
from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

from lit_ascent.bench.throughput import Clock, copy_bandwidth, machine, save
from lit_ascent.engines import close_engines, engine_for
from lit_ascent.engines.fused import FusedSettings, FusedWeights
from lit_ascent.models import TINY, ModelConfig, load_policy
from lit_ascent.options import parse_options
from lit_ascent.records import read_records
from lit_ascent.rollout import RolloutConfig, rollout
from lit_ascent.results.run_archive import LOG_NAME

REPO = Path(__file__).resolve().parents[2]
REFERENCE = "adapters/textcraft-ref"
VARIANTS = {"hf": {}, "fused": {"fused": FusedSettings(prompt_lookup=0)},
            "fused+lookup": {"fused": FusedSettings(prompt_lookup=8)}, "vllm": {}}
"""Rows: engine name (``+lookup``: prompt lookup on) -> RolloutConfig fields."""


def read_bandwidth(mib: int = 256, reps: int = 5) -> float:
    """Bytes/s a float32 matrix-vector product streams its matrix at, best of ``reps``."""
    m = torch.ones(mib * 2**20 // 4 // 1024, 1024)
    x = torch.ones(1024)
    best = float("inf")
    for _ in range(reps):
        with Clock() as c:
            torch.mv(m, x)
        best = min(best, c.cpu)
    return m.numel() * 4 / best


def _cfg(variant: str, **kw) -> RolloutConfig:
    return RolloutConfig(engine=variant.split("+")[0], **VARIANTS[variant], **kw)


def perturb(model, scale: float = 2e-3, seed: int = 0) -> None:
    """Random LoRA B matrices times ``scale``, as after an update (every engine then runs or folds
    the LoRA); ``scale`` 0: zero, the fresh adapter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def decode_rates(policy, variants: list[str], prompt_len: int, tokens: int) -> dict[str, float]:
    """Tokens per CPU second after a ``prompt_len``-token random prompt (pre-fill not timed), per engine."""
    high = min(20000, policy.model.get_input_embeddings().num_embeddings)
    ids = torch.randint(0, high, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    rates = {}
    for v in variants:
        engine = engine_for(v.split("+")[0], policy.model, getattr(_cfg(v), v.split("+")[0], None))
        dec = engine.decoder(set())
        dec.extend(ids)
        dec.generate(1)
        with Clock() as c:
            dec.generate(tokens)
        rates[v] = tokens / c.spent
        close_engines(policy.model)
    return rates


def matvec_rate(weights: FusedWeights, tokens: int) -> float:
    """Tokens/s if a token cost only the fused weights' matrix-vector products (q/k/v, o, gate/up, down per
    layer, and the head) with one input row: the floor under any engine built on PyTorch's products."""
    mats = [m for lw in weights.layers for m in (lw.qkv, lw.o, lw.gate_up, lw.down)] + [weights.head]
    inputs = {w.shape[1]: torch.zeros(1, w.shape[1], dtype=weights.dtype, device=weights.device) for w, _ in mats}
    for w, b in mats:
        F.linear(inputs[w.shape[1]], w, b)
    with Clock() as c:
        for _ in range(tokens):
            for w, b in mats:
                F.linear(inputs[w.shape[1]], w, b)
    return tokens / c.spent


def episodes(policy, env, tasks, variants: list[str], max_turns: int) -> dict[str, dict]:
    """Per engine: CPU seconds, generated tokens and tokens/s over the real episodes of ``tasks``,
    and how many episodes equal the first engine's token for token."""
    out, ref = {}, None
    for v in variants:
        eps, cpu = [], 0.0
        for task in tasks:
            with Clock() as c:
                eps.append(rollout(policy.model, policy.tokenizer, env, task, _cfg(v, max_turns=max_turns)))
            cpu += c.cpu
        close_engines(policy.model)
        gen = sum(e.timings["generated_tokens"] for e in eps)
        ref = ref or eps
        out[v] = {"cpu_s": cpu, "generated_tokens": gen, "tokens_per_s": gen / cpu, "solved": sum(e.verified for e in eps),
                  "identical": sum(a.token_ids == b.token_ids for a, b in zip(eps, ref)), "episodes": len(eps)}
        print(f"  episodes {v}: {out[v]['tokens_per_s']:.1f} tok/s, identical {out[v]['identical']}/{len(eps)}",
              flush=True)
    return out


def evaluations(policy, env, tasks, variants: list[str], batch: int, max_turns: int) -> dict[str, dict]:
    """Per engine and batch size (1, ``batch``): the frozen evaluation of ``tasks`` (``evaluate``, as the
    held-out evaluation plays them): CPU seconds, generated tokens, tokens/s, and how many episodes equal
    the first row's (the first engine, one episode at a time) token for token."""
    from lit_ascent.evaluate import evaluate

    out, ref = {}, None
    for v in variants:
        for b in (1, batch):
            with Clock() as c:
                eps = evaluate(policy, env, tasks, _cfg(v, max_turns=max_turns), batch_size=b)
            close_engines(policy.model)
            gen = sum(e.timings["generated_tokens"] for e in eps)
            ref = ref or eps
            out[f"{v} x{b}"] = {"engine": v, "batch": b, "cpu_s": c.cpu, "generated_tokens": gen,
                                "tokens_per_s": gen / c.cpu, "solved": sum(e.verified for e in eps),
                                "identical": sum(a.token_ids == e.token_ids for a, e in zip(ref, eps)),
                                "episodes": len(eps)}
            print(f"  evaluation {v} x{b}: {gen / c.cpu:.1f} tok/s", flush=True)
    return out


def stream(variants: list[str], num_tasks: int, work: Path, quick: bool) -> dict[str, dict]:
    """Wall seconds of one train.py stream per engine, and its per-task (task, solved, turns, actions)."""
    out = {}
    for v in variants:
        run = work / v
        overlay = run / "engine.yaml"
        run.mkdir(parents=True)
        fused = VARIANTS[v].get("fused")
        lookup = f", fused: {{prompt_lookup: {fused.prompt_lookup}}}" if fused else ""
        overlay.write_text(f"model:\n  rollout: {{engine: {v.split('+')[0]}{lookup}}}\n")
        config = "configs/debug.yaml" if quick else "configs/textcraft/ascent.yaml"
        cmd = [sys.executable, "train.py", "fit", "--config", config, "--config", str(overlay),
               "--data.num_tasks", str(num_tasks), "--trainer.default_root_dir", str(run)]
        print(" ".join(cmd), flush=True)
        t0, cpu0 = time.perf_counter(), _children_cpu()
        with open(run / "log.txt", "w") as f:
            rc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode
        wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
        if rc != 0:
            sys.exit(f"{v}: train.py failed ({rc}); its output: {run / 'log.txt'}")
        recs = read_records(next(run.rglob(LOG_NAME)))
        out[v] = {"wall_s": wall, "cpu_s": cpu, "solved": sum(r["verified"] for r in recs), "tasks": len(recs),
                  "updates": sum(r["updates"] for r in recs),
                  "records": [(r["task_id"], r["verified"], r["turns"], r["actions"]) for r in recs]}
        print(f"  stream {v}: {wall:.0f} s, solved {out[v]['solved']}/{len(recs)}", flush=True)
    return out


def _children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(args) -> dict:
    t0 = time.perf_counter()
    torch.set_num_threads(1)
    llm = ModelConfig(name_or_path=TINY, dtype=args.dtype) if args.quick else \
        ModelConfig(dtype=args.dtype, warm_start_adapter=REFERENCE)
    policy = load_policy(llm)
    policy.model.eval()
    r: dict = {"quick": args.quick, "machine": machine(), "engines": args.engines, "dtype": args.dtype}
    weight_bytes = sum(p.numel() * p.element_size() for p in {id(p): p for p in policy.model.parameters()}.values()
                       if not p.requires_grad)
    r["weight_bytes"] = weight_bytes
    r["copy_gb_s"], r["read_gb_s"] = copy_bandwidth() / 1e9, read_bandwidth() / 1e9
    r["bound_tok_s"] = {"copy": r["copy_gb_s"] * 1e9 / weight_bytes, "read": r["read_gb_s"] * 1e9 / weight_bytes}
    decode_variants = [v for v in args.engines if "+" not in v]
    perturb(policy.model)
    print("decode", flush=True)
    r["decode_tok_s"] = decode_rates(policy, decode_variants, 256, 16 if args.quick else 48)
    with Clock() as c:
        folded = FusedWeights(policy.model)
    r["fold_s"] = c.cpu
    r["matvec_tok_s"] = matvec_rate(folded, 16 if args.quick else 48)
    del folded
    perturb(policy.model, scale=0.0)  # the reference base as a stream starts: zero fast weights
    if args.quick:
        from lit_ascent.envs import ScriptedEnv

        env = ScriptedEnv(num_tasks=4, episode_steps=4, verify_every=2)
    else:
        from lit_ascent.envs.textcraft import TextCraftEnv

        env = TextCraftEnv(depths=[2], split="eval")
    print("episodes", flush=True)
    r["episodes"] = episodes(policy, env, env.tasks()[: args.episodes], args.engines, 10)
    if args.eval_tasks:
        print("evaluations", flush=True)
        r["eval_turns"] = 20
        r["evaluations"] = evaluations(policy, env, env.tasks()[: args.eval_tasks], args.engines, args.eval_batch,
                                       r["eval_turns"])
    if args.stream_tasks:
        print("streams", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench_engines_") as work:
            r["stream"] = stream(args.engines, args.stream_tasks, Path(work), args.quick)
    r["total_s"] = time.perf_counter() - t0
    return r


def markdown(r: dict) -> str:
    m, b = r["machine"], r["bound_tok_s"]
    model = "tiny random model (--quick)" if r["quick"] else f"SmolLM2-135M + {REFERENCE}"
    lines = [f"# Bench: rollout engines, {model}, {r.get('dtype', 'float32')}", "",
             f"{m['date']}; {m['cpu']}, {m['cores']} cores, torch {m['torch']}, 1 intra-op thread, 1-min load "
             f"average {m['load_avg_1min']:.1f} at the start; `python -m lit_ascent.bench.engines"
             f"{' --quick' if r['quick'] else ''}{' --dtype ' + r['dtype'] if r.get('dtype', 'float32') != 'float32' else ''}` in {r['total_s'] / 60:.1f} min.", "",
             f"Weights {r['weight_bytes'] / 2**20:.0f} MiB; copy bandwidth {r['copy_gb_s']:.1f} GB/s, read "
             f"bandwidth {r['read_gb_s']:.1f} GB/s: bounds {b['copy']:.1f} (copy) and {b['read']:.1f} (read) tok/s.", "",
             "| engine | decode tok/s | of the copy bound | of the read bound |", "|---|---|---|---|"]
    for v, tok_s in r["decode_tok_s"].items():
        lines.append(f"| {v} | {tok_s:.1f} | {tok_s / b['copy']:.0%} | {tok_s / b['read']:.0%} |")
    if "matvec_tok_s" in r:  # runs before this row was measured lack it
        m = r["matvec_tok_s"]
        lines.append(f"| (the weights' matrix-vector products alone) | {m:.1f} | {m / b['copy']:.0%} | {m / b['read']:.0%} |")
    lines += ["", f"Decode: 48 greedy tokens after a 256-token random prompt, non-zero fast weights (the LoRA "
              f"runs or is folded in). Folding the adapter into the fused engine's weights (after each update): "
              f"{r['fold_s']:.2f} s.", "",
              f"Real episodes ({next(iter(r['episodes'].values()))['episodes']} tasks, 10 turns at most, "
              "the reference base with zero fast weights, as a stream starts):", "",
              "| engine | CPU s | generated tokens | tok/s | vs hf | episodes equal to hf | solved |",
              "|---|---|---|---|---|---|---|"]
    hf = r["episodes"].get("hf")
    for v, e in r["episodes"].items():
        speed = f"{e['tokens_per_s'] / hf['tokens_per_s']:.2f}x" if hf else ""
        lines.append(f"| {v} | {e['cpu_s']:.1f} | {e['generated_tokens']} | {e['tokens_per_s']:.1f} | {speed} | "
                     f"{e['identical']}/{e['episodes']} | {e['solved']} |")
    if "evaluations" in r:
        first = next(iter(r["evaluations"].values()))
        lines += ["", f"Frozen evaluation (`evaluate`, as the held-out evaluation plays its tasks): {first['episodes']} "
                  f"tasks, {r['eval_turns']} turns at most, one episode at a time (x1) and batched (x{r['evaluations'][next(reversed(r['evaluations']))]['batch']}: "
                  "fused keeps that many episodes in flight, each on its own cache; hf decodes groups over one padded "
                  "transformers cache):", "",
                  "| engine | batch | CPU s | generated tokens | tok/s | vs first | episodes equal to first | solved |",
                  "|---|---|---|---|---|---|---|---|"]
        for e in r["evaluations"].values():
            lines.append(f"| {e['engine']} | {e['batch']} | {e['cpu_s']:.1f} | {e['generated_tokens']} | "
                         f"{e['tokens_per_s']:.1f} | {e['tokens_per_s'] / first['tokens_per_s']:.2f}x | "
                         f"{e['identical']}/{e['episodes']} | {e['solved']} |")
    if "stream" in r:
        first = next(iter(r["stream"].values()))
        lines += ["", f"Streams: `train.py` on the TextCraft reference config, {first['tasks']} tasks, one engine "
                  "after the other (start-up included; CPU s: all of train.py's threads, so waiting for a shared core is "
                  "not counted):", "",
                  "| engine | wall s | CPU s | CPU vs first | solved | updates | same per-task actions as first |",
                  "|---|---|---|---|---|---|---|"]
        for v, s in r["stream"].items():
            lines.append(f"| {v} | {s['wall_s']:.0f} | {s['cpu_s']:.0f} | {s['cpu_s'] / first['cpu_s']:.2f}x | "
                         f"{s['solved']}/{s['tasks']} | "
                         f"{s['updates']} | {'yes' if s['records'] == first['records'] else 'no'} |")
    lines.append("")
    return "\n".join(lines)


@dataclass
class EnginesBenchOptions:
    """The command line of ``python -m lit_ascent.bench.engines``."""

    quick: bool = False
    """Tiny model, scripted environment: the bench itself."""
    out: str = "docs/results/bench_engines"
    """Output path without extension."""
    engines: list[str] = field(default_factory=lambda: ["hf", "fused", "fused+lookup"])
    """Rows of VARIANTS, hf first (the reference the others are compared with)."""
    episodes: int = 4
    """Real episodes per engine."""
    eval_tasks: int = 8
    """Tasks of the frozen-evaluation rows per engine and batch size (0: skip)."""
    eval_batch: int = 8
    """Batch size of the batched evaluation rows."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Model dtype (float32: engines must give equal tokens; bfloat16: how often they do)."""
    stream_tasks: int = 10
    """Tasks of the train.py stream per engine (0: skip)."""

    def __post_init__(self) -> None:
        unknown = [e for e in self.engines if e not in VARIANTS]
        if unknown:
            raise ValueError(f"--engines: {', '.join(unknown)} not among {', '.join(VARIANTS)}")
        if "hf" not in self.engines[:1]:
            raise ValueError("--engines must start with hf (the reference the others are compared with)")


def main(argv: list[str] | None = None) -> None:
    args = parse_options(EnginesBenchOptions, argv, prog="python -m lit_ascent.bench.engines",
                         description=__doc__.split("\n\n")[0])
    result = run(args)
    save(args.out, result, markdown(result))


if __name__ == "__main__":
    main()
