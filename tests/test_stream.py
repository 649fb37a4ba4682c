"""The online protocol: fresh weights per episode, gated updates, one pass in order."""
from __future__ import annotations

import lightning as L
import torch

from callbacks import EpisodeCallback, InvalidTurnFilter, VerificationGate
from datamodules import TaskStreamDataModule
from lit_ascent.stream_order import stream_order
from lit_ascent.envs import ScriptedEnv
from lit_ascent.module import OaTTTModule
from lit_ascent.optim import OptimConfig
from lit_ascent.objectives import Distillation
from lit_ascent.rollout import RolloutConfig
from lit_ascent.trajectory import Task
from tests.conftest import TINY


def _flat(state: dict) -> torch.Tensor:
    return torch.cat([v.flatten() for _, v in sorted(state.items())])


class Recorder(EpisodeCallback):
    """Adapter snapshot when each episode is generated and after its update."""

    def __init__(self):
        self.at_rollout, self.after_update, self.order = [], [], []

    def on_episode(self, trainer, pl_module, outcome):
        self.at_rollout.append(_flat(pl_module.policy.adapter_state()))
        self.order.append((outcome.episode.task.index, outcome.episode.verified))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after_update.append(_flat(pl_module.policy.adapter_state()))


def run_stream(tmp_path, env, callbacks, num_tasks=None):
    L.seed_everything(0)
    module = OaTTTModule(llm=TINY, objective=Distillation(chunk_size=32),
                         rollout=RolloutConfig(max_turns=2, max_new_tokens=6), optim=OptimConfig(lr=5e-2))
    data = TaskStreamDataModule(env, num_tasks=num_tasks, seed=0)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                        default_root_dir=tmp_path)
    trainer.fit(module, data)
    return module


def test_episode_of_next_task_uses_weights_after_previous_update(tmp_path):
    rec = Recorder()
    run_stream(tmp_path, ScriptedEnv(num_tasks=4, verify_every=1), [rec])
    assert len(rec.at_rollout) == 4
    for i in range(3):
        assert not torch.equal(rec.at_rollout[i], rec.after_update[i]), f"task {i} did not update"
        assert torch.equal(rec.at_rollout[i + 1], rec.after_update[i]), f"task {i + 1} used stale weights"


def test_gate_updates_only_verified_episodes(tmp_path):
    rec = Recorder()
    module = run_stream(tmp_path, ScriptedEnv(num_tasks=4, verify_every=2), [VerificationGate(), InvalidTurnFilter(), rec])
    verified = dict(rec.order)
    assert sorted(verified.values()) == [False, False, True, True]
    for i, (idx, ok) in enumerate(rec.order):
        changed = not torch.equal(rec.at_rollout[i], rec.after_update[i])
        assert changed == ok, f"task {idx}: verified={ok} but adapter changed={changed}"
    assert module.counters["updates"] == 2


def test_without_gate_every_episode_updates(tmp_path):
    module = run_stream(tmp_path, ScriptedEnv(num_tasks=3, verify_every=3), [])
    assert module.counters["updates"] == 3


def test_stream_order_is_seeded_one_pass_and_balanced():
    tasks = [Task("e", f"t{k}", meta=(("family", "ab"[k % 2]),)) for k in range(10)]
    a, b = stream_order(tasks, seed=1), stream_order(tasks, seed=1)
    assert a == b and sorted(t.task_id for t in a) == sorted(t.task_id for t in tasks)
    assert stream_order(tasks, seed=2) != a
    bal = stream_order(tasks, seed=3, balance_by="family")
    fams = [t.info()["family"] for t in bal]
    assert all(fams[i] != fams[i + 1] for i in range(len(fams) - 1))


def test_datamodule_prefix_indices_and_seeds():
    dm = TaskStreamDataModule(ScriptedEnv(num_tasks=6), num_tasks=4, seed=5)
    dm.setup("fit")
    assert [t.index for t in dm.stream] == [0, 1, 2, 3]
    assert len({t.seed for t in dm.stream}) == 4
    batches = list(dm.train_dataloader())
    assert [b[0] for b in batches] == dm.stream
