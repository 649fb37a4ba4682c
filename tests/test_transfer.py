"""TransferEval: frozen evaluation of the current adapter on its own env's fixed task subset."""
import lightning as L
import pytest
from conftest import TINY
from lightning.pytorch.loggers import Logger
from torch.testing import assert_close

from callbacks import TransferEval, VerificationGate
from datamodules import TaskStreamDataModule
from lit_ascent.envs import ScriptedEnv
from lit_ascent.module import OaTTTModule
from lit_ascent.objectives import Distillation
from lit_ascent.rollout import RolloutConfig


class MemoryLogger(Logger):
    """Keeps every (step, metrics) it is sent."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    @property
    def name(self):
        return "memory"

    @property
    def version(self):
        return 0

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def logged(self, key):
        return [(step, m[key]) for step, m in self.rows if key in m]



def stream_trainer(tmp_path, callbacks, objective, num_tasks=4):
    module = OaTTTModule(llm=TINY, objective=objective, rollout=RolloutConfig(max_turns=2, max_new_tokens=8))
    data = TaskStreamDataModule(ScriptedEnv(num_tasks=num_tasks, episode_steps=2, verify_every=1), seed=0)
    logger = MemoryLogger()
    trainer = L.Trainer(accelerator="cpu", max_epochs=1, logger=logger, callbacks=callbacks,
                        default_root_dir=str(tmp_path), enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, log_every_n_steps=1)
    trainer.fit(module, datamodule=data)
    return trainer, module, logger


def test_transfer_logs_every_k_and_at_the_end_without_touching_the_adapter(tmp_path):
    transfer = TransferEval(ScriptedEnv(num_tasks=5, episode_steps=2, verify_every=2), every_n_tasks=2,
                            num_tasks=3, seed=1)
    trainer, module, logger = stream_trainer(tmp_path, [VerificationGate(), transfer], Distillation(chunk_size=64),
                                             num_tasks=3)
    # every 2 tasks (after task 2) and at the end of the 3-task stream
    assert [s for s, _ in logger.logged("transfer/success_rate")] == [2, 3]
    for key in ("transfer/success_rate", "transfer/turns", "transfer/invalid_rate"):
        assert len(logger.logged(key)) == 2
    assert len(transfer.tasks) == 3 and len(transfer.history) == 2
    assert (tmp_path / "transfer.jsonl").read_text().count("\n") == 2
    # a later evaluation leaves the adapter exactly as it was
    before = module.policy.adapter_state()
    transfer._tasks_seen += 1
    metrics = transfer.evaluate(trainer, module)
    assert 0.0 <= metrics["transfer/success_rate"] <= 1.0
    for name, value in module.policy.adapter_state().items():
        assert_close(value, before[name])
    assert module.counters["updates"] >= 1  # the stream itself did learn


def test_transfer_at_end_only_is_not_repeated(tmp_path):
    transfer = TransferEval(ScriptedEnv(num_tasks=3), every_n_tasks=2, num_tasks=2)
    _, _, logger = stream_trainer(tmp_path, [transfer], Distillation(chunk_size=64), num_tasks=2)
    assert [s for s, _ in logger.logged("transfer/turns")] == [2]  # the end coincides with k


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="every_n_tasks"):
        TransferEval(ScriptedEnv(), every_n_tasks=-1)
    with pytest.raises(ValueError, match="num_tasks"):
        TransferEval(ScriptedEnv(), num_tasks=0)
