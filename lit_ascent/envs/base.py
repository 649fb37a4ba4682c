"""The environment protocol: reset a task -> first observation; step an action.

Adapters keep the environment's raw replies and report, per step, whether the
action was executed (``valid``, the paper's d_{i,t}) and, at the end, whether the
verifier accepted the episode (``verified``, v_i). Constructors are cheap: heavy
state (recipe trees, game engines) is built lazily on first use.

A subclass must define ``tasks``, ``reset`` and ``step``; one that leaves any out
cannot be built, and the error names the class and the missing methods (Python's
abstract-class check would too, but the config parser hides it behind "is abstract").
"""
from __future__ import annotations

import copy
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

from lit_ascent.trajectory import Task

_ACTION_RE = re.compile(r"^\s*(?:\*\*)?action(?:\*\*)?\s*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)


def parse_action(text: str) -> str | None:
    """The last ``Action: ...`` line of a ReAct turn, or None if there is none."""
    found = _ACTION_RE.findall(text)
    if not found:
        return None
    action = found[-1].strip().strip("`").strip()
    return action or None


def stable_unit(text: str) -> float:
    """A number in [0, 1) from ``text``, identical on every machine and process (no ``hash()`` salt)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def action_span(text: str) -> tuple[int, int] | None:
    """[start, end) of the last ``Action:`` line's action in ``text`` (the part ``parse_action`` reads)."""
    last = None
    for last in _ACTION_RE.finditer(text):
        pass
    return None if last is None else last.span(1)


def action_token_mask(tokenizer, ids: list[int]) -> list[bool]:
    """Per generated token of one assistant turn: does it spell part of the turn's action?

    A token covers the characters its decoding adds to the decoded prefix; it is an action token
    when that range overlaps ``action_span`` of the turn's decoded text (special tokens skipped).
    """
    span = action_span(tokenizer.decode(ids, skip_special_tokens=True))
    if span is None:
        return [False] * len(ids)
    mask, prev = [], 0
    for k in range(1, len(ids) + 1):
        cur = len(tokenizer.decode(ids[:k], skip_special_tokens=True))
        mask.append(prev < span[1] and cur > span[0] and cur > prev)
        prev = max(prev, cur)
    return mask


REQUIRED_METHODS = ("tasks", "reset", "step")
"""The methods every environment must define (the rest of ``TextEnv`` has defaults)."""


class IncompleteEnvError(TypeError, ValueError):
    """A ``TextEnv`` subclass that leaves a required method out was built.

    A TypeError like Python's own abstract-class error, and a ValueError so that the
    CLI reports it as a bad ``data.env`` (one ``error:`` line) instead of a traceback.
    """


def class_path(cls: type) -> str:
    """``module.QualName`` of ``cls``, as a config's ``class_path`` names it."""
    return f"{cls.__module__}.{cls.__qualname__}"


def missing_methods(cls: type) -> list[str]:
    """The ``REQUIRED_METHODS`` that ``cls`` does not define (still ``TextEnv``'s placeholders)."""
    return [m for m in REQUIRED_METHODS if getattr(cls, m, None) is getattr(TextEnv, m)]


@dataclass
class StepResult:
    """What the environment says about one action."""

    observation: str
    """Raw reply of the environment."""
    done: bool = False
    """The episode is over (solved, or the environment ended it)."""
    verified: bool = False
    """The verifier accepts the episode (only meaningful when ``done``)."""
    valid: bool = True
    """The action was executed (False: rejected / nothing happened)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Anything else. On the step that ends the episode, ``info["score"]`` is the environment's graded
    score where it grades episodes (WebShop's reward in [0, 1]); it becomes ``Episode.score``."""


class TextEnv:
    """A text environment with a task list, a ReAct prompt and a verifier.

    Required: ``tasks``, ``reset``, ``step``. Optional: ``system_prompt``, ``verify_at_end``,
    ``goal_line``, ``close``, ``fresh`` and the ``name`` attribute. The constructor only stores settings;
    heavy state (game engines, processes, data) is built lazily on first use.
    """

    name: str = "env"
    """Short environment name, written into every ``Task.env`` and the logs."""

    def __new__(cls, *args: Any, **kwargs: Any) -> TextEnv:
        if missing := missing_methods(cls):
            listed = ", ".join(f"{m}()" for m in missing)
            raise IncompleteEnvError(
                f"{class_path(cls)} cannot be built: it does not define {listed} "
                f"(a TextEnv must define {', '.join(f'{m}()' for m in REQUIRED_METHODS)})")
        return super().__new__(cls)

    def tasks(self) -> list[Task]:
        """Required. Every task this configured environment offers, in a fixed order."""
        raise NotImplementedError

    def reset(self, task: Task) -> str:
        """Required. Start ``task``; return the first observation (the task description) as one string."""
        raise NotImplementedError

    def step(self, action: str) -> StepResult:
        """Required. Execute one parsed action; return a ``StepResult`` (not a gym-style tuple)."""
        raise NotImplementedError

    def verify_at_end(self) -> bool:
        """The verifier's verdict when the episode ends by the turn budget (default: unsolved)."""
        return False

    def goal_line(self, first_observation: str) -> str:
        """The task's goal in one line, e.g. for a memory of earlier tasks. Default: the last
        non-empty line of the first observation (TextCraft's "Goal: ...", ALFWorld's "Your task is to: ...")."""
        lines = [line.strip() for line in first_observation.splitlines() if line.strip()]
        return lines[-1] if lines else ""

    def system_prompt(self) -> str:
        """Instructions (ReAct format, action syntax, examples) for the agent."""
        return (
            "You are an agent solving a task in a text environment. "
            "Each turn, write one short line of reasoning starting with 'Thought:' "
            "and then one line 'Action: <action>'."
        )

    def close(self) -> None:
        """Release resources (processes, files): stop a game server here. Called when the stream
        ends and on an instance abandoned after a fault."""

    def fresh(self) -> TextEnv:
        """A new environment with this one's settings, independent of it (batched evaluation,
        probes, the rebuild after a fault). Default: a deep copy; an environment whose live
        episode cannot be copied (ALFWorld's game, a process or a socket) overrides this to
        build a new instance from its settings instead."""
        try:
            return copy.deepcopy(self)
        except (TypeError, copy.Error) as err:  # e.g. cannot pickle '_thread.RLock' object
            raise TypeError(f"{type(self).__name__}.fresh(): the default deep copy failed ({err}); override "
                            f"fresh() to build a new instance from this one's settings, e.g. "
                            f"`return {type(self).__name__}(...)`") from err


class ScriptedEnv(TextEnv):
    """A deterministic environment for tests and the debug config.

    Task k is verified iff ``k % verify_every == 0``, when ``episode_steps`` actions
    were taken or the turn budget ends the episode (so even a random model yields
    verified episodes); an action is valid iff it was parsed and does not contain
    the word ``bad``. It exercises the whole loop without a real game.
    """

    name = "scripted"

    def __init__(self, num_tasks: int = 8, episode_steps: int = 2, verify_every: int = 2):
        """
        Args:
            num_tasks: How many tasks the environment offers.
            episode_steps: Steps after which every episode ends.
            verify_every: Task k is verified iff k % verify_every == 0 (1: all).
        """
        if num_tasks < 1 or episode_steps < 1 or verify_every < 1:
            raise ValueError("ScriptedEnv: num_tasks, episode_steps and verify_every must be >= 1")
        self.num_tasks, self.episode_steps, self.verify_every = num_tasks, episode_steps, verify_every
        self._task: Task | None = None
        self._steps = 0

    def tasks(self) -> list[Task]:
        return [Task(self.name, f"task-{k}", meta=(("family", f"f{k % 2}"),)) for k in range(self.num_tasks)]

    def reset(self, task: Task) -> str:
        self._task, self._steps = task, 0
        return f"Goal: finish {task.task_id} in {self.episode_steps} steps."

    def verify_at_end(self) -> bool:
        assert self._task is not None, "reset() first"
        return int(self._task.task_id.split("-")[1]) % self.verify_every == 0

    def step(self, action: str) -> StepResult:
        self._steps += 1
        done = self._steps >= self.episode_steps
        valid = "bad" not in action.lower()
        verified = done and self.verify_at_end()
        obs = f"Step {self._steps}: you did '{action}'." if valid else "Nothing happens."
        return StepResult(obs, done=done, verified=verified, valid=valid)
