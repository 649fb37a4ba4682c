"""OaTTTModule: one training step = one task of the stream (act, gate, learn, log)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import lightning as L
import torch
from jsonargparse import lazy_instance
from torchmetrics import MeanMetric, Metric

from lit_ascent.models import ModelConfig, Policy, load_policy
from lit_ascent.objectives import Distillation, Objective
from lit_ascent.rollout import RolloutConfig, rollout
from lit_ascent.trajectory import Episode, Task

log = logging.getLogger(__name__)


@dataclass
class OptimConfig:
    """AdamW on the LoRA parameters only."""

    lr: float = 1e-4
    """Learning rate (> 0)."""
    weight_decay: float = 0.0
    """AdamW weight decay (>= 0)."""
    updates_per_task: int = 1
    """Optimiser steps per episode that passes the callbacks (>= 1)."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"model.optim.lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"model.optim.weight_decay must be >= 0, got {self.weight_decay}")
        if self.updates_per_task < 1:
            raise ValueError(f"model.optim.updates_per_task must be >= 1, got {self.updates_per_task}")
        if self.grad_clip < 0:
            raise ValueError(f"model.optim.grad_clip must be >= 0, got {self.grad_clip}")


class OaTTTModule(L.LightningModule):
    """Online agentic test-time training over a one-pass task stream."""

    def __init__(self, llm: ModelConfig | None = None, objective: Objective = lazy_instance(Distillation),
                 rollout: RolloutConfig | None = None, optim: OptimConfig | None = None):
        """
        Args:
            llm: Base model and LoRA fast weights.
            objective: What a verified (or, without the gate, any) episode teaches.
            rollout: Episode settings (turn and token budgets).
            optim: Optimiser settings.
        """
        super().__init__()
        self.automatic_optimization = False
        self.llm_cfg = llm or ModelConfig()
        self.objective = objective
        self.rollout_cfg = rollout or RolloutConfig()
        self.optim_cfg = optim or OptimConfig()
        self.policy: Policy | None = None
        self.success_rate, self.invalid_rate = MeanMetric(), MeanMetric()
        self.counters = {"updates": 0, "skipped_nonfinite": 0, "env_errors": 0}
        self.last: tuple[Episode, dict] | None = None

    def configure_model(self) -> None:
        if self.policy is None:  # heavy: built when the trainer starts, not in __init__
            self.policy = load_policy(self.llm_cfg, self.device)

    def configure_optimizers(self):
        o = self.optim_cfg
        return torch.optim.AdamW(self.policy.trainable_parameters(), lr=o.lr, weight_decay=o.weight_decay)

    @property
    def env(self):
        return self.trainer.datamodule.env

    def training_step(self, batch: list[Task], batch_idx: int) -> None:
        episode = self.act(batch[0])
        for cb in self.trainer.callbacks:
            if hasattr(cb, "on_episode"):
                cb.on_episode(self.trainer, self, episode)
        stats = self.learn(episode)
        self.last = (episode, stats)
        self.log_episode(episode, stats)

    def act(self, task: Task) -> Episode:
        """One greedy episode with the weights as they are now."""
        self.policy.model.eval()
        episode = rollout(self.policy.model, self.policy.tokenizer, self.env, task, self.rollout_cfg)
        episode.error = episode.error or getattr(self.env, "episode_error", None)  # e.g. a hung verifier
        self.counters["env_errors"] += episode.error is not None
        return episode

    def learn(self, episode: Episode) -> dict:
        """``updates_per_task`` optimiser steps on the episode, unless a callback vetoed it."""
        stats: dict = {"updates": 0}
        if not (self.objective.updates and episode.trainable):
            return stats
        t0 = time.perf_counter()
        policy, opt = self.policy, self.optimizers()
        policy.model.train()
        prepared = self.objective.prepare(policy, episode)
        for _ in range(self.optim_cfg.updates_per_task):
            out = self.objective.loss(policy, episode, prepared)
            if out is None:
                break
            opt.zero_grad(set_to_none=True)
            if not self.backward_finite(out.loss, episode.task.task_id):
                continue
            opt.step()
            stats["updates"] += 1
            stats.update(out.metrics)
        opt.zero_grad(set_to_none=True)
        self.counters["updates"] += stats["updates"]
        stats["perf/update_s"] = time.perf_counter() - t0
        return stats

    def backward_finite(self, loss: torch.Tensor, task_id: str) -> bool:
        """Backward + clipping; False (and counted) when the loss or gradient is not finite."""
        if torch.isfinite(loss):
            self.manual_backward(loss)
            params = self.policy.trainable_parameters()
            clip = self.optim_cfg.grad_clip or float("inf")
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
            if torch.isfinite(norm):
                return True
        self.counters["skipped_nonfinite"] += 1
        log.warning("non-finite loss or gradient on task %s: update skipped", task_id)
        return False

    def stream_state(self) -> dict:
        """What a resumed stream needs from the module: plain tensors, numbers and dicts."""
        opts = self.trainer.optimizers
        metrics = {n: m for n, m in self.named_children() if isinstance(m, Metric)}
        return {"adapter": self.policy.adapter_state(), "counters": dict(self.counters),
                "optimizer": opts[0].state_dict() if opts else {},
                "objective": self.objective.state_dict(),
                "metrics": {n: {**m.metric_state, "_update_count": m._update_count} for n, m in metrics.items()}}

    def load_stream_state(self, state: dict) -> None:
        """Restore ``stream_state()``: the adapter, AdamW moments, objective statistics, metrics, counters."""
        params = dict(self.policy.model.named_parameters())
        if set(state["adapter"]) - set(params):
            raise ValueError("checkpoint adapter does not match this model (check model.llm.lora)")
        with torch.no_grad():
            for name, value in state["adapter"].items():
                params[name].copy_(value)
        if state["optimizer"]:
            self.trainer.optimizers[0].load_state_dict(state["optimizer"])
        self.objective.load_state_dict(state["objective"])
        self.counters.update(state["counters"])
        for name, values in state["metrics"].items():
            metric = getattr(self, name)
            metric._update_count, metric._computed = values.pop("_update_count"), None
            for key, value in values.items():
                setattr(metric, key, value.to(self.device))

    def log_episode(self, ep: Episode, stats: dict) -> None:
        turns = max(len(ep.turns), 1)
        self.success_rate.update(float(ep.verified))
        self.invalid_rate.update(ep.num_invalid / turns)
        kw = dict(on_step=True, on_epoch=False, batch_size=1)
        self.log("stream/success_rate", self.success_rate.compute(), prog_bar=True, **kw)
        self.log_dict({
            "stream/success": float(ep.verified), "stream/turns": float(len(ep.turns)),
            "stream/invalid_rate": ep.num_invalid / turns,
            "stream/invalid_rate_running": self.invalid_rate.compute(),
            "stream/env_errors": float(self.counters["env_errors"]),
            "train/updates": float(self.counters["updates"]),
            "train/skipped_nonfinite": float(self.counters["skipped_nonfinite"]),
            "rollout/tokens_per_s": ep.timings.get("tokens_per_s", 0.0),
            "perf/rollout_s": ep.timings.get("rollout_s", 0.0),
        }, **kw)
        # Update metrics exist only for tasks that updated; self.log would repeat the last
        # value at every later step, so they go to the loggers directly, at the task's index.
        update_metrics = {k: v for k, v in stats.items() if "/" in k}
        for logger in self.loggers if update_metrics else ():
            logger.log_metrics(update_metrics, step=ep.task.index)
