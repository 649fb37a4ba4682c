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

import argparse
import sys
import warnings
from typing import Callable

from lit_ascent.envs.base import TextEnv, parse_action
from lit_ascent.models import load_tokenizer
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lit_ascent.replay",
                                description="Replay actions (or the environment's solver) on one task of the "
                                            "stream and print the transcript.",
                                epilog="Other options (--config ...) are train.py's; the environment, "
                                       "task order and tokenizer come from them.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--task", type=int, help="Stream index of the task (data.seed order).")
    which.add_argument("--task-id", help="Task id (e.g. minecraft:oak_sign, task-3).")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--actions", nargs="+", help="Actions, one per turn (or whole turn texts with an "
                                                   "'Action:' line).")
    what.add_argument("--solver", action="store_true", help="The environment's own solution (TextCraft's "
                                                            "solver, ALFWorld's planner, expert_actions).")
    return p


def main(argv: list[str] | None = None) -> Episode:
    """Parse ``argv``, replay the actions on the chosen task, print the transcript; returns the episode."""
    from lit_ascent.cli import main as cli_main

    parser = build_parser()
    args, cli_args = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
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
            parser.error(str(err))
        episode = replay(load_tokenizer(cli.model.llm_cfg), data.env, task, texts)
    finally:
        data.teardown()
    print(render(episode))
    return episode


if __name__ == "__main__":
    main()
