"""Throughput and memory bench on the embedded SmolLM2-135M and TextCraft.

    python -m lit_ascent.bench [--quick] [--out docs/results/bench] [--threads 1] [--dtype auto]

Everything is measured in one process and one run, and reported as ratios:
the CPU is shared, so absolute times move with the load while ratios of
quantities measured minutes apart in the same process stay comparable. Times
are process CPU seconds (``time.process_time``) with one intra-op thread by
default: on a shared CPU that counts the work this process did, not the time it
waited for a core; wall seconds are kept in the JSON too. Peak memory is
measured in child processes (``lit_ascent.bench.memory``). Writes ``<out>.json`` and
``<out>.md``.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lit_ascent.attention import use_packed_gqa
from lit_ascent.bench.memory import CASES, measure_memory, synthetic_episode
from lit_ascent.envs.base import StepResult, TextEnv
from lit_ascent.evaluate import evaluate
from lit_ascent.models import ModelConfig, Policy, load_policy, skip_zero_adapter
from lit_ascent.objectives import Distillation
from lit_ascent.options import parse_options
from lit_ascent.privileged import teacher_sequence
from lit_ascent.engines.hf import IncrementalDecoder
from lit_ascent.rollout import EpisodeRun, RolloutConfig, rollout
from lit_ascent.trajectory import Episode, Task

TARGETS = {"reuse_speedup_20": 2.0, "decode_of_bound": 0.6, "update_of_matmul": 0.5,
           "teacher_mem_ratio": 0.6, "batch8_speedup": 3.0}


class Clock:
    """CPU and wall seconds of a block (``with Clock() as c: ...; c.cpu``). Once CUDA is in use the
    block is bracketed by synchronisations, and ``spent`` is its wall time (the GPU's work), else CPU time."""

    def __enter__(self):
        self._cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if self._cuda:
            torch.cuda.synchronize()
        self._c, self._w = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self._cuda:
            torch.cuda.synchronize()
        self.cpu, self.wall = time.process_time() - self._c, time.perf_counter() - self._w

    @property
    def spent(self) -> float:
        """Seconds the work took: wall time on a GPU, process CPU time on the CPU."""
        return self.wall if self._cuda else self.cpu


def machine() -> dict:
    model = next((ln.split(":", 1)[1].strip() for ln in _run(["lscpu"]).splitlines()
                  if ln.startswith("Model name")), platform.processor())
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": model, "cores": os.cpu_count(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "load_avg_1min": os.getloadavg()[0]}


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout
    except OSError:
        return ""


def copy_bandwidth(mib: int = 256, reps: int = 5, device: str = "cpu") -> float:
    """Bytes/s of a large tensor copy (read + write) on ``device``, best of ``reps``."""
    src = torch.ones(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(reps):
        with Clock() as c:
            dst.copy_(src)
        best = min(best, c.spent)
    return 2 * src.numel() * 4 / best


def matmul_flops(dtype: torch.dtype, n: int = 1024, reps: int = 5, device: str = "cpu") -> float:
    """FLOP/s of an (n, n) @ (n, n) torch.matmul on ``device``, best of ``reps``."""
    a, b = torch.randn(n, n).to(device, dtype), torch.randn(n, n).to(device, dtype)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(reps):
        with Clock() as c:
            torch.matmul(a, b)
        best = min(best, c.spent)
    return 2 * n**3 / best


class FixedTurnsEnv(TextEnv):
    """TextCraft's prompt and first observation, then one fixed reply to every action, never done.

    The real game would end or change episodes with the model's actions; this
    forces exactly ``max_turns`` comparable turns for the cache comparison.
    """

    name = "textcraft-fixed"

    def __init__(self, base: TextEnv, reply: str = "Got 1 oak logs"):
        self.base, self.reply = base, reply

    def tasks(self) -> list[Task]:
        return self.base.tasks()

    def reset(self, task: Task) -> str:
        return self.base.reset(task)

    def system_prompt(self) -> str:
        return self.base.system_prompt()

    def step(self, action: str) -> StepResult:
        return StepResult(self.reply)


def reprefill_rollout(model, tokenizer, env: TextEnv, task: Task, cfg: RolloutConfig) -> Episode:
    """The same episode as ``rollout``, but every turn runs plain ``model.generate`` on the whole history."""
    run = EpisodeRun(tokenizer, env, task, cfg)
    eos = tokenizer.eos_token_id
    while (budget := run.budget()) > 0:
        ids = torch.tensor([run.ep.token_ids], device=model.device)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget,
                             do_sample=False, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
        gen = out[0, ids.shape[1]:].tolist()
        if run.end_turn(gen, bool(gen) and gen[-1] == eos) is None:
            break
    return run.finish()


def episode_throughput(policy: Policy, env: TextEnv, task: Task, turns: list[int], new_tokens: int) -> list[dict]:
    rows = []
    for n in turns:
        cfg = RolloutConfig(max_turns=n, max_new_tokens=new_tokens, stop_after_action=False)
        with torch.no_grad(), Clock() as cached:
            ep = rollout(policy.model, policy.tokenizer, env, task, cfg)
        with torch.no_grad(), skip_zero_adapter(policy.model), Clock() as full:  # as rollout does
            ref = reprefill_rollout(policy.model, policy.tokenizer, env, task, cfg)
        rows.append({"turns": n, "tokens": len(ep.token_ids), "cached_s": cached.cpu, "reprefill_s": full.cpu,
                     "cached_wall_s": cached.wall, "reprefill_wall_s": full.wall,
                     "speedup": full.cpu / cached.cpu, "same_tokens": ep.token_ids == ref.token_ids})
        print(f"  episode {n} turns: speedup {rows[-1]['speedup']:.2f}", flush=True)
    return rows


def decoder_tok_s(model, ids: list[int], tokens: int, ctx) -> float:
    """Tokens per CPU second of the rollout decoder after pre-filling ``ids`` (not timed), inside ``ctx``."""
    with ctx:
        dec = IncrementalDecoder(model, set())
        dec.extend(ids)
        dec.generate(1)
        with Clock() as c:
            dec.generate(tokens)
    return tokens / c.spent


def decode_rate(policy: Policy, prompt_len: int, tokens: int, bandwidth: float) -> dict:
    """Decode tokens/s of the rollout decoder and of plain generate, against the bandwidth bound."""
    model = policy.model
    ids = torch.randint(100, 20000, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    rate = decoder_tok_s(model, ids, tokens, contextlib.nullcontext())  # the LoRA ops run (as after any update)
    skipped = decoder_tok_s(model, ids, tokens, skip_zero_adapter(model))  # B = 0: the rollout skips them
    x = torch.tensor([ids])
    with Clock() as g0:  # generate = prefill + decode; time a 1-token generate to subtract the prefill
        model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=1, do_sample=False)
    with Clock() as g:
        model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=tokens + 1,
                       min_new_tokens=tokens + 1, do_sample=False)
    weight_bytes = sum(p.numel() * p.element_size() for p in {id(p): p for p in model.parameters()}.values())
    bound = bandwidth / weight_bytes
    return {"prompt_tokens": prompt_len, "tokens": tokens, "decoder_tok_s": rate,
            "zero_adapter_skipped_tok_s": skipped,
            "generate_tok_s": tokens / max(g.cpu - g0.cpu, 1e-9), "weight_bytes": weight_bytes,
            "bound_tok_s": bound, "of_bound": rate / bound}


def packed_gqa_decode(policy: Policy, context: int, tokens: int) -> dict:
    """Decode tokens/s after ``context`` cached tokens: transformers' sdpa vs ``packed_gqa_sdpa``."""
    model = policy.model
    ids = torch.randint(100, 20000, (context,), generator=torch.Generator().manual_seed(1)).tolist()
    base = model.get_base_model()
    default = decoder_tok_s(model, ids, tokens, skip_zero_adapter(model))
    packed = decoder_tok_s(model, ids, tokens, skip_zero_adapter(model)) if use_packed_gqa(base) else float("nan")
    base.set_attn_implementation("sdpa")
    return {"context": context, "tokens": tokens, "sdpa_tok_s": default, "packed_tok_s": packed}


def update_flops(policy: Policy, episode: Episode, matmul: float) -> dict:
    """One ASCENT update (teacher forward + student forward/backward) vs 8 * params * tokens."""
    obj = Distillation(chunk_size=256)
    policy.model.train()
    with Clock() as c:
        prepared = obj.prepare(policy, episode)
        obj.loss(policy, episode, prepared).loss.backward()
    policy.model.zero_grad(set_to_none=True)
    policy.model.eval()
    params = sum(p.numel() for p in {id(p): p for p in policy.model.parameters()}.values())
    t_student = int(prepared[1])
    t_ids, _ = teacher_sequence(policy.tokenizer, episode, obj.privileged_text(episode))
    t_teacher = t_student + len(t_ids) - len(episode.token_ids)
    flops = 6 * params * t_student + 2 * params * t_teacher
    return {"tokens_student": t_student, "tokens_teacher": t_teacher, "params": params, "update_s": c.spent,
            "flop_s": flops / c.spent, "matmul_flop_s": matmul, "of_matmul": flops / c.spent / matmul}


# --- batched evaluation -------------------------------------------------------------------

def batched_eval(policy: Policy, env: TextEnv, tasks: list[Task], cfg: RolloutConfig, sizes: list[int]) -> list[dict]:
    rows, seq = [], None
    for b in sizes:
        with Clock() as c:
            eps = evaluate(policy, env, tasks, cfg, batch_size=b)
        gen = sum(e.timings["generated_tokens"] for e in eps)
        seq = seq or (eps, gen / c.spent)  # bf16 batches may change episodes: compare tokens/s, not times
        same = sum(e.token_ids == s.token_ids for e, s in zip(eps, seq[0]))
        rows.append({"batch": b, "episodes": len(eps), "s": c.spent, "wall_s": c.wall,
                     "generated_tokens": int(gen), "tokens_per_s": gen / c.spent,
                     "speedup": gen / c.spent / seq[1], "identical_to_sequential": same})
        print(f"  eval batch {b}: speedup {rows[-1]['speedup']:.2f}, identical {same}/{len(eps)}", flush=True)
    return rows


# --- report -------------------------------------------------------------------------------

def summary(r: dict) -> list[tuple[str, str, str, bool | None]]:
    """(measure, value, target, met) rows of the headline table."""
    ep = {row["turns"]: row for row in r["episodes"]}
    mem = r["memory"]
    rows = [(f"episode throughput, cached vs re-prefill, {n} turns", f"{ep[n]['speedup']:.2f}x",
             ">= 2x" if n == 20 else "", ep[n]["speedup"] >= 2.0 if n == 20 else None) for n in sorted(ep)]
    d = r["decode"]
    rows.append(("decode tokens/s of the bandwidth bound", f"{d['of_bound']:.0%} ({d['decoder_tok_s']:.1f} of "
                 f"{d['bound_tok_s']:.1f} tok/s; plain generate {d['generate_tok_s']:.1f})",
                 ">= 60%", d["of_bound"] >= 0.6))
    if "packed_gqa" in r:
        g = r["packed_gqa"]
        ratio = g["packed_tok_s"] / g["sdpa_tok_s"]
        rows.append((f"decode tokens/s after {g['context']} cached tokens, packed GQA vs sdpa",
                     f"{ratio:.2f}x ({g['packed_tok_s']:.1f} vs {g['sdpa_tok_s']:.1f} tok/s)", "", None))
    if "zero_adapter_skipped_tok_s" in d:
        rows.append(("decode tokens/s, zero adapter skipped vs LoRA ops run",
                     f"{d['zero_adapter_skipped_tok_s'] / d['decoder_tok_s']:.2f}x "
                     f"({d['zero_adapter_skipped_tok_s']:.1f} vs {d['decoder_tok_s']:.1f} tok/s)", "", None))
    u = r["update"]
    rows.append(("update-step FLOP/s of matmul FLOP/s", f"{u['of_matmul']:.0%} ({u['flop_s'] / 1e9:.1f} of "
                 f"{u['matmul_flop_s'] / 1e9:.1f} GFLOP/s)", ">= 50%", u["of_matmul"] >= 0.5))

    def net(case):  # peak above the bare runtime (python + torch + transformers)
        m = mem.get(case, {})
        return (m["peak_kib"] - m["runtime_kib"]) / 1024 if "peak_kib" in m else float("nan")

    ratio = net("disabled_ckpt") / net("two_copy_ckpt")
    rows.append(("peak memory, adapter-disabled / two-copy teacher", f"{ratio:.2f} ({net('disabled_ckpt'):.0f} vs "
                 f"{net('two_copy_ckpt'):.0f} MiB; no checkpointing {net('disabled'):.0f} MiB)",
                 "<= 0.6", ratio <= 0.6))

    def step(case):  # memory the divergence step added
        m = mem.get(case, {})
        return (m["peak_kib"] - m["before_kib"]) / 1024 if "peak_kib" in m else float("nan")

    rows.append(("divergence step memory, chunked / unchunked", f"{step('div_chunked') / step('div_unchunked'):.2f} "
                 f"({step('div_chunked'):.0f} vs {step('div_unchunked'):.0f} MiB)", "", None))
    for row in r["batched_eval"]:
        target = ">= 3x" if row["batch"] == 8 else ""
        rows.append((f"evaluation tokens/s, batch {row['batch']} vs 1", f"{row['speedup']:.2f}x "
                     f"({row['identical_to_sequential']}/{row['episodes']} episodes identical to batch 1)",
                     target, row["speedup"] >= 3.0 if row["batch"] == 8 else None))
    return rows


def markdown(r: dict) -> str:
    m = r["machine"]
    lines = [f"# Bench: SmolLM2-135M ({r['dtype']}) on TextCraft", "",
             f"{m['date']}; {m['cpu']}, {m['cores']} cores, torch {m['torch']}, {m['threads']} intra-op thread(s), "
             f"1-min load average {m['load_avg_1min']:.1f} at the start; `python -m lit_ascent.bench"
             f"{' --quick' if r['quick'] else ''}` in {r['total_s'] / 60:.1f} min.", "",
             "| measure | value | target | met |", "|---|---|---|---|"]
    for name, value, target, met in summary(r):
        lines.append(f"| {name} | {value} | {target} | {'' if met is None else ('yes' if met else 'no')} |")
    lines += ["", "Times are process CPU seconds, so waiting for a shared core is not counted. "
              "Episode throughput uses TextCraft's prompt and first observation with a fixed reply "
              "per turn (`FixedTurnsEnv`), so both decoders run the same number of turns; "
              "batched evaluation uses the real TextCraft environment (8 tasks, 2 turns of up to "
              f"{r['eval_config']['max_new_tokens']} tokens) and compares generated "
              "tokens per CPU second; in bfloat16 a batch may pick other tokens than the same episode alone "
              "(the identical counts above; float32 batches are identical, tests/test_batched_eval.py). "
              "Peak memory: child processes, kernel peak-RSS mark reset before the step "
              "(`lit_ascent.bench.memory`); teacher rows with gradient checkpointing, net of the bare runtime. "
              "Raw numbers: the JSON next to this file.", ""]
    return "\n".join(lines)


def run(quick: bool, dtype: str) -> dict:
    from lit_ascent.envs.textcraft import TextCraftEnv

    t0 = time.perf_counter()
    r: dict = {"quick": quick, "dtype": dtype, "machine": machine()}
    print("memory (child processes)", flush=True)
    length = 512 if quick else 1024
    r["memory"] = measure_memory(list(CASES), dtype, length)
    policy = load_policy(ModelConfig(dtype=dtype))
    policy.model.eval()
    r["dtype"] = str(next(policy.model.parameters()).dtype).removeprefix("torch.")
    bandwidth = copy_bandwidth()
    r["bandwidth_gb_s"] = bandwidth / 1e9
    r["matmul_flop_s"] = {str(dt): matmul_flops(dt) for dt in (torch.float32, torch.bfloat16)}
    print("decode", flush=True)
    r["decode"] = decode_rate(policy, 256, 16 if quick else 32, bandwidth)
    r["packed_gqa"] = packed_gqa_decode(policy, 1024 if quick else 3072, 16 if quick else 32)
    print("update", flush=True)
    ep = synthetic_episode(policy.tokenizer, length)
    r["update"] = update_flops(policy, ep, r["matmul_flop_s"][str(next(policy.model.parameters()).dtype)])
    env = TextCraftEnv()
    tasks = env.tasks()[:8]
    env.reset(tasks[0])  # builds the game once, outside the timed blocks
    print("episodes", flush=True)
    r["episodes"] = episode_throughput(policy, FixedTurnsEnv(env), tasks[0], [5, 20] if quick else [5, 20, 50], 4)
    print("batched evaluation", flush=True)
    cfg = RolloutConfig(max_turns=2, max_new_tokens=48 if quick else 96)  # full: the default turn budget
    r["eval_config"] = {"tasks": len(tasks), "max_turns": cfg.max_turns, "max_new_tokens": cfg.max_new_tokens}
    r["batched_eval"] = batched_eval(policy, env, tasks, cfg, [1, 4, 8])
    r["total_s"] = time.perf_counter() - t0
    return r


@dataclass
class ThroughputBenchOptions:
    """The command line of ``python -m lit_ascent.bench``."""

    quick: bool = False
    """Smaller sizes (a few minutes)."""
    out: str = "docs/results/bench"
    """Output path without extension."""
    threads: int = 1
    """torch intra-op threads (1: fair on a shared CPU)."""
    dtype: str = "auto"
    """Model dtype: auto | bfloat16 | float32."""


def main(argv: list[str] | None = None) -> None:
    args = parse_options(ThroughputBenchOptions, argv, prog="python -m lit_ascent.bench",
                         description=__doc__.split("\n\n")[0])
    torch.set_num_threads(args.threads)
    result = run(args.quick, args.dtype)
    save(args.out, result, markdown(result))


def save(out: str | Path, result: dict, text: str) -> None:
    """Write ``<out>.json`` (raw numbers) and ``<out>.md`` (``text``), and print the text."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
    out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
