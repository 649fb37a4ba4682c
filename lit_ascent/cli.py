"""LightningCLI for the stream: ``python train.py fit --config ...``.

Infrastructure callbacks (experience log, adapter saving, diagnostics, report,
held-out evaluation) are always on and configured under their own keys;
``trainer.callbacks`` holds only the method's callbacks (gate, filter), so an
ablation is a swap of that list.
"""
from __future__ import annotations

import warnings

from lightning.pytorch.cli import LightningCLI

from callbacks import AdapterCheckpoint, CollapseDiagnostics, ExperienceLog, StreamReport, StreamStats
from callbacks.heldout import HeldOutEval
from callbacks.stream_checkpoint import StreamCheckpoint, prepare_resume
from datamodules import TaskStreamDataModule
from lit_ascent.module import OaTTTModule

TRAINER_DEFAULTS = {
    "max_epochs": 1,
    "num_sanity_val_steps": 0,
    "limit_val_batches": 0,
    "enable_checkpointing": True,  # our StreamCheckpoint is the checkpoint callback (no ModelCheckpoint)
    "enable_model_summary": False,
    "log_every_n_steps": 1,
    "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
               "init_args": {"save_dir": "runs", "name": "stream"}},
}


# Known-harmless notices: the policy is put in eval mode for rollouts on purpose.
for _pattern in (".*in eval mode.*", ".*LeafSpec.*", ".*litlogger.*"):
    warnings.filterwarnings("ignore", message=_pattern)


class AscentCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(StreamStats, "stream_stats")  # first: its values reach the JSONL
        parser.add_lightning_class_args(ExperienceLog, "experience_log")
        parser.add_lightning_class_args(AdapterCheckpoint, "adapter_checkpoint")
        parser.add_lightning_class_args(CollapseDiagnostics, "diagnostics")
        parser.add_lightning_class_args(StreamReport, "report")
        parser.add_lightning_class_args(HeldOutEval, "heldout")  # off until heldout.env is set (configs/heldout/)
        parser.add_lightning_class_args(StreamCheckpoint, "stream_checkpoint")

    def before_instantiate_classes(self) -> None:
        if self.subcommand == "fit":  # --ckpt_path last|<run dir>: continue the stream in place
            prepare_resume(self.config.fit)


def main(args=None, run: bool = True) -> AscentCLI:
    """Parse ``args`` (default: sys.argv) and, with ``run``, execute the subcommand."""
    return AscentCLI(OaTTTModule, TaskStreamDataModule, trainer_defaults=TRAINER_DEFAULTS,
                     save_config_kwargs={"overwrite": True}, args=args, run=run)
