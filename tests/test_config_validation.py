"""Bad config values fail before any model is loaded, with a message naming the argument:
the parser's own way (usage, one ``error:`` line, exit code 2), never a traceback."""
from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lit_ascent.cli import main
from lit_ascent.envs import ScriptedEnv

ROOT = Path(__file__).resolve().parents[1]
DEBUG = "configs/debug.yaml"
TEXTCRAFT = ["--data.env", "lit_ascent.envs.textcraft.TextCraftEnv"]
NO_UPDATE = ["--model.objective", "lit_ascent.objectives.NoUpdate"]

# (case id, extra CLI args on top of configs/debug.yaml, regex the message must contain)
BAD = [
    ("negative_rank", ["--model.llm.lora.rank", "-1"], r"lora\.rank"),
    ("dropout_one", ["--model.llm.lora.dropout", "1.0"], r"lora\.dropout"),
    ("unknown_dtype", ["--model.llm.dtype", "float8"], r"dtype"),
    ("missing_warm_start", ["--model.llm.warm_start_adapter", "/no/such/adapter"],
     r"warm_start_adapter.*/no/such/adapter"),
    ("unknown_divergence", ["--model.objective.init_args.divergence", "tv"], r"objective\.divergence"),
    ("beta_above_one", ["--model.objective.init_args.beta", "1.5"], r"objective\.beta"),
    ("beta_negative", ["--model.objective.init_args.beta", "-0.1"], r"objective\.beta"),
    ("unknown_pi_content", ["--model.objective.init_args.pi_content", "all"], r"pi_content"),
    ("chunk_size_zero", ["--model.objective.init_args.chunk_size", "0"], r"chunk_size"),
    ("divergence_without_one", [*NO_UPDATE, "--model.objective.init_args.divergence", "jsd"], r"divergence"),
    ("lr_zero", ["--model.optim.lr", "0"], r"optim\.lr"),
    ("lr_negative", ["--model.optim.lr=-1e-4"], r"optim\.lr"),
    ("lr_not_a_number", ["--model.optim.lr", "fast"], r"lr"),
    ("weight_decay_negative", ["--model.optim.weight_decay", "-0.1"], r"weight_decay"),
    ("updates_per_task_zero", ["--model.optim.updates_per_task", "0"], r"updates_per_task"),
    ("grad_clip_negative", ["--model.optim.grad_clip", "-1"], r"grad_clip"),
    ("max_turns_zero", ["--model.rollout.max_turns", "0"], r"rollout\.max_turns"),
    ("max_new_tokens_zero", ["--model.rollout.max_new_tokens", "0"], r"rollout\.max_new_tokens"),
    ("unknown_engine", ["--model.rollout.engine", "llamacpp"], r"rollout\.engine"),
    ("prompt_lookup_negative", ["--model.rollout.fused.prompt_lookup", "-1"], r"rollout\.fused\.prompt_lookup"),
    ("vllm_not_installed", ["--model.rollout.engine", "vllm", "--model.rollout.vllm.python", "/no/such/python"],
     r"rollout\.vllm\.python.*install-vllm"),
    ("num_tasks_zero", ["--data.num_tasks", "0"], r"data\.num_tasks"),
    ("step_timeout_negative", ["--data.step_timeout_s", "-1"], r"data\.step_timeout_s"),
    ("scripted_env_no_tasks", ["--data.env.init_args.num_tasks", "0"], r"num_tasks"),
    ("unknown_env_split", [*TEXTCRAFT, "--data.env.init_args.split", "test"], r"split"),
    ("unknown_env_depth", [*TEXTCRAFT, "--data.env.init_args.depths", "[7]"], r"depths"),
    ("missing_data_dir", [*TEXTCRAFT, "--data.env.init_args.minecraft_dir", "/no/such/minecraft"],
     r"minecraft_dir.*/no/such/minecraft"),
    ("stream_ckpt_every_zero", ["--stream_checkpoint.every_n_tasks", "0"], r"stream_checkpoint\.every_n_tasks"),
    ("stream_ckpt_filename_path", ["--stream_checkpoint.filename", "a/b.pt"], r"stream_checkpoint\.filename"),
    ("adapter_ckpt_negative", ["--adapter_checkpoint.every_n_tasks", "-1"], r"adapter_checkpoint\.every_n_tasks"),
    ("diagnostics_negative", ["--diagnostics.every_n_tasks", "-2"], r"diagnostics\.every_n_tasks"),
    ("misspelt_key", ["--model.optim.lrate", "1e-3"], r"lrate"),
    ("missing_config_file", ["--config", "/no/such/config.yaml"], r"/no/such/config\.yaml"),
]


def outcome(args: list[str], run: bool = False) -> tuple[object, str]:
    """How ``train.py <args>`` ends: its exit code (0 if it returns) or the exception it raised, and its stderr."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            main(args, run=run)
    except SystemExit as exc:
        return exc.code, err.getvalue()
    except Exception as exc:  # a traceback in a real run; the assertion shows it
        return exc, err.getvalue()
    return 0, err.getvalue()


def test_debug_config_is_valid():
    code, message = outcome(["--config", DEBUG])
    assert code == 0, message


@pytest.mark.parametrize("args,pattern", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_value_fails_naming_the_argument(args, pattern):
    code, message = outcome(["--config", DEBUG, *args])
    assert code == 2, f"{args}: {code!r}\n{message[-1500:]}"
    assert re.search(pattern, message, re.DOTALL), message[-1500:]


# As a user runs it: a dataclass field, a nested one, an objective's, a callback's and a data argument.
THROUGH_THE_CLI = [
    (["--model.optim.lr", "-1"], "model.optim.lr must be > 0"),
    (["--model.llm.lora.rank", "-1"], "model.llm.lora.rank must be > 0"),
    (["--model.objective.init_args.divergence", "tv"], "objective.divergence must be one of"),
    (["--model.objective.beta", "1.5"], "objective.beta"),
    (["--diagnostics.every_n_tasks", "-2"], "diagnostics.every_n_tasks must be >= 0"),
    (["--data.num_tasks", "0"], "data.num_tasks must be >= 1"),
    (["--model.replay.k", "-1"], "model.replay.k must be >= 0"),
]


@pytest.mark.parametrize("args,message", THROUGH_THE_CLI, ids=[c[0][0].lstrip("-") for c in THROUGH_THE_CLI])
def test_bad_value_through_train_py_is_one_message(args, message):
    proc = subprocess.run([sys.executable, "train.py", "fit", "--config", DEBUG, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: {message}" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


class BuggyEnv(ScriptedEnv):
    """An environment whose constructor has a bug (not a bad value)."""

    def __init__(self):
        super().__init__()
        self.settings = {}["missing"]


def test_a_bug_in_a_constructor_keeps_its_traceback():
    with pytest.raises(KeyError, match="missing"):
        main(["--config", DEBUG, "--data.env", "test_config_validation.BuggyEnv"], run=False)


@pytest.mark.parametrize("ckpt_path,pattern", [("last", r"ckpt_path=last: no stream_state\.pt"),
                                              ("/no/such/run", r"ckpt_path: no stream_state\.pt in '/no/such/run'")])
def test_resume_without_a_checkpoint_fails_naming_ckpt_path(tmp_path, ckpt_path, pattern):
    args = ["fit", "--config", DEBUG, "--trainer.logger.init_args.save_dir", str(tmp_path), "--ckpt_path", ckpt_path]
    code, message = outcome(args, run=True)
    assert code == 2 and re.search(pattern, message), message[-1500:]
