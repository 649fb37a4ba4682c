"""Replay given assistant turns through an environment into an Episode.

The bookkeeping is the rollout's own (``EpisodeRun``), so the token layout is
exactly a generated episode's: a replayed expert or scripted trajectory can be
distilled, imitated or shown as privileged information like a generated one.

As a command it checks an environment without a model that writes parseable actions:
the actions given (or the environment's own solver) run through the environment as
the stream runs it (the config's ``data.env`` inside ``GuardedEnv``, the task order of
``data.seed``, the rollout's bookkeeping, the config's tokenizer but no model weights),
and the transcript is printed: each turn's text, action, valid flag and observation,
then verified / turns / invalid.

    python -m lit_ascent.replay --config configs/textcraft/ascent.yaml --task 3 --solver
    python -m lit_ascent.replay --config configs/debug.yaml --task-id task-1 --actions "go" "bad move"

``--task`` is a stream index; tasks past ``data.num_tasks`` continue the same order.
Every other option (``--config``, ``--data.env.init_args.split eval``, ...) is train.py's.
"""
from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, fields
from typing import Callable

from lit_ascent.envs.base import TextEnv, parse_action
from lit_ascent.models import load_tokenizer
from lit_ascent.options import flag, options_parser, parse_options
from lit_ascent.rollout import EpisodeRun, RolloutConfig
from lit_ascent.trajectory import Episode, Task
from lit_ascent.transcript import render


def replay(tokenizer, env: TextEnv, task: Task, texts: list[str], context: str | None = None) -> Episode:
    """An Episode whose assistant turns are ``texts`` (each closed by the end-of-turn token)."""
    if not texts:
        raise ValueError("replay: texts must hold at least one assistant turn")
    run = EpisodeRun(tokenizer, env, task, RolloutConfig(max_turns=len(texts), max_context_tokens=1 << 30),
                     context)
    for text in texts:
        gen = tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        if run.budget() <= 0 or run.end_turn(gen, closed=True) is None:
            break
    return run.finish()


def turn_text(action: str) -> str:
    """The assistant turn for ``action``: as given when it has an ``Action:`` line, else ``Action: <action>``."""
    return action if parse_action(action) is not None else f"Action: {action}"


def solver_for(env: TextEnv) -> Callable[[Task], list[str]]:
    """The environment's own solver (task -> actions): its ``expert_actions`` (TextCraft's solver,
    ALFWorld's planner; any environment may define one); ValueError when it has none."""
    if hasattr(env, "expert_actions"):
        return env.expert_actions
    raise ValueError(f"--solver: {type(env).__name__} has no solver; define expert_actions(task) -> list[str] "
                     "on it, or give the actions with --actions")


def pick_task(stream: list[Task], index: int | None = None, task_id: str | None = None) -> Task:
    """The task at stream position ``index``, or the one whose id is ``task_id``."""
    if task_id is not None:
        found = [t for t in stream if t.task_id == task_id]
        if not found:
            raise ValueError(f"--task-id {task_id!r}: no such task (e.g. {', '.join(t.task_id for t in stream[:3])})")
        return found[0]
    if index is None or not 0 <= index < len(stream):
        raise ValueError(f"--task must be a stream index in [0, {len(stream)}), got {index}")
    return stream[index]


def chosen_turns(stream: list[Task], env: TextEnv, index: int | None, task_id: str | None,
                 actions: list[str] | None) -> tuple[Task, list[str]]:
    """The chosen task and its assistant turns: ``actions``, or the environment's solver's when None."""
    task = pick_task(stream, index, task_id)
    actions = actions or solver_for(env)(task)
    if not actions:
        raise ValueError(f"--solver found no actions for task {task.task_id}")
    return task, [turn_text(a) for a in actions]


@dataclass
class ReplayOptions:
    """Replay actions (or the environment's solver) on one task of the stream and print the transcript.
    Every other option (--config ...) is train.py's; the environment, task order and tokenizer come from it."""

    task: int | None = None
    """Stream index of the task (data.seed order); give this or --task-id."""
    task_id: str | None = None
    """Task id (e.g. minecraft:oak_sign, task-3)."""
    actions: list[str] | None = None
    """Actions, one per turn (or whole turn texts with an 'Action:' line); give these or --solver."""
    solver: bool = False
    """The environment's own solution (TextCraft's solver, ALFWorld's planner, expert_actions)."""

    def __post_init__(self) -> None:
        if (self.task is None) == (self.task_id is None):
            raise ValueError("give exactly one of --task and --task-id")
        if (self.actions is None) == (not self.solver):
            raise ValueError("give exactly one of --actions and --solver")


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(replay's own options with their values, the rest for train.py's CLI). An option's values are
    the arguments up to the next one that starts with ``--``; ``--help`` is replay's."""
    own_flags = {flag(f.name) for f in fields(ReplayOptions)} | {"-h", "--help"}
    own, rest, target = [], [], None
    for arg in argv:
        if arg.startswith("--") or arg == "-h":
            target = own if arg.split("=", 1)[0] in own_flags else rest
        (target if target is not None else rest).append(arg)
    return own, rest


def main(argv: list[str] | None = None) -> Episode:
    """Parse ``argv``, replay the actions on the chosen task, print the transcript; returns the episode."""
    from lit_ascent.cli import main as cli_main

    own, cli_args = split_argv(sys.argv[1:] if argv is None else argv)
    args = parse_options(ReplayOptions, own, prog="python -m lit_ascent.replay")
    with warnings.catch_warnings():  # LightningCLI warns that sys.argv holds more than cli_args: on purpose
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        cli = cli_main(cli_args, run=False)  # builds the objects, loads no model (a fit loads it)
    data = cli.datamodule
    data.num_tasks = None  # every task in stream order: the configured stream is its prefix
    data.setup()
    try:
        try:
            task, texts = chosen_turns(data.stream, data.env.inner, args.task, args.task_id, args.actions)
        except ValueError as err:
            options_parser(ReplayOptions, prog="python -m lit_ascent.replay").error(str(err))
        episode = replay(load_tokenizer(cli.model.llm_cfg), data.env, task, texts)
    finally:
        data.teardown()
    print(render(episode))
    return episode


if __name__ == "__main__":
    main()
