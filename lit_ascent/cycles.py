"""Iterated self-distillation (SDPO / OEL style), with or without ReSAIL.

Each cycle c:
  1. the teacher becomes the model as it is now (frozen for the whole cycle);
  2. deploy: one greedy episode per task of the deployment set, no updates;
  3. PI-conditioned probe: success with the privileged information in context;
  4. distil: ``updates_per_cycle`` updates, each on a random batch of this cycle's
     verified episodes (ReSAIL's SGS selection is recomputed per batch).
After the last cycle the model is deployed and probed once more, so the log has
``cycles + 1`` rows: row c is the model after c cycles of distillation. A deployment that verifies
nothing is a fixed point (no data, no update, greedy replay): later rows are carried from it, marked
``carried_from``, instead of being played again. Each row also holds
the deployment's collapse diagnostics (``lit_ascent.collapse``): first-token entropy and drift
from the initial model, repeated actions, and the drift from the initial model on the action
tokens of a fixed probe set (cycle 0's first deployed episodes). Per-task outcomes, the files
and ``--resume`` (go on after the last finished cycle): ``lit_ascent.cycle_log``.

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

from lit_ascent.collapse import deployment_diagnostics, first_probes
from lit_ascent.cycle_log import CycleLog, load_state, save_state, task_rows
from lit_ascent.engines.hf import greedy_reply
from lit_ascent.envs.base import TextEnv
from lit_ascent.envs.guarded import check_reply
from lit_ascent.evaluate import evaluate
from lit_ascent.models import ModelConfig, Policy, load_adapter_state, load_policy
from lit_ascent.objectives.resail import ReSAIL, StepTargets
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
    drift_probes: int = 4
    """Cycle 0's first deployed episodes holding an action, kept as the action-drift probe set (0: none)."""

    def __post_init__(self) -> None:
        for name in ("cycles", "updates_per_cycle", "batch_size", "lesson_max_tokens", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"cycles.{name} must be >= 1, got {getattr(self, name)}")
        if self.pi_source not in PI_SOURCES:
            raise ValueError(f"cycles.pi_source must be one of {PI_SOURCES}, got {self.pi_source!r}")
        for name in ("probe_size", "drift_probes"):
            if getattr(self, name) < 0:
                raise ValueError(f"cycles.{name} must be >= 0, got {getattr(self, name)}")


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

    def initial(self) -> contextlib.AbstractContextManager:
        """The initial model (every adapter off: the warm-started base), no gradient."""
        return Policy.teacher(self)


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
    (one with no target, a non-finite loss or a non-finite gradient is skipped, see ``guarded_step``).
    The teacher is frozen for the cycle, so each episode's teacher side is computed once, when first drawn."""
    history = []
    params = policy.trainable_parameters()
    policy.model.train()
    teacher_side: dict[int, StepTargets | None] = {}
    for i in range(updates):
        t0 = time.perf_counter()
        batch = draw_batch(rng, len(data), batch_size)
        for j in batch:
            if j not in teacher_side:
                teacher_side[j] = objective.prepare_episode(policy, *data[j])
        episodes = [data[j][0] for j in batch]
        prepared = objective.select([teacher_side[j] for j in batch])
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
        log.info("distil: %d/%d updates, loss %.4f, %.0f s", i + 1, updates, out.loss.item(),
                 history[-1]["perf/update_s"])
    return history


def cycle_rng(cycles: CyclesConfig, cycle: int) -> random.Random:
    """The random draws of cycle ``cycle``'s distillation batches."""
    return random.Random(cycles.seed + cycle)


def draw_batch(rng: random.Random, num_episodes: int, batch_size: int) -> list[int]:
    """One update's episode indices (the draws of ``rng.sample(data, ...)``)."""
    return rng.sample(range(num_episodes), min(batch_size, num_episodes))


def probe_episodes(policy: Policy, env: TextEnv, probe: list[tuple[Task, str]], cfg: RolloutConfig,
                   batch_size: int = 1) -> list[Episode]:
    """The PI-conditioned probe: the current model with each task's PI in its context."""
    if not probe:
        return []
    return evaluate(policy, env, [t for t, _ in probe], cfg, [z for _, z in probe], batch_size=batch_size)


def deployment_record(cycle: int, deployed: list[Episode], probe: list[tuple[Task, str]],
                      probed: list[Episode]) -> dict:
    """One cycle's outcomes. Plain probe success is read off the deployment (same weights, same tasks)."""
    rates = outcome_rates(deployed)
    solved = {e.task.task_id: e.verified for e in deployed}
    plain = sum(solved.get(t.task_id, False) for t, _ in probe) / len(probe) if probe else None
    return {"cycle": cycle, "deployed/success_rate": rates["success_rate"], "deployed/turns": rates["turns"],
            "deployed/invalid_rate": rates["invalid_rate"], "deployed/verified": sum(e.verified for e in deployed),
            "probe/pi_success": outcome_rates(probed)["success_rate"] if probed else None,
            "probe/plain_success": plain, "probe/size": len(probe)}


def run_cycles(policy: Policy, env: TextEnv, tasks: list[Task], objective: ReSAIL, cycles: CyclesConfig,
               optim: OptimConfig, rollout_cfg: RolloutConfig, log_dir: str | Path, resume: bool = False,
               config: str = "") -> list[dict]:
    """Deploy / distil ``cycles.cycles`` times; returns the ``cycles + 1`` per-cycle records. With ``resume``,
    a run stopped after a finished cycle goes on from ``log_dir``'s checkpoint (``lit_ascent.cycle_log``)."""
    policy = policy if isinstance(policy, SnapshotTeacher) else SnapshotTeacher(policy)
    opt = optim.adamw(policy.trainable_parameters())
    state = load_state(log_dir, config) if resume else None
    records, probe, drift_probes, step = [], [], [], 0
    if state:
        load_adapter_state(policy.model, state["adapter"])
        opt.load_state_dict(state["optimizer"])
        by_id = {t.task_id: t for t in tasks}
        records, step, drift_probes = state["records"], state["step"], state["drift_probes"]
        probe = [(by_id[task_id], text) for task_id, text in state["probe"]]
        log.info("resuming after cycle %d from %s", records[-1]["cycle"], log_dir)
    logger = CycleLog(log_dir, finished=records[-1]["cycle"] if records else -1)
    for c in range(len(records), cycles.cycles + 1):
        source = fixed_point(records)
        if source is not None:  # nothing to play: the weights are those of cycle `source`
            record, rows = carried_record(c, records[-1]), logger.task_rows_of(source, cycle=c)
        else:
            policy.snapshot()  # this cycle's teacher: the model at the start of the cycle
            t0 = time.perf_counter()
            deployed = evaluate(policy, env, tasks, rollout_cfg, batch_size=cycles.eval_batch_size)
            verified = [e for e in deployed if e.verified]
            fill_probe = not probe and cycles.probe_size > 0
            texts = privileged_texts(policy, objective, verified, cycles) if c < cycles.cycles or fill_probe else []
            if fill_probe:  # fixed once found (first verified tasks, their PI), so cycles stay comparable
                probe = [(e.task, z) for e, z in zip(verified, texts)][: cycles.probe_size]
            probed = probe_episodes(policy, env, probe, rollout_cfg, cycles.eval_batch_size)
            record = deployment_record(c, deployed, probe, probed)
            record["perf/collect_s"] = time.perf_counter() - t0
            if not drift_probes:  # fixed at the first deployment: drift is always from the same tokens
                drift_probes = first_probes(policy.tokenizer, deployed, cycles.drift_probes)
            t1 = time.perf_counter()
            record.update(deployment_diagnostics(policy, deployed, drift_probes, policy.initial))
            record["perf/diagnostics_s"] = time.perf_counter() - t1
            if c < cycles.cycles and verified:
                t2 = time.perf_counter()
                history = distil(policy, objective, list(zip(verified, texts)), cycles.updates_per_cycle,
                                 cycles.batch_size, opt, optim.grad_clip, cycle_rng(cycles, c))
                for h in history:
                    logger.scalars(h, step)
                    step += 1
                record.update(updates=len(history), **mean_metrics(history))
                record["perf/distil_s"] = time.perf_counter() - t2
            rows = task_rows(c, "deployed", deployed) + task_rows(c, "probe", probed)
        log.info("cycle %d: %s", c, json.dumps(record))
        logger.row(record, rows)
        records.append(record)
        save_state(log_dir, {"config": config, "adapter": policy.adapter_state(), "optimizer": opt.state_dict(),
                             "records": records, "step": step, "drift_probes": drift_probes,
                             "probe": [(t.task_id, z) for t, z in probe]})
    policy.save_adapter(Path(log_dir) / "adapter")
    logger.close()
    return records


def fixed_point(records: list[dict]) -> int | None:
    """The cycle whose deployment the next cycle would replay exactly, or None. A deployment that verifies
    nothing gives distillation no data, so the weights stay as they were; deployment, probe and diagnostics
    are greedy on the same tasks, so every later cycle would repeat that cycle's row."""
    if not records or records[-1]["deployed/verified"] > 0:
        return None
    return records[-1].get("carried_from", records[-1]["cycle"])


def carried_record(cycle: int, previous: dict) -> dict:
    """Row ``cycle`` carried from a fixed point's row: its outcomes and diagnostics, marked ``carried_from``,
    every ``perf/`` time 0 (nothing was played)."""
    return {**previous, "cycle": cycle, "carried_from": previous.get("carried_from", previous["cycle"]),
            **{k: 0.0 for k in previous if k.startswith("perf/")}}


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
    p.add_argument("--resume", type=bool, default=False,
                   help="Go on after the last finished cycle of log_dir (same config); none there: start afresh.")
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
    settings = parser.dump(cfg.clone().update(False, "resume"))  # what a resumed run must share
    tasks = deployment_tasks(init.env, init.num_tasks, init.task_seed)
    try:
        return run_cycles(policy, init.env, tasks, init.objective, init.cycles, init.optim, init.rollout,
                          init.log_dir, resume=init.resume, config=settings)
    finally:
        init.env.close()


if __name__ == "__main__":
    from jsonargparse import set_parsing_settings

    set_parsing_settings(docstring_parse_attribute_docstrings=True)  # --help shows each config field's docstring
    main()
