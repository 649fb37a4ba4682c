"""A recipe planner for TextCraft: the crafting commands of a task -> actions that solve it.

Used to check that every task is solvable from what the agent sees, and to
produce demonstrations. The plan takes every base item first (one ``get`` per
item, in the total amount), then crafts in dependency order. A craft makes one
batch of its command's output, so an item is crafted ceil(needed / batch) times
and leftovers are reused by later needs.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from lit_ascent.envs.textcraft import TextCraftEnv
from lit_ascent.trajectory import Task

_COMMAND_RE = re.compile(r"^craft (\d+) (.+?) using (.+)$")
_INGREDIENT_RE = re.compile(r"^(\d+) (.+)$")
_GOAL_RE = re.compile(r"^Goal: craft (.+)\.$", re.MULTILINE)


@dataclass(frozen=True)
class Command:
    """One crafting command: ``count`` of ``output`` from (amount, ingredient) pairs."""

    output: str
    count: int
    inputs: tuple[tuple[int, str], ...]


def parse_commands(observation: str) -> tuple[list[Command], str]:
    """The crafting commands and the goal (display names) of a first observation."""
    commands = []
    for line in observation.splitlines():
        m = _COMMAND_RE.match(line.strip())
        if m:
            inputs = tuple(
                (int(g[1]), g[2]) for g in (_INGREDIENT_RE.match(p.strip()) for p in m[3].split(",")) if g
            )
            commands.append(Command(m[2], int(m[1]), inputs))
    goal = _GOAL_RE.search(observation)
    if goal is None:
        raise ValueError("parse_commands: the observation has no 'Goal: craft ...' line")
    return commands, goal[1]


class _Planner:
    """Depth-first planner with batch sizes and a simulated inventory of leftovers."""

    def __init__(self, commands: list[Command], tag_of: Callable[[str], str | None]):
        self.by_output: dict[str, list[Command]] = {}
        for c in sorted(set(commands), key=lambda c: (c.output, c.count, c.inputs)):
            self.by_output.setdefault(c.output, []).append(c)
        self.members: dict[str, list[str]] = {}  # kind (tag) -> crafted items of that kind
        for out in self.by_output:
            tag = tag_of(out)
            if tag and tag != out:
                self.members.setdefault(tag, []).append(out)
        self._cost: dict[str, float] = {}
        self.gets: Counter[str] = Counter()
        self.crafts: list[str] = []
        self.leftover: Counter[str] = Counter()

    def concrete(self, name: str) -> str:
        """The item to use for an ingredient: itself, or the cheapest item of its kind."""
        if name in self.by_output or name not in self.members:
            return name
        return min(self.members[name], key=lambda m: (self.cost(m), m))

    def cost(self, name: str, stack: frozenset[str] = frozenset()) -> float:
        """Actions to make one batch of ``name`` (1 for a base item; inf on a cycle)."""
        if name in stack:
            return math.inf
        if name not in self.by_output:
            if name in self.members:
                return min(self.cost(m, stack) for m in self.members[name])
            return 1.0
        if name in self._cost:
            return self._cost[name]
        inner = stack | {name}
        value = min(1 + sum(self.cost(i, inner) for _, i in c.inputs) for c in self.by_output[name])
        if value < math.inf:  # an inf may only hold on this stack's path; do not memoise it
            self._cost[name] = value
        return value

    def best(self, name: str) -> Command:
        return min(self.by_output[name], key=lambda c: 1 + sum(self.cost(i, frozenset({name})) for _, i in c.inputs))

    def need(self, name: str, amount: int) -> None:
        """Plan to hold ``amount`` more of ``name`` (used up by the caller)."""
        if name not in self.by_output:
            self.gets[name] += amount
            return
        used = min(self.leftover[name], amount)
        self.leftover[name] -= used
        amount -= used
        if amount == 0:
            return
        command = self.best(name)
        batches = -(-amount // command.count)
        inputs = [(n, self.concrete(i)) for n, i in command.inputs]
        for n, item in inputs:
            self.need(item, n * batches)
        ingredients = ", ".join(f"{n} {item}" for n, item in inputs)
        self.crafts += [f"craft {command.count} {name} using {ingredients}"] * batches
        self.leftover[name] += batches * command.count - amount


def plan(observation: str, tag_of: Callable[[str], str | None]) -> list[str]:
    """Actions that craft the goal of ``observation`` (``tag_of``: item -> its kind)."""
    commands, goal = parse_commands(observation)
    planner = _Planner(commands, tag_of)
    planner.need(goal, 1)
    return [f"get {n} {item}" for item, n in planner.gets.items()] + planner.crafts


def solve(env: TextCraftEnv, task: Task) -> list[str]:
    """Reset ``env`` to ``task`` and plan from its first observation."""
    return plan(env.reset(task), env.tag_of)
