"""What each run's in-context memory showed the student: tokens per task, entries shown and cut, its size.

Read from the ``memory/*`` keys of the experience records (``lit_ascent.memory.memory_diagnostics``) as pure
functions; ``python -m lit_ascent.results.report`` appends the table to ``results.md`` when a run has a memory.
"""
from __future__ import annotations

import re
import statistics

from lit_ascent.memory import MORE, REJECTED, SOLVED_BY
from lit_ascent.results.paired import Records, Runs, format_number

TOKENS, SHOWN, CUT, SIZE = "memory/tokens", "memory/shown", "memory/cut", "memory/size"
REJECTED_LESSON = re.compile(rf"^- '(.+)' {re.escape(REJECTED)} ")
"""A playbook line quoting a rejected action (``memory.rule_lessons``)."""


def has_memory(records: Records) -> bool:
    """Whether the run had a memory that ever held or showed anything (``NoMemory`` logs zeros)."""
    return any(r.get(SIZE) or r.get(TOKENS) for r in records)


def quoted_actions(text: str | None) -> set[str]:
    """The actions a memory block quotes as worth doing: its ``Action: ...`` lines (a stored episode rendered
    like the PI block) and the actions of the playbook's ``<goal> was solved by: a; b ...`` lessons."""
    quoted = set()
    for line in (text or "").splitlines():
        if line.startswith("Action:"):
            quoted.add(line.removeprefix("Action:").strip())
        elif f" {SOLVED_BY} " in line:
            solved = line.split(f" {SOLVED_BY} ", 1)[1].removesuffix(MORE)
            quoted.update(a.strip() for a in solved.split(";") if a.strip())
    return quoted


def rejected_actions(text: str | None) -> set[str]:
    """The actions a playbook block says were rejected: its ``- '<action>' was rejected: <reply>`` lessons."""
    return {m.group(1) for line in (text or "").splitlines() if (m := REJECTED_LESSON.match(line))}


def _share_in(records: Records, actions_of) -> float | None:
    """On the tasks whose block names some actions (``actions_of(block)``): the share of the agent's actions
    that are one of them, verbatim (None: no such task)."""
    hits = total = 0
    for r in records:
        if named := actions_of(r.get("memory_text")):
            hits += sum(a in named for a in r["actions"])
            total += len(r["actions"])
    return hits / total if total else None


def copied_share(records: Records) -> float | None:
    """The share of actions copied from the block's quoted actions (``quoted_actions``), on the tasks shown
    such a block: a small model copying another task's trajectory instead of solving its own."""
    return _share_in(records, quoted_actions)


def warned_share(records: Records) -> float | None:
    """The share of actions that repeat one the block says was rejected (``rejected_actions``), on the tasks
    shown such a block: whether the playbook's warnings are heeded."""
    return _share_in(records, rejected_actions)


def _success(records: Records) -> float | None:
    return sum(bool(r["verified"]) for r in records) / len(records) if records else None


def memory_stats(records: Records) -> dict:
    """One run: mean and largest memory tokens per task (over all tasks, an empty memory counting 0), the
    share of tasks shown a block, mean entries shown on those tasks, entries cut by the cap (total, and
    tasks with a cut), the memory's size after the last task, the share of actions copied from the block
    (``copied_share``), the share repeating an action the block says was rejected (``warned_share``) and the
    success rate on the tasks shown a block and on the others."""
    tokens = [r.get(TOKENS, 0.0) for r in records]
    with_block = [r for r in records if r.get(TOKENS)]
    shown = [r[SHOWN] for r in with_block]
    cuts = [r.get(CUT, 0.0) for r in records]
    return {
        "tasks": len(records),
        "tokens_mean": statistics.fmean(tokens) if tokens else None,
        "tokens_max": max(tokens, default=None),
        "shown_share": len(shown) / len(records) if records else None,
        "entries_mean": statistics.fmean(shown) if shown else None,
        "cut": sum(cuts),
        "tasks_cut": sum(c > 0 for c in cuts),
        "size_end": records[-1].get(SIZE) if records else None,
        "copied_share": copied_share(records),
        "warned_share": warned_share(records),
        "success_shown": _success(with_block),
        "success_not_shown": _success([r for r in records if not r.get(TOKENS)]),
    }


def memory_rows(runs: Runs) -> list[dict]:
    """One row per (method, seed) whose run had a memory, in the order of ``runs``."""
    return [{"method": method, "seed": seed, **memory_stats(records)}
            for method, seeds in runs.items() for seed, records in sorted(seeds.items()) if has_memory(records)]


def memory_markdown(rows: list[dict]) -> str:
    """The memory rows as a markdown table."""
    head = ["method", "seed", "tasks", "memory tokens per task (mean / max)", "tasks shown memory",
            "entries shown (mean)", "entries cut (total / tasks)", "entries at the end",
            "actions copied from the block", "actions the block says were rejected",
            "success shown a block / not"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(f"| {r['method']} | {r['seed']} | {r['tasks']} | {format_number(r['tokens_mean'], '.0f')} / "
                     f"{format_number(r['tokens_max'], '.0f')} | {format_number(r['shown_share'], '.0%')} | "
                     f"{format_number(r['entries_mean'], '.2f')} | {r['cut']:.0f} / {r['tasks_cut']} | "
                     f"{format_number(r['size_end'], '.0f')} | {format_number(r['copied_share'], '.0%')} | "
                     f"{format_number(r['warned_share'], '.0%')} | "
                     f"{format_number(r['success_shown'], '.0%')} / {format_number(r['success_not_shown'], '.0%')} |")
    return "\n".join(lines) + "\n"
