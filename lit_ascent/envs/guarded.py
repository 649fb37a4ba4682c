"""GuardedEnv: environment faults end one episode, never the stream.

Every ``reset`` / ``step`` / ``verify_at_end`` of the wrapped environment runs in
a worker thread with a time limit. An exception or a hang (no reply within
``step_timeout_s``) becomes an ``EnvFault`` raised from ``step``, which the
rollout records as a failed episode (``Episode.error``, counted as
``stream/env_errors``). The faulty instance is then abandoned (a hung thread
cannot be killed in Python; it is left to finish on its own as a daemon) and a
fresh instance is built before the next task.

A fresh instance is ``env.fresh()`` of the environment as it was handed over,
before any use (a deep copy by default; environment constructors are cheap and
build heavy state lazily, see ``envs/base.py``): a clean, unstarted environment.

The guard is also where the environment's replies are type-checked (``check_reply``):
a ``reset`` that returns no string or a ``step`` that returns no ``StepResult`` (a
gym-style tuple, None) fails that episode like an exception would, with a message
naming the class and the method, instead of crashing later inside the chat template.
A ``tasks`` or ``system_prompt`` of the wrong type fails the run at once.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from lit_ascent.envs.base import StepResult, TextEnv
from lit_ascent.trajectory import Task

log = logging.getLogger(__name__)


class EnvFault(RuntimeError):
    """The environment raised or did not answer in time; the episode fails."""


class EnvContractError(TypeError):
    """An environment method returned a value of the wrong type (a bug in the environment)."""


EXPECTED = {
    "tasks": "a list of Task",
    "reset": "a str (the first observation)",
    "step": "a StepResult with a str observation",
    "system_prompt": "a str",
}
"""What each checked method must return, as the error message says it."""

_HINTS = {
    ("reset", tuple): "; a gym-style (observation, info) pair? return only the observation text",
    ("reset", type(None)): "; a missing return statement?",
    ("step", tuple): "; a gym-style (observation, reward, done, info) tuple? "
                     "return StepResult(observation, done=..., verified=..., valid=...)",
    ("step", type(None)): "; a missing return statement?",
}


def reply_is_valid(method: str, value: Any) -> bool:
    """Whether ``value`` is what ``method`` of a TextEnv must return (``EXPECTED``)."""
    if method == "tasks":
        return isinstance(value, (list, tuple)) and all(isinstance(t, Task) for t in value)
    if method == "step":
        return isinstance(value, StepResult) and isinstance(value.observation, str)
    return isinstance(value, str)


def _a(value: Any) -> str:
    """'None', 'a tuple', 'an int': what a value is, for a message."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def check_reply(env: TextEnv, method: str, value: Any) -> Any:
    """``value`` when it has the type ``env.<method>()`` must return, else ``EnvContractError`` naming
    the class, the method, the type it got and the one expected."""
    if method not in EXPECTED or reply_is_valid(method, value):
        return value
    got = "a StepResult whose observation is " + _a(value.observation) if isinstance(value, StepResult) else _a(value)
    raise EnvContractError(f"{type(env).__name__}.{method}() returned {got}, expected {EXPECTED[method]}"
                           + _HINTS.get((method, type(value)), ""))


def call_with_timeout(fn: Callable[..., Any], *args: Any, timeout_s: float = 0.0) -> Any:
    """``fn(*args)`` in a daemon thread; ``TimeoutError`` after ``timeout_s`` (0: wait forever)."""
    if timeout_s <= 0:
        return fn(*args)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    worker = threading.Thread(target=target, daemon=True, name="guarded-env")
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise TimeoutError(f"no reply within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


class GuardedEnv(TextEnv):
    """Wraps any ``TextEnv``: per-call timeout, faults become failed episodes, rebuild after a fault."""

    def __init__(self, env: TextEnv, step_timeout_s: float = 300.0,
                 factory: Callable[[], TextEnv] | None = None):
        """
        Args:
            env: The environment to guard (not used yet).
            step_timeout_s: Seconds one reset/step may take before the episode fails (0: no limit).
            factory: Builds a fresh environment after a fault (default: ``env.fresh()`` of ``env`` as given).
        """
        if step_timeout_s < 0:
            raise ValueError(f"data.step_timeout_s must be >= 0, got {step_timeout_s}")
        self.inner, self.step_timeout_s = env, step_timeout_s
        self.name = env.name
        self.factory = factory or _pristine_copier(env)
        self.faults = 0
        """Faults seen so far (exceptions and timeouts)."""
        self.episode_error: str | None = None
        """The fault that ended the current episode, if any."""
        self._broken = False

    def __getattr__(self, item: str) -> Any:
        # only called for attributes GuardedEnv lacks: expose the wrapped env's (split, depths, ...)
        if item == "inner":
            raise AttributeError(item)
        return getattr(self.inner, item)

    def tasks(self) -> list[Task]:
        """The wrapped environment's tasks; the wrong type fails the run before its first task."""
        return list(check_reply(self.inner, "tasks", self.inner.tasks()))

    def system_prompt(self) -> str:
        return check_reply(self.inner, "system_prompt", self.inner.system_prompt())

    def reset(self, task: Task) -> str:
        """Start ``task`` on a healthy instance; a fault raises ``EnvFault`` (the rollout ends the episode
        before its first turn)."""
        if self._broken:
            self._rebuild()
        self.episode_error = None
        return self._call("reset", task)

    def step(self, action: str) -> StepResult:
        if self.episode_error is not None:  # reset failed: nothing to step
            raise EnvFault(self.episode_error)
        return self._call("step", action)

    def verify_at_end(self) -> bool:
        if self.episode_error is not None:
            return False
        try:
            return bool(self._call("verify_at_end"))
        except EnvFault:
            return False

    def close(self) -> None:
        _close_quietly(self.inner, self.step_timeout_s)

    def _call(self, method: str, *args: Any) -> Any:
        """``inner.<method>(*args)`` under the time limit, its reply type-checked; any failure is a fault."""
        try:
            value = call_with_timeout(getattr(self.inner, method), *args, timeout_s=self.step_timeout_s)
            return check_reply(self.inner, method, value)
        except Exception as err:
            self.faults += 1
            self._broken = True
            self.episode_error = f"{type(err).__name__}: {err}"
            log.warning("environment %s: %s (episode fails, environment will be rebuilt)",
                        self.name, self.episode_error)
            raise EnvFault(self.episode_error) from err

    def fresh(self) -> GuardedEnv:
        """A guarded, unstarted copy (the inner environment's ``fresh``)."""
        return GuardedEnv(self.inner.fresh(), self.step_timeout_s)

    def _rebuild(self) -> None:
        old = self.inner
        threading.Thread(target=_close_quietly, args=(old, self.step_timeout_s), daemon=True).start()
        self.inner = self.factory() or old
        self._broken = False


def _pristine_copier(env: TextEnv) -> Callable[[], TextEnv | None]:
    """A factory of fresh copies of ``env`` as it is now; None when it cannot be copied."""
    try:
        pristine = env.fresh()
    except Exception as err:  # e.g. holds a lock or a process handle
        log.warning("environment %s cannot be copied (%s): it will be reused after a fault", env.name, err)
        return lambda: None
    return pristine.fresh


def _close_quietly(env: TextEnv, timeout_s: float) -> None:
    try:
        call_with_timeout(env.close, timeout_s=timeout_s)
    except Exception as err:
        log.warning("environment %s did not close cleanly: %s", env.name, err)
