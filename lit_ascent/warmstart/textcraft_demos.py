"""TextCraft demonstrations: the solver's plan with short templated thoughts, and
recovery scripts built around the environment's real error replies.

Thoughts are deterministic functions of the goal and the plan, e.g.
"Thought: I need 2 oak logs for the oak planks; get them." Recovery scripts step a
scratch episode to read the real error, so the fixing thought quotes what the
environment said.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from lit_ascent.envs.textcraft import TextCraftEnv, item_name
from lit_ascent.envs.textcraft_solver import solve
from lit_ascent.trajectory import Task
from lit_ascent.warmstart.demos import Script, react

ERROR_KINDS = ("craft_early", "get_craftable", "wrong_count", "short_get")
"""Recovery mistakes: craft before getting the ingredients; get an item that must be
crafted; a craft whose counts match no command; get too few of a base item."""
_CRAFT_RE = re.compile(r"^craft (\d+) (.+?) using (.+)$")
_GET_RE = re.compile(r"^get (\d+) (.+)$")
_ITEM_IN_ERROR = re.compile(r"minecraft:(\S+)")


@dataclass(frozen=True)
class Step:
    """One planned action, parsed: ``get`` (count, item) or ``craft`` (count, item, inputs)."""

    action: str
    verb: str
    count: int
    item: str
    inputs: tuple[tuple[int, str], ...] = ()


def parse_step(action: str) -> Step:
    m = _CRAFT_RE.match(action)
    if m:
        inputs = tuple((int(n), name) for n, name in (p.strip().split(" ", 1) for p in m[3].split(",")))
        return Step(action, "craft", int(m[1]), m[2], inputs)
    m = _GET_RE.match(action)
    if m:
        return Step(action, "get", int(m[1]), m[2])
    raise ValueError(f"textcraft demos: cannot parse planned action {action!r}")


def _user(steps: list[Step], item: str, after: int, goal: str) -> str:
    """The output of the first craft after ``after`` that consumes ``item`` (else the goal)."""
    for s in steps[after + 1:]:
        if s.verb == "craft" and any(name == item for _, name in s.inputs):
            return s.item
    return goal


def _ingredients(step: Step) -> str:
    return " and ".join(f"{n} {name}" for n, name in step.inputs)


def plan_summary(goal: str, steps: list[Step]) -> str:
    """The first turn's plan, copied from the observation: the goal's crafting command,
    the commands that make its ingredients, and the base items to get."""
    commands = list(dict.fromkeys(s.action for s in steps if s.verb == "craft"))
    gets = ", ".join(f"{s.count} {s.item}" for s in steps if s.verb == "get")
    parts = [f'The {goal} is made by "{commands[-1]}".'] if commands else []
    if len(commands) > 1:
        parts.append("Its ingredients: " + "; ".join(f'"{c}"' for c in commands[:-1]) + ".")
    if gets:
        parts.append(f"Base items to get: {gets}.")
    return " ".join(parts)


def plan_thoughts(goal: str, steps: list[Step]) -> list[str]:
    """One short thought per planned step (no "Thought:" prefix); the first one states the
    plan, each craft quotes the command it runs, so every action copies text already in context."""
    totals = Counter(s.action for s in steps)
    seen: Counter = Counter()
    thoughts = []
    for t, s in enumerate(steps):
        seen[s.action] += 1
        use = _user(steps, s.item, t, goal)
        if s.verb == "get":
            thought = f"Get {s.count} {s.item} for the {use}."
        elif s.item == goal:
            thought = f'I have {_ingredients(s)}; run the goal command "{s.action}".'
        else:
            batch = f", batch {seen[s.action]} of {totals[s.action]}" if totals[s.action] > 1 else ""
            thought = f'Run "{s.action}" for the {use}{batch}.'
        thoughts.append(f"{plan_summary(goal, steps)} {thought}" if t == 0 else thought)
    return thoughts


def plain_texts(goal: str, actions: list[str]) -> list[str]:
    steps = [parse_step(a) for a in actions]
    return [react(th, a) for th, a in zip(plan_thoughts(goal, steps), actions)]


def _first_get_fix(steps: list[Step]) -> str:
    first = steps[0]
    return f"get {first.count} {first.item}"


def _dry_run(env: TextCraftEnv, task: Task, actions: list[str]) -> list[tuple[str, bool]]:
    """(observation, valid) of each action in a scratch episode of ``task``."""
    env.reset(task)
    out = []
    for a in actions:
        r = env.step(a)
        out.append((r.observation, r.valid))
        if r.done:
            break
    return out


class TextCraftScripts:
    """Script builders (``Script`` per task) for the three demo kinds."""

    def __init__(self, env: TextCraftEnv):
        self.env = env

    def plan(self, task: Task) -> tuple[str, list[str]]:
        """(goal display name, solver actions) of ``task``."""
        actions = solve(self.env, task)
        return item_name(task.task_id), actions

    def plain(self, task: Task, k: int = 0) -> Script:
        goal, actions = self.plan(task)
        return Script(plain_texts(goal, actions))

    def recovery(self, task: Task, k: int) -> Script | None:
        """Recovery demo number ``k``: error kinds rotate, falling back to the next applicable one."""
        goal, actions = self.plan(task)
        steps = [parse_step(a) for a in actions]
        texts = plain_texts(goal, actions)
        for j in range(len(ERROR_KINDS)):
            kind = ERROR_KINDS[(k + j) % len(ERROR_KINDS)]
            script = getattr(self, f"_{kind}")(task, goal, steps, texts)
            if script is not None:
                script.error_kind = kind
                return script
        return None

    # -- the mistakes ----------------------------------------------------------
    def _craft_early(self, task, goal, steps, texts) -> Script | None:
        """Turn 0 tries the first craft before getting anything."""
        c = next((i for i, s in enumerate(steps) if s.verb == "craft"), None)
        if c is None or c == 0:
            return None
        (error, valid), = _dry_run(self.env, task, [steps[c].action])
        if valid:
            return None
        crafted = _error_item(error, steps[c].item)
        fix = f"Not enough items for the {crafted}: I must get the base items first; {_first_get_fix(steps)}."
        wrong = react(f"{plan_summary(goal, steps)} {_thought(texts[c])}", steps[c].action)
        return Script([wrong, react(fix, steps[0].action), *texts[1:]], (0,), (0,))

    def _get_craftable(self, task, goal, steps, texts) -> Script | None:
        """Turn 0 tries to get an intermediate item, which only a craft makes."""
        c = next((i for i, s in enumerate(steps) if s.verb == "craft" and s.item != goal), None)
        if c is None or steps[0].verb != "get":
            return None
        s = steps[c]
        wrong = react(f"{plan_summary(goal, steps)} Get {s.count} {s.item} for the {_user(steps, s.item, c, goal)}.",
                      f"get {s.count} {s.item}")
        (error, valid), = _dry_run(self.env, task, [f"get {s.count} {s.item}"])
        if valid:
            return None
        missing = error.removeprefix("Could not find ").strip() or s.item
        fix = f"There is no {missing} to get: it is crafted from {_ingredients(s)}; {_first_get_fix(steps)}."
        return Script([wrong, react(fix, steps[0].action), *texts[1:]], (0,), (0,))

    def _wrong_count(self, task, goal, steps, texts) -> Script | None:
        """The first craft with counts that match no command; the first candidate the env rejects is used."""
        c = next((i for i, s in enumerate(steps) if s.verb == "craft"), None)
        if c is None:
            return None
        s, prefix = steps[c], [st.action for st in steps[:c]]
        for wrong_action in _miscounted(s, flip=sum(map(ord, task.task_id)) % 2 == 1):
            seen = _dry_run(self.env, task, prefix + [wrong_action])
            error, valid = seen[-1]
            if not valid and len(seen) == c + 1:
                break
        else:
            return None
        fix = f"{_reason(error)}; use the command exactly as written: {s.count} {s.item} from {_ingredients(s)}."
        wrong = react(_thought(texts[c]), wrong_action)
        return Script([*texts[:c], wrong, react(fix, s.action), *texts[c + 1:]], (c,), (c,))

    def _short_get(self, task, goal, steps, texts) -> Script | None:
        """Get one too few of a base item; the craft that runs out fails; get the missing one, craft again."""
        g = next((i for i, s in enumerate(steps) if s.verb == "get" and s.count >= 2), None)
        if g is None:
            return None
        s = steps[g]
        short = f"get {s.count - 1} {s.item}"
        actions = [st.action for st in steps]
        seen = _dry_run(self.env, task, actions[:g] + [short] + actions[g + 1:])
        f = next((i for i, (_, valid) in enumerate(seen) if not valid), None)
        if f is None or steps[f].verb != "craft":
            return None
        error = seen[f][0]
        wrong = react(_thought(texts[g]), short)
        fix = f"Not enough items for the {_error_item(error, steps[f].item)}: too few {s.item}; get 1 more."
        retry = f"Now I have the {s.item}; craft the {steps[f].item} again."
        out = [*texts[:g], wrong, *texts[g + 1:f + 1], react(fix, f"get 1 {s.item}"),
               react(retry, steps[f].action), *texts[f + 1:]]
        return Script(out, (g, f), (f,))


def _thought(text: str) -> str:
    """The thought of a ReAct turn, without its prefix."""
    return text.split("\n", 1)[0].removeprefix("Thought: ")


def _miscounted(step: Step, flip: bool) -> list[str]:
    """Crafts of ``step.item`` with wrong counts: one ingredient amount off, or a doubled batch."""
    def craft(count: int, inputs) -> str:
        return f"craft {count} {step.item} using {', '.join(f'{n} {i}' for n, i in inputs)}"

    (n0, i0), *rest = step.inputs
    amounts = [craft(step.count, [(n0 + 1, i0), *rest]), craft(2 * step.count, [(2 * n, i) for n, i in step.inputs])]
    if n0 > 1:
        amounts.append(craft(step.count, [(n0 - 1, i0), *rest]))
    return amounts[::-1] if flip else amounts


def _reason(error: str) -> str:
    """A short paraphrase of a TextCraft rejection."""
    if error.startswith("Could not find a valid recipe"):
        return "No valid recipe for that"
    if error.startswith("Could not find enough items"):
        return "Not enough items for that"
    return "That failed"


def _error_item(error: str, default: str) -> str:
    m = _ITEM_IN_ERROR.search(error)
    return item_name(m[0]) if m else default
