"""Verified demonstrations for the warm start, in the rollout's exact token layout.

Three kinds (issue 5):

- ``plain``: a planner's solution, one short templated "Thought:" per action.
- ``recovery``: one wrong action, the environment's real error reply, a thought
  that uses the error, then the correct continuation. The mistake's turns are
  listed in ``Demo.mistake_turns`` so behaviour cloning can leave them out.
- ``hindsight``: a plain demo whose system prompt carries the privileged block
  of the same task, rendered exactly as the ASCENT teacher sees it; the model
  learns to use that block.

Every demo is replayed through the real environment (``lit_ascent.replay``) and
kept only if the verifier accepts it and its invalid turns are exactly the
expected ones.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from lit_ascent.envs.base import TextEnv
from lit_ascent.privileged import render_privileged
from lit_ascent.replay import replay
from lit_ascent.trajectory import Episode, Task

DEMO_KINDS = ("plain", "recovery", "hindsight")
PI_CONTENT = "reasoning_actions"
"""What the hindsight block shows: the same as the teacher's default ``pi_content``."""


@dataclass
class Demo:
    """One verified demonstration episode."""

    kind: str
    """plain | recovery | hindsight."""
    episode: Episode
    error_kind: str | None = None
    """Recovery demos: which mistake was made (e.g. ``craft_early``)."""
    mistake_turns: tuple[int, ...] = ()
    """Turns that show the mistake itself (left out of the BC loss unless asked)."""
    context: str | None = None
    """Hindsight demos: the privileged block appended to the system prompt."""

    def record(self) -> dict:
        """JSON-ready summary (for ``demos.jsonl`` next to the adapter)."""
        return {"kind": self.kind, "error_kind": self.error_kind, "mistake_turns": list(self.mistake_turns),
                "tokens": len(self.episode.token_ids), "task_id": self.episode.task.task_id,
                "seed": self.episode.task.seed, "texts": [t.text for t in self.episode.turns],
                "observations": [t.observation for t in self.episode.turns], "context": self.context}


@dataclass
class Script:
    """The assistant texts of a demo before replay, and what the replay must show."""

    texts: list[str]
    mistake_turns: tuple[int, ...] = ()
    invalid_turns: tuple[int, ...] = ()
    """Turns the environment must reject (all others must be valid)."""
    error_kind: str | None = None


def react(thought: str, action: str) -> str:
    """One assistant turn in the prompts' ReAct format."""
    return f"Thought: {thought}\nAction: {action}"


@dataclass
class DemoStats:
    """How many demos of each kind were built, and why others were dropped."""

    kept: Counter = field(default_factory=Counter)
    rejected: Counter = field(default_factory=Counter)
    error_kinds: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        return {"kept": dict(self.kept), "rejected": dict(self.rejected), "error_kinds": dict(self.error_kinds)}


def check_replay(tokenizer, env: TextEnv, task: Task, script: Script,
                 context: str | None = None) -> tuple[Episode, str | None]:
    """(replayed episode, None) or (episode, why it is rejected: unverified, ended early, wrong invalid turns)."""
    ep = replay(tokenizer, env, task, script.texts, context=context)
    if not ep.verified:
        return ep, "unverified"
    if len(ep.turns) != len(script.texts):
        return ep, "ended_early"
    invalid = tuple(t.index for t in ep.turns if not t.valid)
    if invalid != tuple(script.invalid_turns):
        return ep, "invalid_turns"
    return ep, None


def privileged_block(episode: Episode) -> str:
    """The hindsight text of a verified episode, exactly as the teacher renders it."""
    return render_privileged(episode.turns, PI_CONTENT)


def cycle_tasks(tasks: list[Task], start: int) -> Iterator[Task]:
    """``tasks`` from ``start`` on, round after round; round r uses ``Task.seed = r``
    (another draw of the distractors), so more demos than goals stay distinct."""
    n = len(tasks)
    k = start
    while True:
        task = tasks[k % n]
        yield dataclasses.replace(task, seed=task.seed + k // n)
        k += 1


ScriptFn = Callable[[Task, int], "Script | None"]
"""(task, k) -> the k-th demo script of a kind for ``task`` (None: not applicable)."""


def build_kind(tokenizer, env: TextEnv, tasks: Iterator[Task], kind: str, count: int, script_fn: ScriptFn,
               stats: DemoStats, max_tokens: int | None, max_attempts: int) -> list[Demo]:
    """``count`` verified demos of one kind from the task iterator (at most ``max_attempts`` tries)."""
    demos: list[Demo] = []
    for _ in range(max_attempts):
        if len(demos) >= count:
            break
        task = next(tasks)
        demo = _one_demo(tokenizer, env, task, kind, script_fn(task, len(demos)), stats)
        if demo is None:
            continue
        if max_tokens is not None and len(demo.episode.token_ids) > max_tokens:
            stats.rejected[f"{kind}:too_long"] += 1
            continue
        demos.append(demo)
        stats.kept[kind] += 1
        if demo.error_kind:
            stats.error_kinds[demo.error_kind] += 1
    return demos


def _one_demo(tokenizer, env: TextEnv, task: Task, kind: str, script: Script | None,
              stats: DemoStats) -> Demo | None:
    if script is None:
        stats.rejected[f"{kind}:not_applicable"] += 1
        return None
    context = None
    if kind == "hindsight":
        reference, why = check_replay(tokenizer, env, task, script)
        if why:
            stats.rejected[f"{kind}:{why}"] += 1
            return None
        context = privileged_block(reference)
    ep, why = check_replay(tokenizer, env, task, script, context)
    if why:
        stats.rejected[f"{kind}:{why}"] += 1
        return None
    return Demo(kind, ep, script.error_kind, script.mistake_turns, context)


def build_demos(tokenizer, env: TextEnv, tasks: list[Task], counts: dict[str, int],
                scripts: dict[str, ScriptFn], max_tokens: int | None = None,
                attempts_per_demo: int = 3) -> tuple[list[Demo], DemoStats]:
    """Demos of every kind; each kind starts at its own offset of ``tasks`` so the kinds
    cover different goals first (they share goals only when there are more demos than goals)."""
    if not tasks:
        raise ValueError("warmstart: no training tasks to build demonstrations from")
    unknown = set(counts) - set(DEMO_KINDS)
    if unknown:
        raise ValueError(f"warmstart: unknown demo kinds {sorted(unknown)}; expected {DEMO_KINDS}")
    stats, demos, offset = DemoStats(), [], 0
    for kind in DEMO_KINDS:
        n = counts.get(kind, 0)
        if n > 0:
            it = cycle_tasks(tasks, offset)
            demos += build_kind(tokenizer, env, it, kind, n, scripts[kind], stats, max_tokens,
                                attempts_per_demo * n)
        offset += n
    return demos, stats
