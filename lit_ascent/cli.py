"""LightningCLI for the stream: ``python train.py fit --config ...``.

Infrastructure callbacks (experience log, adapter saving, diagnostics, report,
transcripts, held-out evaluation) are always on and configured under their own keys;
``trainer.callbacks`` holds only the method's callbacks (gate, filter), so an
ablation is a swap of that list. Their order does not change what a task's record
holds: the module hands each task's ``TaskOutcome`` to the episode callbacks inside
the training step and builds the record before any ``on_train_batch_end`` runs
(``lit_ascent/outcome.py``).

Where a run writes: ``trainer.default_root_dir``, when set, moves the logger's
``save_dir`` with it (see ``follow_default_root_dir``). A bad config value is
reported like the parser's own errors: one message naming the option, exit code 2
(``JSONARGPARSE_DEBUG=true`` shows the traceback instead).
"""
from __future__ import annotations

import logging
import re
import sys
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jsonargparse
from lightning.pytorch.cli import LightningCLI

from callbacks import AdapterCheckpoint, CollapseDiagnostics, ExperienceLog, StreamReport, StreamStats
from callbacks.heldout import HeldOutEval
from callbacks.stream_checkpoint import StreamCheckpoint, prepare_resume
from callbacks.transcript import EpisodeTranscripts, LoggedConfig
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


CONFIG_ERRORS = (ValueError, FileNotFoundError)
"""What a bad value raises while the config becomes objects: constructors and ``__post_init__`` only
validate (no models, no environments), and ``--ckpt_path`` names a missing checkpoint."""

_JSONARGPARSE = str(Path(jsonargparse.__file__).parent)


def unwrap(err: BaseException) -> BaseException:
    """The exception behind jsonargparse's wrappers (its Union handling re-raises ``from`` the original)."""
    def raised_by_jsonargparse(e: BaseException) -> bool:
        return traceback.extract_tb(e.__traceback__)[-1].filename.startswith(_JSONARGPARSE)

    while err.__cause__ is not None and raised_by_jsonargparse(err):
        err = err.__cause__
    return err


def given_outside_config_files(args: Any, key: str) -> bool:
    """Whether the command line sets ``key`` itself (``--a.b.key v``, ``--a.b.key=v`` or ``key:`` inside
    a YAML/JSON value), not through a ``--config`` file. A path that merely contains ``key`` does not count."""
    if not isinstance(args, (list, tuple)):
        return key in str(args)  # a dict or Namespace: the whole config, all of it explicit

    def sets_key(arg: str) -> bool:
        option, _, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        return option.endswith(f".{key}") or re.search(rf"\b{key}[\"']?\s*:", value) is not None

    return any(sets_key(arg) for before, arg in zip(["", *args], args)
               if before != "--config" and not arg.startswith("--config="))


def follow_default_root_dir(trainer_cfg: Any, save_dir_given: bool) -> None:
    """``trainer.default_root_dir``, when set, decides where a run writes: the logger's ``save_dir``
    (TensorBoardLogger, CSVLogger) becomes it, so fresh runs and ``--ckpt_path last`` both use it.
    A ``save_dir`` given on the command line wins (``lit_ascent.results.compare`` pins its run folders so);
    one from a config file does not (the configs all say ``runs``)."""
    root, logger = trainer_cfg.get("default_root_dir"), trainer_cfg.get("logger")
    init_args = logger.get("init_args") if hasattr(logger, "get") else None
    if root is not None and not save_dir_given and init_args is not None and "save_dir" in init_args:
        init_args["save_dir"] = root


class AscentCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(StreamStats, "stream_stats")
        parser.add_lightning_class_args(ExperienceLog, "experience_log")
        parser.add_lightning_class_args(AdapterCheckpoint, "adapter_checkpoint")
        parser.add_lightning_class_args(CollapseDiagnostics, "diagnostics")
        parser.add_lightning_class_args(StreamReport, "report")
        parser.add_lightning_class_args(EpisodeTranscripts, "transcripts")
        parser.add_lightning_class_args(HeldOutEval, "heldout")  # off until heldout.env is set (configs/heldout/)
        parser.add_lightning_class_args(StreamCheckpoint, "stream_checkpoint")

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        self.save_dir_given = given_outside_config_files(sys.argv[1:] if args is None else args, "save_dir")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        with self.config_errors():
            follow_default_root_dir(config["trainer"], self.save_dir_given)
            if self.subcommand == "fit":  # --ckpt_path last|<run dir>: continue the stream in place
                prepare_resume(config)

    def instantiate_classes(self) -> None:
        with self.config_errors():
            super().instantiate_classes()

    @contextmanager
    def config_errors(self):
        """Report the project's validation errors as the parser reports its own: message, exit 2.

        Any other exception (a bug) keeps its traceback.
        """
        try:
            yield
        except CONFIG_ERRORS as err:
            cause = unwrap(err)
            if not isinstance(cause, CONFIG_ERRORS):
                raise
            self._parser(self.subcommand).error(str(cause), cause)


PACKAGES = ("lit_ascent", "callbacks", "datamodules")


def show_package_logs(level: int = logging.INFO) -> None:
    """Print the project's own log records (the lessons a playbook writes, the held-out evaluation's initial
    score, the vLLM server's start-up) to stderr beside Lightning's lines: Python drops INFO records that no
    handler takes. Called by the entry point (train.py), not by ``main``: a library leaves logging to its
    caller."""
    for name in PACKAGES:
        logger = logging.getLogger(name)
        if not logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
            logger.addHandler(handler)
        logger.setLevel(level)


def main(args=None, run: bool = True) -> AscentCLI:
    """Parse ``args`` (default: sys.argv) and, with ``run``, execute the subcommand."""
    return AscentCLI(OaTTTModule, TaskStreamDataModule, trainer_defaults=TRAINER_DEFAULTS,
                     save_config_callback=LoggedConfig, save_config_kwargs={"overwrite": True}, args=args, run=run)
