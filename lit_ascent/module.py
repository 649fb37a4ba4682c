"""OaTTTModule: one training step = one task of the stream (act, gate, learn, log)."""
from __future__ import annotations

import logging
import time

import lightning as L
import torch
from jsonargparse import lazy_instance
from torchmetrics import MeanMetric, Metric

from lit_ascent.engines import close_engines
from lit_ascent.memory import Memory, NoMemory, memory_diagnostics
from lit_ascent.models import ModelConfig, Policy, load_adapter_state, load_policy
from lit_ascent.objectives import Distillation, LossOutput, Objective
from lit_ascent.objectives.experience_replay import ReplayBuffer, ReplayConfig
from lit_ascent.outcome import EpisodeCallback, TaskOutcome
from lit_ascent.playback import Playback, PlaybackConfig
from lit_ascent.rollout import RolloutConfig, rollout, rollout_engine
from lit_ascent.trajectory import Episode, Task
from lit_ascent.optim import OptimConfig, guarded_step

log = logging.getLogger(__name__)


class OaTTTModule(L.LightningModule):
    """Online agentic test-time training over a one-pass task stream."""

    def __init__(self, llm: ModelConfig | None = None, objective: Objective = lazy_instance(Distillation),
                 rollout: RolloutConfig | None = None, optim: OptimConfig | None = None,
                 replay: ReplayConfig | None = None, playback: PlaybackConfig | None = None,
                 memory: Memory = lazy_instance(NoMemory)):
        """
        Args:
            llm: Base model and LoRA fast weights.
            objective: What a verified (or, without the gate, any) episode teaches.
            rollout: Episode settings (turn and token budgets).
            optim: Optimiser settings.
            replay: Replay of earlier updating episodes at every optimiser step (k = 0: off, the paper's protocol).
            playback: Take each task's episode from an earlier run's log instead of acting (off by default).
            memory: In-context memory of earlier tasks shown to the student (``lit_ascent.memory``; NoMemory: none).
        """
        super().__init__()
        self.automatic_optimization = False
        self.llm_cfg = llm or ModelConfig()
        self.objective = objective
        self.rollout_cfg = rollout or RolloutConfig()
        self.optim_cfg = optim or OptimConfig()
        self.replay_cfg = replay or ReplayConfig()
        if self.replay_cfg.k and not objective.replayable:
            raise ValueError(f"model.replay.k must be 0 with {type(objective).__name__}: "
                             "its episodes are not replayable (on-policy gradient)")
        self.replay = ReplayBuffer(self.replay_cfg)
        self.playback = Playback(playback.log) if playback and playback.log else None
        if self.playback is not None and memory.active:
            raise ValueError("model.memory must be NoMemory with model.playback: a recorded episode was not "
                             "shown this run's memory")
        self.memory = memory
        self.policy: Policy | None = None
        self.success_rate, self.invalid_rate = MeanMetric(), MeanMetric()
        self.counters = {"updates": 0, "skipped_nonfinite": 0, "env_errors": 0}

    def configure_model(self) -> None:
        if self.policy is None:  # heavy: built when the trainer starts, not in __init__
            self.policy = load_policy(self.llm_cfg, self.device)
            rollout_engine(self.rollout_cfg, self.policy.model)  # an engine that cannot start fails the run here

    def setup(self, stage: str) -> None:
        seed = getattr(self.trainer.datamodule, "seed", 0) if self.trainer.datamodule is not None else 0
        self.replay = ReplayBuffer(self.replay_cfg, seed)  # replay draws follow the stream's seed
        if self.playback is not None and self.trainer.datamodule is not None:
            self.playback.check(self.trainer.datamodule.stream)

    def teardown(self, stage: str) -> None:
        if self.policy is not None:  # e.g. the vllm engine's server process
            close_engines(self.policy.model)

    def budget(self) -> str:
        """The update budget in one line (lr, steps per episode, replay, LoRA size)."""
        o, r, lora = self.optim_cfg, self.replay_cfg, self.llm_cfg.lora
        replay = f"k={r.k}/{r.buffer_size} {r.sampling}" if r.k else "off"
        return (f"lr={o.lr:g} steps/episode={o.updates_per_task} replay={replay} "
                f"lora=r{lora.rank}/alpha{lora.alpha:g}")

    def configure_optimizers(self):
        return self.optim_cfg.adamw(self.policy.trainable_parameters())

    @property
    def env(self):
        return self.trainer.datamodule.env

    def training_step(self, batch: list[Task], batch_idx: int) -> dict[str, TaskOutcome]:
        """Act, hand the episode to the episode callbacks, learn, hand them the update, then build the
        task's record; every callback's ``on_train_batch_end`` gets the outcome as ``outputs["outcome"]``."""
        outcome = TaskOutcome(self.act(batch[0]), dtype=str(self.policy.model.dtype).removeprefix("torch."))
        hooks = [cb for cb in self.trainer.callbacks if isinstance(cb, EpisodeCallback)]
        for cb in hooks:
            cb.on_episode(self.trainer, self, outcome)
        outcome.stats = self.learn(outcome.episode)
        for cb in hooks:
            cb.on_after_update(self.trainer, self, outcome)
        if self.memory.active:
            self.memory.observe(outcome.episode, self.env, self.policy)
            outcome.diagnostics.update(memory_diagnostics(outcome.episode, len(self.memory)))
        outcome.finish()
        self.log_episode(outcome.episode, outcome.stats, outcome.diagnostics)
        return {"outcome": outcome}

    def act(self, task: Task) -> Episode:
        """One greedy episode with the weights as they are now (with playback: the recorded one)."""
        self.policy.model.eval()
        if self.playback is not None:
            episode = self.playback.episode(self.policy.tokenizer, self.env, task)
        else:
            episode = rollout(self.policy.model, self.policy.tokenizer, self.env, task, self.rollout_cfg,
                              memory=self.memory)
        episode.error = episode.error or getattr(self.env, "episode_error", None)  # e.g. a hung verifier
        self.counters["env_errors"] += episode.error is not None
        return episode

    def learn(self, episode: Episode) -> dict:
        """``updates_per_task`` optimiser steps on the episode (each with ``replay.k`` buffered
        episodes beside it), unless a callback vetoed it; then the episode joins the buffer."""
        stats: dict = {"updates": 0}
        if not (self.objective.updates and episode.trainable):
            return stats
        t0 = time.perf_counter()
        policy, opt = self.policy, self.optimizers()
        policy.model.train()
        prepared = self.objective.prepare(policy, episode)
        before = None
        for _ in range(self.optim_cfg.updates_per_task):
            replayed = self.replay.sample(self.replay_cfg.k)
            out, stepped = self.step([(episode, prepared)] + [(e.episode, e.prepared) for e in replayed],
                                     episode.task.task_id)
            if out is None:
                break
            before = float(out.loss.detach()) if before is None else before
            if not stepped:
                continue
            stats["updates"] += 1
            stats.update(out.metrics)
            stats["update/replayed"] = float(len(replayed))
        opt.zero_grad(set_to_none=True)
        self.counters["updates"] += stats["updates"]
        if stats["updates"]:
            stats.update(self.absorbed(episode, prepared, before))
        if self.replay_cfg.k:
            self.replay.add(episode, prepared)
            stats.update(self.replay.stats())
        stats["perf/update_s"] = time.perf_counter() - t0
        return stats

    def step(self, batch: list[tuple[Episode, object]], task_id: str) -> tuple[LossOutput | None, bool]:
        """One guarded optimiser step on the mean loss of ``batch`` (the current episode first).

        Returns the current episode's LossOutput (None: it has nothing to learn from) and whether
        the step was taken (False, and counted, when a loss or the gradient was not finite).
        Each episode's loss is backpropagated on its own (gradient accumulation), so memory holds
        one episode's graph at a time; a batch of one is exactly the single-episode step.
        """
        current = self.objective.loss(self.policy, *batch[0])
        if current is None:
            return None, False

        def losses():  # each built after the previous one's backward
            yield current.loss if len(batch) == 1 else current.loss / len(batch)
            for episode, prepared in batch[1:]:
                out = self.objective.loss(self.policy, episode, prepared)
                if out is not None:
                    yield out.loss / len(batch)

        outcome = guarded_step(self.optimizers(), self.policy.trainable_parameters(), losses(),
                               self.optim_cfg.grad_clip, self.manual_backward)
        return current, outcome.stepped or self.skip(task_id)

    def skip(self, task_id: str) -> bool:
        """Count a step skipped for a non-finite loss or gradient (returns False: no step)."""
        self.counters["skipped_nonfinite"] += 1
        log.warning("non-finite loss or gradient on task %s: update skipped", task_id)
        return False

    def absorbed(self, episode: Episode, prepared, before: float) -> dict[str, float]:
        """The objective on the same episode before and after this task's steps, and the share of it
        the steps removed (1 - after / before; only for a positive loss). One extra student forward."""
        was_training = self.policy.model.training
        self.policy.model.eval()  # no dropout draw: the measurement leaves every RNG as it was
        with torch.no_grad():
            out = self.objective.loss(self.policy, episode, prepared)
        self.policy.model.train(was_training)
        after = float(out.loss)
        stats = {"update/loss_before": before, "update/loss_after": after}
        if before > 0:
            stats["update/absorbed_fraction"] = 1.0 - after / before
        return stats

    def stream_state(self) -> dict:
        """What a resumed stream needs from the module: plain tensors, numbers and dicts."""
        opts = self.trainer.optimizers
        metrics = {n: m for n, m in self.named_children() if isinstance(m, Metric)}
        return {"adapter": self.policy.adapter_state(), "counters": dict(self.counters),
                "optimizer": opts[0].state_dict() if opts else {},
                "objective": self.objective.state_dict(), "replay": self.replay.state_dict(),
                "memory": self.memory.state_dict(),
                "metrics": {n: {**m.metric_state, "_update_count": m._update_count} for n, m in metrics.items()}}

    def load_stream_state(self, state: dict) -> None:
        """Restore ``stream_state()``: the adapter, AdamW moments, objective statistics, the memory, metrics, counters."""
        load_adapter_state(self.policy.model, state["adapter"])
        if state["optimizer"]:
            self.trainer.optimizers[0].load_state_dict(state["optimizer"])
        self.objective.load_state_dict(state["objective"])
        self.memory.load_state_dict(state.get("memory", {}))
        self.policy.model.train()  # the mode ``learn`` prepares in
        self.replay.load_state_dict(state["replay"], lambda ep: self.objective.prepare(self.policy, ep))
        self.counters.update(state["counters"])
        for name, values in state["metrics"].items():
            metric = getattr(self, name)
            metric._update_count, metric._computed = values.pop("_update_count"), None
            for key, value in values.items():
                setattr(metric, key, value.to(self.device))

    def log_episode(self, ep: Episode, stats: dict, diagnostics: dict[str, float]) -> None:
        """The task's metrics: the stream's, the counters, rollout speed, the episode callbacks' diagnostics
        (at this step), and the update's (at the task's index, only when it updated)."""
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
            **{f"perf/{k}": v for k, v in ep.timings.items() if k.startswith("engine_")},
            **diagnostics,
        }, **kw)
        # Update metrics exist only for tasks that updated; self.log would repeat the last
        # value at every later step, so they go to the loggers directly, at the task's index.
        update_metrics = {k: v for k, v in stats.items() if "/" in k}
        for logger in self.loggers if update_metrics else ():
            logger.log_metrics(update_metrics, step=ep.task.index)
