"""Iterated self-distillation (SDPO / OEL style), with or without ReSAIL.

Each cycle c:
  1. the teacher becomes the model as it is now (frozen for the whole cycle);
  2. deploy: one greedy episode per task of the deployment set, no updates;
  3. PI-conditioned probe: success with the privileged information in context;
  4. distil: ``updates_per_cycle`` updates, each on a random batch of this cycle's
     verified episodes (ReSAIL's SGS selection is recomputed per batch).
After the last cycle the model is deployed and probed once more, so the log has
``cycles + 1`` rows: row c is the model after c cycles of distillation.

Teacher snapshots: the student is PEFT's "default" LoRA adapter; at the start of a
cycle its weights are copied into a second, frozen adapter named "teacher", and
``policy.teacher()`` runs the model with that adapter active under ``no_grad``.
The cycle-0 copy of the fresh adapter (B = 0) is exactly the base model. One LoRA
keeps training across cycles, so the final adapter is a single PEFT adapter.

    python -m lit_ascent.cycles --config configs/resail/debug_sdpo.yaml --config configs/resail/debug_sdpo_resail.yaml
"""
from __future__ import annotations

import contextlib
import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

from lit_ascent.engines.hf import greedy_reply
from lit_ascent.envs.base import TextEnv
from lit_ascent.envs.guarded import check_reply
from lit_ascent.evaluate import evaluate
from lit_ascent.models import ModelConfig, Policy, load_policy
from lit_ascent.objectives.resail import ReSAIL
from lit_ascent.optim import OptimConfig, guarded_step
from lit_ascent.privileged import lesson_block, lesson_request
from lit_ascent.records import outcome_rates
from lit_ascent.rollout import RolloutConfig
from lit_ascent.stream_order import stream_tasks
from lit_ascent.trajectory import Episode, Task

log = logging.getLogger(__name__)

PI_SOURCES = ("trajectory", "lesson")
LESSON_SYSTEM = "You review a verified solution of a task and write a lesson for future attempts."


@dataclass
class CyclesConfig:
    """The deployment / distillation schedule."""

    cycles: int = 3
    """Number of deploy-then-distil cycles (paper: 3)."""
    updates_per_cycle: int = 30
    """Optimiser steps per cycle (paper: 30)."""
    batch_size: int = 8
    """Verified episodes per update (the batch U)."""
    pi_source: str = "trajectory"
    """trajectory (SDPO: rendered verified trajectory) | lesson (OEL: a lesson the teacher writes)."""
    pi_valid_only: bool = True
    """Drop invalid turns from the rendered PI (the invalid-turn filter)."""
    lesson_max_tokens: int = 128
    """Token cap of a generated lesson (greedy)."""
    probe_size: int = 16
    """Tasks of the PI-conditioned probe: the first verified ones (fixed once found); 0 disables."""
    seed: int = 0
    """Seed of the batch sampling."""
    eval_batch_size: int = 1
    """Episodes decoded together when deploying / probing (1: sequential; see lit_ascent.evaluate)."""

    def __post_init__(self) -> None:
        for name in ("cycles", "updates_per_cycle", "batch_size", "lesson_max_tokens", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"cycles.{name} must be >= 1, got {getattr(self, name)}")
        if self.pi_source not in PI_SOURCES:
            raise ValueError(f"cycles.pi_source must be one of {PI_SOURCES}, got {self.pi_source!r}")
        if self.probe_size < 0:
            raise ValueError(f"cycles.probe_size must be >= 0, got {self.probe_size}")


class SnapshotTeacher(Policy):
    """Student = the "default" LoRA adapter; teacher = a frozen copy of it taken by ``snapshot``."""

    TEACHER = "teacher"

    def __init__(self, policy: Policy):
        super().__init__(policy.model, policy.tokenizer)
        self.model.add_adapter(self.TEACHER, self.model.peft_config["default"])
        self.model.set_adapter("default")  # keeps the teacher adapter frozen, the student trainable
        self.snapshot()

    @torch.no_grad()
    def snapshot(self) -> None:
        """Teacher := the student as it is now."""
        params = dict(self.model.named_parameters())
        for name, p in params.items():
            if ".default." in name and "lora_" in name:
                params[name.replace(".default.", f".{self.TEACHER}.")].copy_(p)

    @contextlib.contextmanager
    def teacher(self) -> Iterator[None]:
        """The start-of-cycle model: the teacher adapter active, no gradient."""
        self.model.set_adapter(self.TEACHER, inference_mode=True)
        try:
            with torch.no_grad():
                yield
        finally:
            self.model.set_adapter("default")


def write_lesson(policy: Policy, episode: Episode, max_tokens: int) -> str:
    """OEL-style PI: a short lesson the teacher writes (greedy) from a verified episode."""
    was_training = policy.model.training
    policy.model.eval()
    try:
        with policy.teacher():
            lesson = greedy_reply(policy.model, policy.tokenizer, LESSON_SYSTEM, lesson_request(episode), max_tokens)
    finally:
        policy.model.train(was_training)
    return lesson_block(lesson)


def privileged_texts(policy: Policy, objective: ReSAIL, episodes: list[Episode], cfg: CyclesConfig) -> list[str]:
    """The PI of each verified episode: its rendered trajectory, or a lesson written by the teacher."""
    for e in episodes:
        e.pi_valid_only = cfg.pi_valid_only
    if cfg.pi_source == "lesson":
        return [write_lesson(policy, e, cfg.lesson_max_tokens) for e in episodes]
    return [objective.privileged_text(e) for e in episodes]


def distil(policy: Policy, objective: ReSAIL, data: list[tuple[Episode, str]], updates: int, batch_size: int,
           opt: torch.optim.Optimizer, grad_clip: float, rng: random.Random) -> list[dict]:
    """``updates`` optimiser steps, each on a fresh random batch; the metrics of each step taken
    (one with no target, a non-finite loss or a non-finite gradient is skipped, see ``guarded_step``)."""
    history = []
    params = policy.trainable_parameters()
    policy.model.train()
    for _ in range(updates):
        t0 = time.perf_counter()
        batch = rng.sample(data, min(batch_size, len(data)))
        episodes, texts = [e for e, _ in batch], [z for _, z in batch]
        prepared = objective.prepare_batch(policy, episodes, texts)  # teacher side, every update
        out = objective.loss_batch(policy, episodes, prepared)
        if out is None:
            log.warning("update skipped: no target")
            continue
        stepped = guarded_step(opt, params, [out.loss], grad_clip).stepped
        opt.zero_grad(set_to_none=True)  # no gradient held through the next batch's teacher pass
        if not stepped:
            log.warning("update skipped: non-finite loss or gradient")
            continue
        history.append({**out.metrics, "perf/update_s": time.perf_counter() - t0})
    return history


def probe_success(policy: Policy, env: TextEnv, probe: list[tuple[Task, str]], cfg: RolloutConfig,
                  batch_size: int = 1) -> float | None:
    """PI-conditioned success: the current model with each task's PI in its context."""
    if not probe:
        return None
    episodes = evaluate(policy, env, [t for t, _ in probe], cfg, [z for _, z in probe], batch_size=batch_size)
    return outcome_rates(episodes)["success_rate"]


def deployment_record(cycle: int, deployed: list[Episode], probe: list[tuple[Task, str]],
                      pi_success: float | None) -> dict:
    """One cycle's outcomes. Plain probe success is read off the deployment (same weights, same tasks)."""
    rates = outcome_rates(deployed)
    solved = {e.task.task_id: e.verified for e in deployed}
    plain = sum(solved.get(t.task_id, False) for t, _ in probe) / len(probe) if probe else None
    return {"cycle": cycle, "deployed/success_rate": rates["success_rate"], "deployed/turns": rates["turns"],
            "deployed/invalid_rate": rates["invalid_rate"], "deployed/verified": sum(e.verified for e in deployed),
            "probe/pi_success": pi_success, "probe/plain_success": plain, "probe/size": len(probe)}


class CycleLog:
    """TensorBoard scalars and one JSONL row per cycle in ``log_dir``."""

    def __init__(self, log_dir: str | Path):
        from torch.utils.tensorboard import SummaryWriter

        self.dir = Path(log_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(str(self.dir))
        self.path = self.dir / "cycles.jsonl"
        self.path.write_text("")

    def scalars(self, metrics: dict, step: int) -> None:
        for k, v in metrics.items():
            if "/" in k and isinstance(v, (int, float)):
                self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def row(self, record: dict) -> None:
        self.scalars(record, record["cycle"])
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self.writer.close()


def run_cycles(policy: Policy, env: TextEnv, tasks: list[Task], objective: ReSAIL, cycles: CyclesConfig,
               optim: OptimConfig, rollout_cfg: RolloutConfig, log_dir: str | Path) -> list[dict]:
    """Deploy / distil ``cycles.cycles`` times; returns the ``cycles + 1`` per-cycle records."""
    policy = policy if isinstance(policy, SnapshotTeacher) else SnapshotTeacher(policy)
    opt = optim.adamw(policy.trainable_parameters())
    logger, records, probe, step = CycleLog(log_dir), [], [], 0
    for c in range(cycles.cycles + 1):
        policy.snapshot()  # this cycle's teacher: the model at the start of the cycle
        t0 = time.perf_counter()
        deployed = evaluate(policy, env, tasks, rollout_cfg, batch_size=cycles.eval_batch_size)
        verified = [e for e in deployed if e.verified]
        fill_probe = not probe and cycles.probe_size > 0
        texts = privileged_texts(policy, objective, verified, cycles) if c < cycles.cycles or fill_probe else []
        if fill_probe:  # fixed once found (first verified tasks, their PI), so cycles stay comparable
            probe = [(e.task, z) for e, z in zip(verified, texts)][: cycles.probe_size]
        pi_success = probe_success(policy, env, probe, rollout_cfg, cycles.eval_batch_size)
        record = deployment_record(c, deployed, probe, pi_success)
        record["perf/collect_s"] = time.perf_counter() - t0
        if c < cycles.cycles and verified:
            t1 = time.perf_counter()
            history = distil(policy, objective, list(zip(verified, texts)), cycles.updates_per_cycle,
                             cycles.batch_size, opt, optim.grad_clip, random.Random(cycles.seed + c))
            for h in history:
                logger.scalars(h, step)
                step += 1
            record.update(updates=len(history), **mean_metrics(history))
            record["perf/distil_s"] = time.perf_counter() - t1
        log.info("cycle %d: %s", c, json.dumps(record))
        logger.row(record)
        records.append(record)
    policy.save_adapter(Path(log_dir) / "adapter")
    logger.close()
    return records


def mean_metrics(history: list[dict]) -> dict[str, float]:
    keys = {k for h in history for k in h if k.startswith(("loss/", "resail/"))}
    return {k: sum(h.get(k, 0.0) for h in history) / len(history) for k in sorted(keys)} if history else {}


def deployment_tasks(env: TextEnv, num_tasks: int | None, seed: int) -> list[Task]:
    """The fixed deployment set: a seeded order of the env's tasks, cut to ``num_tasks`` (as the stream's)."""
    return stream_tasks(check_reply(env, "tasks", env.tasks()), num_tasks, seed)


def build_parser():
    from jsonargparse import ActionConfigFile, ArgumentParser, lazy_instance

    p = ArgumentParser(prog="python -m lit_ascent.cycles", description=__doc__.split("\n")[0])
    p.add_argument("--config", action=ActionConfigFile, help="YAML config (repeatable; later ones override).")
    p.add_argument("--seed", type=int, default=0, help="torch seed.")
    p.add_argument("--llm", type=ModelConfig, default=ModelConfig(), help="Base model and LoRA.")
    p.add_argument("--env", type=TextEnv, required=True, help="The environment (class_path + init_args).")
    p.add_argument("--num_tasks", type=int | None, default=None, help="Deployment tasks per cycle (None: all).")
    p.add_argument("--task_seed", type=int, default=0, help="Seed of the deployment task order.")
    p.add_argument("--objective", type=ReSAIL, default=lazy_instance(ReSAIL), help="Distillation objective.")
    p.add_argument("--rollout", type=RolloutConfig, default=RolloutConfig(), help="Episode settings.")
    p.add_argument("--optim", type=OptimConfig, default=OptimConfig(), help="AdamW settings.")
    p.add_argument("--cycles", type=CyclesConfig, default=CyclesConfig(), help="The cycle schedule.")
    p.add_argument("--log_dir", type=str, default="runs/cycles", help="TensorBoard + cycles.jsonl folder.")
    p.add_argument("--device", type=str, default="auto", help="auto | cpu | cuda.")
    return p


def main(args: list[str] | None = None) -> list[dict]:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    parser = build_parser()
    cfg = parser.parse_args(args)
    init = parser.instantiate(cfg)
    torch.manual_seed(init.seed)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if init.device == "auto" else init.device
    policy = load_policy(init.llm, device)
    Path(init.log_dir).mkdir(parents=True, exist_ok=True)
    parser.save(cfg, str(Path(init.log_dir) / "config.yaml"), overwrite=True)
    tasks = deployment_tasks(init.env, init.num_tasks, init.task_seed)
    try:
        return run_cycles(policy, init.env, tasks, init.objective, init.cycles, init.optim, init.rollout,
                          init.log_dir)
    finally:
        init.env.close()


if __name__ == "__main__":
    from jsonargparse import set_parsing_settings

    set_parsing_settings(docstring_parse_attribute_docstrings=True)  # --help shows each config field's docstring
    main()
