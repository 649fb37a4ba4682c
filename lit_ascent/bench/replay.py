"""What a replayed episode costs next to a fresh one, and what its cached targets weigh.

    python -m lit_ascent.bench.replay [--dtype auto] [--reps 3] [--out docs/results/bench_replay]

A fresh update of an episode pays the objective's ``prepare`` (the teacher's forward on
the privileged view) and the student's forward and backward; a replayed one reuses the
cached ``prepare`` output and pays only the student's side. Episodes: a real TextCraft
episode (the solver's plan replayed through the environment, so the token layout and
observations are real) and a synthetic 1,024-token one of the same shape
(``bench.memory.synthetic_episode``). Times are process CPU seconds, the median of
``--reps`` repetitions, measured in one run.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lit_ascent.bench.memory import synthetic_episode
from lit_ascent.models import ModelConfig, Policy, load_policy
from lit_ascent.objectives import Distillation
from lit_ascent.options import parse_options
from lit_ascent.objectives.experience_replay import tensor_bytes
from lit_ascent.trajectory import Episode


def cpu_seconds(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def replay_cost(policy: Policy, episode: Episode, reps: int, teacher_top_k: int | None = None) -> dict:
    """CPU seconds of a fresh and a replayed update of ``episode`` and the cached bytes."""
    obj = Distillation(chunk_size=256, teacher_top_k=teacher_top_k)
    policy.model.train()
    prepared = obj.prepare(policy, episode)

    def student():
        obj.loss(policy, episode, prepared).loss.backward()
        policy.model.zero_grad(set_to_none=True)

    def fresh():
        obj.loss(policy, episode, obj.prepare(policy, episode)).loss.backward()
        policy.model.zero_grad(set_to_none=True)

    fresh_s, replayed_s = cpu_seconds(fresh, reps), cpu_seconds(student, reps)
    n = len(prepared[0])
    return {"tokens": len(episode.token_ids), "targets": n, "teacher_top_k": teacher_top_k,
            "fresh_s": fresh_s, "replayed_s": replayed_s, "replayed_over_fresh": replayed_s / fresh_s,
            "cached_bytes": tensor_bytes(prepared), "cached_bytes_per_target": tensor_bytes(prepared) / n}


def real_episode(policy: Policy) -> Episode:
    """The TextCraft solver's plan for the first eval goal, replayed (templated thoughts)."""
    from lit_ascent.envs.textcraft import TextCraftEnv
    from lit_ascent.envs.textcraft_solver import solve
    from lit_ascent.replay import replay

    env = TextCraftEnv(depths=[2], split="eval")
    task = env.tasks()[0]
    texts = [f"Thought: the plan says {a.split(' ')[0]} next.\nAction: {a}" for a in solve(env, task)]
    ep = replay(policy.tokenizer, env, task, texts)
    if not ep.verified:
        raise RuntimeError(f"bench_replay: the solver's episode of {task.task_id} was not verified")
    return ep


def cache_formula(targets: int, hidden: int, dtype_bytes: int, top_k: int | None) -> int:
    """Bytes one cached episode holds: positions (8 B each) + teacher hidden states (d values each),
    or with top-k targets: k indices (8 B) + k log-probs (4 B) + the tail mass (4 B) per target."""
    per_target = 8 + (hidden * dtype_bytes if top_k is None else top_k * 12 + 4)
    return targets * per_target


def markdown(r: dict) -> str:
    lines = [f"# Replay cost: SmolLM2-135M ({r['dtype']})", "",
             f"`python -m lit_ascent.bench.replay` on {r['date']}, {r['threads']} intra-op thread(s); "
             "median CPU seconds of one update.", "",
             "| episode | tokens | targets | fresh update s | replayed update s | replayed / fresh | cached KiB |",
             "|---|---|---|---|---|---|---|"]
    for name, row in r["episodes"].items():
        lines.append(f"| {name} | {row['tokens']} | {row['targets']} | {row['fresh_s']:.2f} | {row['replayed_s']:.2f} "
                     f"| {row['replayed_over_fresh']:.2f} | {row['cached_bytes'] / 1024:.0f} |")
    lines += ["", "Cached bytes per episode = targets x (8 + d x bytes) for teacher hidden states (d = hidden size; "
              "the vocabulary never enters: the logits are rebuilt from the frozen head), or "
              "targets x (8 + 12 k + 4) with `teacher_top_k = k`. For 500 targets:", "",
              "| model | hidden d | bf16 hidden states | top-k 64 |", "|---|---|---|---|"]
    for name, d in (("SmolLM2-135M", 576), ("4B (d = 2560, V ~ 150k)", 2560), ("9B (d = 4096, V ~ 150k)", 4096)):
        lines.append(f"| {name} | {d} | {cache_formula(500, d, 2, None) / 2**20:.2f} MiB "
                     f"| {cache_formula(500, d, 2, 64) / 2**20:.2f} MiB |")
    lines += ["", "Caching full-vocabulary logits instead would take targets x V x 2 bytes: "
              f"{500 * 150_000 * 2 / 2**20:.0f} MiB per 500-target episode at V = 150k.", ""]
    return "\n".join(lines)


@dataclass
class ReplayBenchOptions:
    """The command line of ``python -m lit_ascent.bench.replay``."""

    dtype: str = "auto"
    """Model dtype: auto | bfloat16 | float32."""
    reps: int = 3
    """Repetitions per measurement (median)."""
    threads: int = 1
    """torch intra-op threads."""
    out: str = "docs/results/bench_replay"
    """Output path without extension."""


def main(argv: list[str] | None = None) -> None:
    args = parse_options(ReplayBenchOptions, argv, prog="python -m lit_ascent.bench.replay",
                         description=__doc__.split("\n\n")[0])
    torch.set_num_threads(args.threads)
    policy = load_policy(ModelConfig(dtype=args.dtype, warm_start_adapter="adapters/textcraft-ref"))
    dtype = str(next(policy.model.parameters()).dtype).removeprefix("torch.")
    episodes = {"TextCraft solver episode": real_episode(policy),
                "synthetic 1,024 tokens": synthetic_episode(policy.tokenizer, 1024)}
    r = {"dtype": dtype, "threads": args.threads, "date": time.strftime("%Y-%m-%d"), "episodes": {}}
    for name, ep in episodes.items():
        r["episodes"][name] = replay_cost(policy, ep, args.reps)
        print(name, r["episodes"][name], flush=True)
    r["episodes"]["synthetic 1,024 tokens, top-k 64"] = replay_cost(policy, episodes["synthetic 1,024 tokens"],
                                                                      args.reps, teacher_top_k=64)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(r, indent=1))
    out.with_suffix(".md").write_text(markdown(r))
    print(markdown(r))


if __name__ == "__main__":
    main()
