"""Faults never end a stream: environment exceptions and hangs, non-finite losses, bad model output."""
from __future__ import annotations

import copy
import dataclasses
import time

import lightning as L
import pytest
import torch

from datamodules import TaskStreamDataModule
from lit_ascent.envs import ScriptedEnv
from lit_ascent.envs.guarded import EnvFault, GuardedEnv, call_with_timeout
from lit_ascent.models import LoraSettings, ModelConfig, load_policy
from lit_ascent.module import OaTTTModule
from lit_ascent.optim import OptimConfig
from lit_ascent.objectives import NoUpdate, Objective
from lit_ascent.objectives.base import LossOutput
from lit_ascent.objectives.experience_replay import ReplayConfig
from lit_ascent.rollout import RolloutConfig, rollout
from lit_ascent.trajectory import ROLE_ASSISTANT

HANG_S, TIMEOUT_S = 2.0, 0.3


class FaultyEnv(ScriptedEnv):
    """ScriptedEnv that misbehaves on chosen tasks of the stream (by stream index)."""

    def __init__(self, faults: dict[int, str], **kw):
        super().__init__(**kw)
        self.faults = faults  # stream index -> raise_step | hang_step | raise_reset | hang_verify

    def _fault(self, where: str) -> None:
        kind = self.faults.get(self._task.index if self._task else -1, "")
        if kind == f"raise_{where}":
            raise RuntimeError(f"injected crash in {where}")
        if kind == f"hang_{where}":
            time.sleep(HANG_S)

    def reset(self, task):
        self._task = task
        self._fault("reset")
        return super().reset(task)

    def step(self, action):
        self._fault("step")
        return super().step(action)

    def verify_at_end(self):
        self._fault("verify")
        return super().verify_at_end()


class Recorder(L.Callback):
    """Keeps, per task: the episode, the env instance that ran it, the adapter and the AdamW state."""

    def __init__(self):
        self.rows: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        outcome = outputs["outcome"]
        self.rows.append({
            "episode": outcome.episode, "stats": outcome.stats, "outcome": outcome, "env": trainer.datamodule.env.inner,
            "adapter": pl_module.policy.adapter_state(),
            "optimizer": copy.deepcopy(trainer.optimizers[0].state_dict()),
            "grads": [p.grad for p in pl_module.policy.trainable_parameters()],
        })


def run_stream(env, objective: Objective, num_tasks: int, max_turns: int = 2, step_timeout_s: float = TIMEOUT_S,
               replay: ReplayConfig | None = None):
    torch.manual_seed(0)
    module = OaTTTModule(llm=ModelConfig(name_or_path="tiny-random", dtype="float32", lora=LoraSettings(rank=2)),
                         objective=objective, rollout=RolloutConfig(max_turns=max_turns, max_new_tokens=4),
                         optim=OptimConfig(lr=1e-2), replay=replay)
    data = TaskStreamDataModule(env, num_tasks=num_tasks, shuffle=False, step_timeout_s=step_timeout_s)
    recorder = Recorder()
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", callbacks=[recorder])
    trainer.fit(module, data)
    return module, recorder.rows, trainer


# --- environment faults ---------------------------------------------------------------------------

def test_call_with_timeout():
    assert call_with_timeout(lambda x: x + 1, 1, timeout_s=1.0) == 2
    with pytest.raises(TimeoutError, match="0.1 s"):
        call_with_timeout(time.sleep, 1.0, timeout_s=0.1)
    with pytest.raises(ZeroDivisionError):
        call_with_timeout(lambda: 1 / 0, timeout_s=1.0)


def test_guarded_env_rebuilds_after_a_fault():
    env = GuardedEnv(FaultyEnv({0: "raise_step"}, num_tasks=2), step_timeout_s=TIMEOUT_S)
    first = env.inner
    t0, t1 = (dataclasses.replace(t, index=i) for i, t in enumerate(env.tasks()))  # stream indices
    env.reset(t0)
    with pytest.raises(EnvFault, match="injected crash in step"):
        env.step("go")
    assert env.faults == 1 and env.episode_error is not None
    env.reset(t1)  # the next task runs on a fresh instance
    assert env.inner is not first and env.episode_error is None
    assert env.step("go").observation.startswith("Step 1")
    assert env.num_tasks == 2  # attributes of the wrapped env stay visible


def test_env_faults_fail_episodes_and_the_stream_goes_on(monkeypatch):
    # the random tiny model writes no 'Action:' line; let every turn act, so env.step runs
    monkeypatch.setattr("lit_ascent.rollout.parse_action", lambda text: "go")
    faults = {1: "raise_step", 2: "hang_step", 4: "raise_reset", 5: "hang_verify"}
    env = FaultyEnv(faults, num_tasks=7, episode_steps=5, verify_every=1)  # ends by the turn budget: verify runs
    t0 = time.perf_counter()
    module, rows, trainer = run_stream(env, NoUpdate(), num_tasks=7)
    elapsed = time.perf_counter() - t0
    assert [r["episode"].task.index for r in rows] == list(range(7))  # the stream finished
    errors = {r["episode"].task.index: r["episode"].error for r in rows if r["episode"].error}
    assert sorted(errors) == sorted(faults)
    assert "injected crash in step" in errors[1] and "injected crash in reset" in errors[4]
    assert "TimeoutError" in errors[2] and "TimeoutError" in errors[5]
    assert module.counters["env_errors"] == len(faults)
    assert float(trainer.callback_metrics["stream/env_errors"]) == len(faults)
    assert all(not rows[i]["episode"].verified for i in faults)
    assert all(rows[i]["episode"].verified for i in (0, 3, 6))  # healthy tasks still verify
    for i in faults:  # every fault is followed by a fresh environment instance
        if i + 1 < len(rows):
            assert rows[i + 1]["env"] is not rows[i]["env"]
    assert rows[1]["env"] is rows[0]["env"] and rows[4]["env"] is rows[3]["env"]  # no rebuild without a fault
    assert elapsed < 60  # hangs cost the timeout, not the hang


# --- numerical faults -----------------------------------------------------------------------------

class ScheduledObjective(Objective):
    """Pulls the LoRA weights toward 0.1; a NaN loss or a NaN gradient on chosen tasks."""

    def __init__(self, nan_loss: set[int], nan_grad: set[int]):
        self.nan_loss, self.nan_grad = nan_loss, nan_grad

    def loss(self, policy, episode, prepared):
        params = policy.trainable_parameters()
        i = episode.task.index
        if i in self.nan_grad:  # finite value (0), but d sqrt(x)/dx at 0 is inf -> NaN gradients
            return LossOutput(torch.sqrt(sum(((p - p.detach()) ** 2).sum() for p in params)))
        loss = sum(((p - 0.1) ** 2).mean() for p in params)
        return LossOutput(loss * float("nan") if i in self.nan_loss else loss)


def test_non_finite_loss_or_gradient_skips_the_update():
    module, rows, trainer = run_stream(ScriptedEnv(num_tasks=4), ScheduledObjective({1}, {2}), num_tasks=4,
                                       max_turns=1)
    assert module.counters["skipped_nonfinite"] == 2
    assert module.counters["updates"] == 2  # tasks 0 and 3
    assert float(trainer.callback_metrics["train/skipped_nonfinite"]) == 2
    for i in (1, 2):  # adapter and AdamW moments exactly as after the previous task
        torch.testing.assert_close(rows[i]["adapter"], rows[0]["adapter"], rtol=0, atol=0)
        torch.testing.assert_close(rows[i]["optimizer"], rows[0]["optimizer"], rtol=0, atol=0)
        assert rows[i]["stats"]["updates"] == 0
        assert all(g is None for g in rows[i]["grads"])  # no stale (NaN) gradient survives
    moved = [not torch.equal(rows[3]["adapter"][k], rows[0]["adapter"][k]) for k in rows[0]["adapter"]]
    assert any(moved)  # learning resumes after the skipped updates
    assert int(rows[3]["optimizer"]["state"][0]["step"]) == 2


class NaNWhenReplayed(ScheduledObjective):
    """Finite on its own task; NaN when task 0's episode comes back as a replayed one."""

    def __init__(self):
        super().__init__(set(), set())
        self.current = -1

    def prepare(self, policy, episode):
        self.current = episode.task.index
        return torch.zeros(1)  # something to cache: the episode joins the replay buffer

    def loss(self, policy, episode, prepared):
        out = super().loss(policy, episode, prepared)
        replayed = episode.task.index != self.current
        return LossOutput(out.loss * float("nan")) if replayed and episode.task.index == 0 else out


def test_a_non_finite_replayed_episode_skips_the_step():
    module, rows, _ = run_stream(ScriptedEnv(num_tasks=4, verify_every=1), NaNWhenReplayed(), num_tasks=4,
                                 max_turns=1, replay=ReplayConfig(k=1, buffer_size=1))
    # buffer of one: task 1 replays task 0 (NaN: skipped), tasks 2 and 3 replay tasks 1 and 2
    assert module.counters["skipped_nonfinite"] == 1 and module.counters["updates"] == 3
    assert [r["stats"]["updates"] for r in rows] == [1, 0, 1, 1]
    torch.testing.assert_close(rows[1]["adapter"], rows[0]["adapter"], rtol=0, atol=0)
    assert all(g is None for g in rows[1]["grads"])
    assert rows[3]["stats"]["update/replayed"] == 1.0


# --- bad model output -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def policy():
    return load_policy(ModelConfig(name_or_path="tiny-random", dtype="float32", lora=LoraSettings(rank=2)))


def test_overlong_output_is_cut_and_no_action_is_an_invalid_turn(policy):
    env = ScriptedEnv(num_tasks=1, episode_steps=3)
    cfg = RolloutConfig(max_turns=3, max_new_tokens=5, stop_after_action=False)
    ep = rollout(policy.model, policy.tokenizer, env, env.tasks()[0], cfg)
    assert len(ep.turns) == 3
    for turn in ep.turns:
        start, end = turn.span
        assert 1 <= end - start <= cfg.max_new_tokens  # cut at the turn budget
        assert all(r == ROLE_ASSISTANT for r in ep.roles[start:end])
        assert turn.action is None and not turn.valid  # random bytes: no 'Action:' line
    assert ep.num_invalid == 3 and ep.error is None
