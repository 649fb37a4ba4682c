"""Command line of the warm start.

    python -m lit_ascent.warmstart [train] --env textcraft --out adapters/textcraft-ref \
        [--num-plain 100 --num-recovery 100 --num-hindsight 100 --epochs 1 --lr 5e-4 --rank 16 --seed 0]
    python -m lit_ascent.warmstart eval --adapter adapters/textcraft-ref --env textcraft \
        --num-tasks 30 [--hindsight] [--control]
"""
from __future__ import annotations

import dataclasses
import json
import logging
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lit_ascent.models import LoraSettings, ModelConfig, load_policy
from lit_ascent.options import parse_options
from lit_ascent.rollout import RolloutConfig
from lit_ascent.warmstart.sources import ENVS, STREAM_BALANCE

log = logging.getLogger("lit_ascent.warmstart")
DTYPES = ("auto", "bfloat16", "float32", "float16")


def _check_common(env: str, dtype: str) -> None:
    if env not in ENVS:
        raise ValueError(f"--env must be one of {ENVS}, got {env!r}")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype must be one of {DTYPES}, got {dtype!r}")


@dataclass
class TrainArgs:
    """Settings of the warm-start recipe (demos + behaviour cloning)."""

    out: str
    """Output folder of the adapter, recipe.json and demos.jsonl."""
    env: str = "textcraft"
    """textcraft | alfworld | webshop."""
    num_plain: int = 100
    """Planner demos."""
    num_recovery: int = 100
    """Demos with one wrong action, the env's error, then the fix."""
    num_hindsight: int = 100
    """Demos with the same task's verified trajectory in the system prompt."""
    epochs: int = 1
    """Passes over the demos."""
    lr: float = 5e-4
    """AdamW learning rate."""
    rank: int = LoraSettings.rank
    """LoRA rank (all linear layers)."""
    alpha: float = LoraSettings.alpha
    """LoRA alpha."""
    seed: int = 0
    """Seed of the task order, the shuffles and the LoRA init."""
    max_demo_tokens: int | None = field(default=None, metadata={"aliases": ["--max-demos-tokens"]})
    """Drop demos whose token sequence is longer (None: keep all)."""
    depths: list[int] = field(default_factory=lambda: [2])
    """TextCraft goal depths (configs/textcraft/ascent.yaml uses [2])."""
    demos_jsonl: str | None = None
    """ALFWorld: planner demos from `python -m lit_ascent.warmstart.planner_cache` (valid_train)."""
    model: str = ModelConfig.name_or_path
    """Base model: any ModelConfig name_or_path (tiny-random for tests)."""
    dtype: str = ModelConfig.dtype
    """auto (bf16 where supported) | bfloat16 | float32 | float16."""
    learn_mistakes: bool = False
    """Also clone the mistake turns of recovery demos (default: they are context only)."""
    grad_clip: float = 1.0
    """Gradient-norm clip (0: off)."""

    def __post_init__(self) -> None:
        _check_common(self.env, self.dtype)
        for name in ("num_plain", "num_recovery", "num_hindsight"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.num_plain + self.num_recovery + self.num_hindsight == 0:
            raise ValueError("--num-plain + --num-recovery + --num-hindsight must be > 0")
        if self.epochs < 1:
            raise ValueError(f"--epochs must be >= 1, got {self.epochs}")
        if not self.lr > 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if self.max_demo_tokens is not None and self.max_demo_tokens < 1:
            raise ValueError(f"--max-demo-tokens must be >= 1, got {self.max_demo_tokens}")
        if not self.depths or any(d not in (2, 3, 4) for d in self.depths):
            raise ValueError(f"--depths must be a non-empty subset of [2, 3, 4], got {self.depths}")
        if self.grad_clip < 0:
            raise ValueError(f"--grad-clip must be >= 0, got {self.grad_clip}")
        LoraSettings(rank=self.rank, alpha=self.alpha)  # validates rank and alpha


@dataclass
class EvalArgs:
    """Settings of the reference evaluation."""

    adapter: str | None = None
    """Warm-start adapter folder (None: the base model as it is)."""
    fast_weights: str | None = None
    """A stream run's saved fast weights (``<run>/adapter/final``), evaluated frozen on top of --adapter
    (the transfer of what the stream learned, e.g. to --split valid_unseen)."""
    env: str = "textcraft"
    """textcraft | alfworld | webshop."""
    num_tasks: int = 30
    """Evaluation tasks: the first of the stream's order (family-balanced for ALFWorld)."""
    hindsight: bool = False
    """Also evaluate with the same task's verified trajectory in the prompt."""
    control: bool = False
    """Also evaluate with the hindsight block of a different task of the same depth/family."""
    depths: list[int] = field(default_factory=lambda: [2])
    """TextCraft goal depths."""
    split: str | None = None
    """Evaluation split (default: eval for textcraft, valid_seen for alfworld, the stream partition for webshop)."""
    max_distractors: int = 10
    """TextCraft: most unneeded crafting commands shown (the stream config's data.env value)."""
    seed: int = 0
    """Seed of the task order (0 = the stream's order with data.seed 0)."""
    max_turns: int = RolloutConfig.max_turns
    """Turn budget per episode."""
    max_new_tokens: int = 128
    """Token budget per assistant turn: the stream configs' value (configs/textcraft/ascent.yaml), above
    RolloutConfig's 96 because the first plan turn is the longest."""
    batch_size: int = 1
    """Episodes decoded together (1: sequential, the stream's exact decoding)."""
    model: str = ModelConfig.name_or_path
    """Base model (ModelConfig name_or_path)."""
    dtype: str = ModelConfig.dtype
    """Model dtype."""
    out: str | None = None
    """JSON output (default: <adapter>/eval_<env>.json, else warmstart_eval_<env>.json)."""
    resume: bool = False
    """Continue an interrupted evaluation from the episodes saved in the output JSON (same settings)."""

    def __post_init__(self) -> None:
        _check_common(self.env, self.dtype)
        if self.num_tasks < 1 or (self.control and self.num_tasks < 2):
            raise ValueError(f"--num-tasks must be >= 1 (>= 2 with --control), got {self.num_tasks}")
        for flag, folder in (("--adapter", self.adapter), ("--fast-weights", self.fast_weights)):
            if folder is not None and not (Path(folder) / "adapter_config.json").is_file():
                raise ValueError(f"{flag}: no adapter folder (adapter_config.json) at {folder!r}")
        RolloutConfig(max_turns=self.max_turns, max_new_tokens=self.max_new_tokens)
        if self.max_distractors < 0:
            raise ValueError(f"--max-distractors must be >= 0, got {self.max_distractors}")
        if self.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {self.batch_size}")

    def modes(self) -> list[str]:
        return ["plain"] + ["hindsight"] * self.hindsight + ["control"] * self.control

    def output_path(self) -> Path:
        if self.out:
            return Path(self.out)
        if self.fast_weights:
            return Path(self.fast_weights) / f"eval_{self.env}_{self.split or 'default'}.json"
        return Path(self.adapter or ".") / (f"eval_{self.env}.json" if self.adapter else f"warmstart_eval_{self.env}.json")


def parse(argv: list[str]) -> TrainArgs | EvalArgs:
    """The options of ``[train] ...`` (the default command) or ``eval ...``."""
    command = "train"
    if argv and argv[0] in ("train", "eval"):
        command, argv = argv[0], argv[1:]
    cls = TrainArgs if command == "train" else EvalArgs
    return parse_options(cls, argv, prog=f"python -m lit_ascent.warmstart {command}")


def run_train(args: TrainArgs, command: str) -> dict:
    from lit_ascent.warmstart.demos import build_demos
    from lit_ascent.warmstart.sources import training_source
    from lit_ascent.warmstart.train import git_commit, save_adapter, train_adapter

    t0 = time.perf_counter()
    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = ModelConfig(name_or_path=args.model, dtype=args.dtype, lora=LoraSettings(rank=args.rank, alpha=args.alpha))
    policy = load_policy(cfg, device)
    load_s, t1 = time.perf_counter() - t0, time.perf_counter()
    source = training_source(args.env, args.depths, args.seed, args.demos_jsonl)
    counts = {"plain": args.num_plain, "recovery": args.num_recovery, "hindsight": args.num_hindsight}
    demos, stats = build_demos(policy.tokenizer, source.env, source.tasks, counts, source.scripts,
                               args.max_demo_tokens)
    demo_s = time.perf_counter() - t1
    log.info("demos: %s (%.1f s)", stats.as_dict(), demo_s)
    figures = train_adapter(policy, demos, args.epochs, args.lr, args.seed, grad_clip=args.grad_clip,
                            learn_mistakes=args.learn_mistakes)
    recipe = {"command": command, "args": dataclasses.asdict(args), "demos": stats.as_dict(),
              "demo_tokens": sum(len(d.episode.token_ids) for d in demos), "load_s": round(load_s, 2),
              "demo_build_s": round(demo_s, 2),
              **figures, "total_s": round(time.perf_counter() - t0, 2), "device": device,
              "dtype": str(next(policy.model.parameters()).dtype), "git_commit": git_commit(Path(__file__).parent),
              "train_goals": sorted({d.episode.task.task_id for d in demos})}
    save_adapter(policy, args.out, recipe, demos)
    log.info("saved %s: loss/bc per epoch %s, %.0f tokens/s", args.out, figures["epoch_loss"], figures["tokens_per_s"])
    return recipe


def model_config(args: EvalArgs) -> ModelConfig:
    """The evaluated model: base + merged --adapter, and --fast-weights as the (frozen) fast weights."""
    if not args.fast_weights:
        return ModelConfig(name_or_path=args.model, dtype=args.dtype, warm_start_adapter=args.adapter)
    saved = json.loads((Path(args.fast_weights) / "adapter_config.json").read_text())
    lora = LoraSettings(rank=saved["r"], alpha=saved["lora_alpha"], target_modules=saved["target_modules"])
    return ModelConfig(name_or_path=args.model, dtype=args.dtype, warm_start_adapter=args.adapter, lora=lora,
                       init_adapter=args.fast_weights)


def saved_episodes(path: Path, settings: dict) -> tuple[dict[str, list[dict]], float]:
    """({mode: episode records}, seconds spent) of an earlier run of the same evaluation at ``path``."""
    if not path.is_file():
        log.info("--resume: no earlier results at %s; starting from the first task", path)
        return {}, 0.0
    report = json.loads(path.read_text())
    changed = sorted(k for k in settings if k != "out" and report.get("args", {}).get(k) != settings[k])
    if changed:  # the output path is where the file is, not a setting (it may have been moved)
        raise ValueError(f"--resume: {path} was written with other settings ({', '.join(changed)}); "
                         "rerun with those settings or another --out")
    done = {m: row["episodes"] for m, row in report["rows"].items()} | report.get("partial", {})
    log.info("--resume: %s", ", ".join(f"{m} {len(r)} episodes" for m, r in done.items()) or "nothing saved yet")
    return done, float(report.get("eval_s", 0.0))


def run_eval(args: EvalArgs) -> dict:
    from lit_ascent.warmstart.eval import eval_tasks, evaluate_modes, markdown_table
    from lit_ascent.warmstart.sources import evaluation_source

    device = "cuda" if torch.cuda.is_available() else "cpu"
    policy = load_policy(model_config(args), device)
    env, tasks, reference = evaluation_source(args.env, args.depths, args.split, args.max_distractors)
    tasks = eval_tasks(tasks, args.num_tasks, args.seed, STREAM_BALANCE[args.env])
    cfg = RolloutConfig(max_turns=args.max_turns, max_new_tokens=args.max_new_tokens)
    path = args.output_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in dataclasses.asdict(args).items() if k != "resume"}
    done, spent = saved_episodes(path, settings) if args.resume else ({}, 0.0)
    t0 = time.perf_counter() - spent

    def save(rows: dict, partial: dict[str, list[dict]]) -> dict:  # after every group of episodes
        report = {"args": settings, "eval_s": round(time.perf_counter() - t0, 2), "rows": rows}
        if partial:
            report["partial"] = partial
        path.write_text(json.dumps(report, indent=2) + "\n")
        return report

    rows = evaluate_modes(policy, env, tasks, cfg, args.modes(), reference, on_row=save,
                          batch_size=args.batch_size, done=done)
    report = save(rows, {})
    print(markdown_table(rows))
    print(json.dumps({m: {k: v for k, v in r.items() if k != "episodes"} for m, r in rows.items()}))
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse(argv)
    if isinstance(args, TrainArgs):
        run_train(args, shlex.join(["python", "-m", "lit_ascent.warmstart", *argv]))
    else:
        run_eval(args)
    return 0
