"""Evaluate a warm-started reference model: plain, with hindsight, and the control.

- ``plain``: the evaluation tasks as the stream shows them.
- ``hindsight``: the planner's verified trajectory of the same task in the system
  prompt, rendered exactly as the ASCENT teacher sees it (``rollout(context=...)``).
- ``control``: the hindsight block of a *different* task of the same depth/family:
  success there measures copying or format effects, not use of the task's PI.
"""
from __future__ import annotations

from collections.abc import Callable

from lit_ascent.envs.base import TextEnv
from lit_ascent.evaluate import evaluate
from lit_ascent.records import record_rates
from lit_ascent.rollout import RolloutConfig
from lit_ascent.stream_order import stream_order
from lit_ascent.trajectory import Episode, Task
from lit_ascent.warmstart.demos import Script, check_replay, privileged_block

EVAL_MODES = ("plain", "hindsight", "control")


def eval_tasks(tasks: list[Task], num_tasks: int, seed: int, balance_by: str | None = None) -> list[Task]:
    """The first ``num_tasks`` of the stream's order for the same seed (``balance_by``: the
    stream's ``data.balance_by``, e.g. ``family`` for ALFWorld)."""
    return stream_order(tasks, seed, balance_by=balance_by)[:num_tasks]


def reference_contexts(tokenizer, env: TextEnv, tasks: list[Task],
                       script_fn: Callable[[Task, int], Script]) -> list[str]:
    """The privileged block of each task's verified reference (planner) trajectory."""
    out = []
    for task in tasks:
        ep, why = check_replay(tokenizer, env, task, script_fn(task, 0))
        if why:
            raise RuntimeError(f"warmstart eval: the reference trajectory of {task.task_id!r} is rejected: {why}")
        out.append(privileged_block(ep))
    return out


def group_key(task: Task) -> tuple:
    info = task.info()
    return info.get("depth"), info.get("family"), info.get("category")  # TextCraft, ALFWorld, WebShop


def control_contexts(tasks: list[Task], contexts: list[str]) -> list[str]:
    """Context i = the block of the next task of the same (depth, family, category) group, cyclically;
    a task alone in its group borrows from the next task of the whole list."""
    if len(tasks) < 2:
        raise ValueError("warmstart eval: the control needs at least 2 tasks (--num-tasks >= 2)")
    groups: dict[tuple, list[int]] = {}
    for i, task in enumerate(tasks):
        groups.setdefault(group_key(task), []).append(i)
    out = []
    for i, task in enumerate(tasks):
        members = groups[group_key(task)]
        j = members[(members.index(i) + 1) % len(members)] if len(members) > 1 else (i + 1) % len(tasks)
        out.append(contexts[j])
    return out


def episode_record(e: Episode) -> dict:
    """The JSON record of an evaluation episode: its summary and its decode cost."""
    return {**e.summary(), "generated_tokens": int(e.timings.get("generated_tokens", 0)),
            "rollout_s": round(e.timings.get("rollout_s", 0.0), 2)}


def mode_row(records: list[dict]) -> dict:
    """One mode's row: the rates, the task count and the decode cost of its episode records."""
    return {**record_rates(records), "tasks": len(records),
            "generated_tokens": sum(r["generated_tokens"] for r in records),
            "rollout_s": round(sum(r["rollout_s"] for r in records), 2), "episodes": records}


def evaluate_modes(policy, env: TextEnv, tasks: list[Task], cfg: RolloutConfig, modes: list[str],
                   script_fn: Callable[[Task, int], Script],
                   on_row: Callable[[dict[str, dict], dict[str, list[dict]]], None] | None = None,
                   batch_size: int = 1, done: dict[str, list[dict]] | None = None) -> dict[str, dict]:
    """{mode: success_rate, invalid_rate, turns, tasks, ...} for each requested mode.

    ``on_row(rows of finished modes, {mode: records so far})`` runs after every group of
    episodes (e.g. to save a long run's partial results); ``done[mode]`` holds records of
    the first tasks of a mode finished earlier (an interrupted run continues after them).
    """
    unknown = set(modes) - set(EVAL_MODES)
    if unknown:
        raise ValueError(f"warmstart eval: unknown modes {sorted(unknown)}; expected {EVAL_MODES}")
    pi = reference_contexts(policy.tokenizer, env, tasks, script_fn) if set(modes) - {"plain"} else []
    contexts = {"plain": [None] * len(tasks), "hindsight": pi,
                "control": control_contexts(tasks, pi) if "control" in modes else []}
    rows: dict[str, dict] = {}
    for mode in modes:
        records = list((done or {}).get(mode, []))
        if [r["task_id"] for r in records] != [t.task_id for t in tasks[:len(records)]]:
            raise ValueError(f"warmstart eval: the saved {mode} episodes are not the first tasks of this evaluation")
        k = len(records)

        def save(episodes: list[Episode], mode=mode, records=records) -> None:
            if on_row is not None:
                on_row(rows, {mode: records + [episode_record(e) for e in episodes]})

        episodes = evaluate(policy, env, tasks[k:], cfg, contexts[mode][k:], batch_size=batch_size,
                            on_group=save) if k < len(tasks) else []
        rows[mode] = mode_row(records + [episode_record(e) for e in episodes])
        if on_row is not None:
            on_row(rows, {})
    return rows


def markdown_table(rows: dict[str, dict]) -> str:
    lines = ["| mode | tasks | success rate | invalid-action rate | mean turns |", "|---|---|---|---|---|"]
    for mode, r in rows.items():
        lines.append(f"| {mode} | {r['tasks']} | {r['success_rate']:.3f} | {r['invalid_rate']:.3f} | {r['turns']:.2f} |")
    return "\n".join(lines)
