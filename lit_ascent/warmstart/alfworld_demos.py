"""ALFWorld demonstrations from the cached planner JSONL (``python -m lit_ascent.warmstart.planner_cache``).

Only ``valid_train`` games are used. Thoughts are templated from the task line and
the planner's actions. Recovery kinds (alternating): ``early_action``, an action
that needs the agent at a receptacle (take / put / open / clean / heat / cool ... Y)
tried one step early, before "go to Y"; ``wrong_object``, a take with a wrong
object number. The engine replies "Nothing happens."; the next thought uses that
reply and the correct action follows. A third kind, ``wrong_place``, teaches search:
the planner always walks straight to the object, so a detour to another receptacle
(a valid move whose reply does not show the object) is inserted before the right
"go to"; the next thought reads the reply ("No apple at the ...") and moves on.
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from lit_ascent.trajectory import Task
from lit_ascent.warmstart.demos import Script, react

DEMO_SPLIT = "valid_train"
_GOAL_RE = re.compile(r"Your task is to: (.+?)\.?\s*$", re.MULTILINE)
_TAKE_RE = re.compile(r"^take (.+?) from (.+)$")
_PUT_RE = re.compile(r"^put (.+?) in/on (.+)$")
_APPLY_RE = re.compile(r"^(clean|heat|cool) (.+?) with (.+)$")
_OPEN_RE = re.compile(r"^(open|close) (.+)$")
_USE_RE = re.compile(r"^use (.+)$")
_NUMBERED = re.compile(r"^(.+) (\d+)$")
_ROOM_RE = re.compile(r"you see (.+?)\.\s*$", re.MULTILINE)


def require_alfworld() -> None:
    """Fail with a clear message when the ALFWorld stack is not importable."""
    missing = [m for m in ("alfworld", "textworld") if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(
            f"--env alfworld needs the packages {missing}, which are not importable in this Python "
            "(install alfworld and textworld, see environment.yml), or use --env textcraft")


def load_records(path: str | Path) -> list[dict]:
    """Won planner demonstrations of the training split from a ``lit_ascent.warmstart.planner_cache`` JSONL."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"--demos-jsonl {str(path)!r} does not exist; write it with "
            f"`python -m lit_ascent.warmstart.planner_cache --split {DEMO_SPLIT} --out {path}`")
    records = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if f"/{DEMO_SPLIT}/" not in record["game"]:
            raise ValueError(f"--demos-jsonl: game {record['game']!r} is not in {DEMO_SPLIT}; "
                             "evaluation games must never reach the warm start")
        if record.get("won") and record.get("actions"):
            records.append(record)
    return records


def record_task(record: dict, index: int) -> Task:
    return Task("alfworld", record["game"], index=index, meta=(("family", record.get("family")),))


def task_goal(first_observation: str) -> str:
    m = _GOAL_RE.search(first_observation)
    return m[1] if m else "solve the task"


def _place_of(action: str) -> str | None:
    """The receptacle an action must be next to (None for actions that need no place)."""
    for regex, group in ((_TAKE_RE, 2), (_PUT_RE, 2), (_APPLY_RE, 3), (_OPEN_RE, 2)):
        m = regex.match(action)
        if m:
            return m[group]
    return None


def _go_thought(place: str, nxt: str) -> str:
    if m := _TAKE_RE.match(nxt):
        return f"The {m[1]} may be at the {place}; go there."
    if m := _PUT_RE.match(nxt):
        return f"Bring the {m[1]} to the {place}."
    if m := _APPLY_RE.match(nxt):
        return f"Go to the {place} to {m[1]} the {m[2]}."
    if m := _USE_RE.match(nxt):
        return f"The {m[1]} may be at the {place}; go there."
    return f"Check the {place}."


def action_thought(action: str, nxt: str, last: bool) -> str:
    """A short thought for one planner action (``nxt``: the following action or '')."""
    if action.startswith("go to "):
        return _go_thought(action[len("go to "):], nxt)
    if m := _TAKE_RE.match(action):
        return f"I see the {m[1]} here; take it."
    if m := _PUT_RE.match(action):
        return f"Put the {m[1]} in/on the {m[2]}" + (" to finish the task." if last else ".")
    if m := _APPLY_RE.match(action):
        return f"{m[1].capitalize()} the {m[2]} with the {m[3]}."
    if m := _OPEN_RE.match(action):
        return f"The {m[2]} is closed; open it." if m[1] == "open" else f"Close the {m[2]}."
    if m := _USE_RE.match(action):
        return f"Turn on the {m[1]}" + (" to finish the task." if last else ".")
    return f"Next: {action}."


def plain_texts(goal: str, actions: list[str]) -> list[str]:
    texts = []
    for t, a in enumerate(actions):
        nxt = actions[t + 1] if t + 1 < len(actions) else ""
        thought = action_thought(a, nxt, t == len(actions) - 1)
        if t == 0:
            thought = f"My task is to {goal}. {thought}"
        texts.append(react(thought, a))
    return texts


def receptacles(first_observation: str) -> list[str]:
    """The receptacles the first observation lists ("you see a bed 1, a desk 1, and a safe 1.")."""
    m = _ROOM_RE.search(first_observation)
    if not m:
        return []
    items = [part.strip() for part in m[1].replace(", and ", ", ").split(", ")]
    return [item[2:] if item.startswith("a ") else item[3:] if item.startswith("an ") else item for item in items]


def search_points(actions: list[str]) -> list[int]:
    """Turns k with actions[k] = "go to Y" followed by taking an object from Y (after "open Y" if closed)."""
    points = []
    for k, action in enumerate(actions[:-1]):
        place = action[len("go to "):] if action.startswith("go to ") else None
        nxt = actions[k + 2] if actions[k + 1] == f"open {place}" and k + 2 < len(actions) else actions[k + 1]
        if place and (m := _TAKE_RE.match(nxt)) and m[2] == place:
            points.append(k)
    return points


def early_action_points(actions: list[str]) -> list[int]:
    """Turns k with actions[k] = "go to Y" and actions[k+1] an action at Y (tried early: one mistake)."""
    return [k for k in range(len(actions) - 1)
            if actions[k].startswith("go to ") and _place_of(actions[k + 1]) == actions[k][len("go to "):]]


class ALFWorldScripts:
    """Script builders for the three kinds from the planner's actions (``actions[task_id]``)."""

    def __init__(self, env, actions: dict[str, list[str]], first_observations: dict[str, str]):
        self.env, self.actions, self.first = env, actions, first_observations

    def _goal(self, task: Task) -> str:
        return task_goal(self.first.get(task.task_id, ""))

    def plain(self, task: Task, k: int = 0) -> Script:
        return Script(plain_texts(self._goal(task), self.actions[task.task_id]))

    def recovery(self, task: Task, k: int) -> Script | None:
        """Recovery demo number ``k``: the kinds take turns; an inapplicable kind falls back to the next."""
        kinds = (self._early_action, self._wrong_object, self._wrong_place)
        for j in range(len(kinds)):
            script = kinds[(k + j) % len(kinds)](task, k)
            if script is not None:
                return script
        return None

    def _start(self, task: Task, prefix: list[str]) -> None:
        """A scratch episode of ``task`` after the actions ``prefix``."""
        self.env.reset(task)
        for a in prefix:
            self.env.step(a)

    def _reply(self, task: Task, prefix: list[str], action: str):
        """The engine's reply to ``action`` after ``prefix`` in a scratch episode."""
        self._start(task, prefix)
        return self.env.step(action)

    def _place_without(self, task: Task, prefix: list[str], places: list[str], obj: str) -> str | None:
        """The first of ``places`` whose "go to" reply is valid, open and does not show ``obj``.
        One scratch episode (an ALFWorld reset costs seconds): "go to" only moves the agent, so
        the reply at each place is the one the demo gets right after ``prefix``."""
        self._start(task, prefix)
        for place in places:
            reply = self.env.step(f"go to {place}")
            seen = reply.observation.lower()
            if reply.valid and not reply.done and obj not in seen and "closed" not in seen:
                return place
        return None

    def _early_action(self, task: Task, k: int) -> Script | None:
        """Try the action at Y before "go to Y"; the fix goes there first."""
        actions = self.actions[task.task_id]
        points = early_action_points(actions)
        if not points:
            return None
        j = points[k % len(points)]
        reply = self._reply(task, actions[:j], actions[j + 1])
        if reply.valid or reply.done:
            return None
        place = actions[j][len("go to "):]
        fix = f"{reply.observation.strip().rstrip('.')}: I am not at the {place} yet; go there first."
        return self._with_mistake(task, j, actions[j + 1], fix, actions[j:], "early_action")

    def _wrong_object(self, task: Task, k: int) -> Script | None:
        """Take an object by a wrong number ("apple 2" for "apple 1"); the fix takes the one seen."""
        actions = self.actions[task.task_id]
        points = [j for j, a in enumerate(actions) if _TAKE_RE.match(a) and _NUMBERED.match(_TAKE_RE.match(a)[1])]
        if not points:
            return None
        j = points[k % len(points)]
        m = _TAKE_RE.match(actions[j])
        name, number = _NUMBERED.match(m[1]).groups()
        wrong = f"take {name} {int(number) + 1} from {m[2]}"
        reply = self._reply(task, actions[:j], wrong)
        if reply.valid or reply.done:
            return None
        fix = f"{reply.observation.strip().rstrip('.')}: there is no {name} {int(number) + 1} here; take {m[1]}."
        return self._with_mistake(task, j, wrong, fix, actions[j:], "wrong_object")

    def _wrong_place(self, task: Task, k: int) -> Script | None:
        """Go to a receptacle that does not show the object first; the fix reads the reply and moves on."""
        actions = self.actions[task.task_id]
        points = search_points(actions)
        visited = {a[len("go to "):] for a in actions if a.startswith("go to ")}
        places = [p for p in receptacles(self.first.get(task.task_id, "")) if p not in visited]
        if not points or not places:
            return None
        j = points[k % len(points)]
        obj = _NUMBERED.sub(r"\1", next(m[1] for a in actions[j + 1:] if (m := _TAKE_RE.match(a))))
        place = self._place_without(task, actions[:j], places[k % len(places):] + places[:k % len(places)], obj)
        if place is None:
            return None
        target = actions[j][len("go to "):]
        lead = f"My task is to {self._goal(task)}. " if j == 0 else ""
        texts = plain_texts(self._goal(task), actions)
        detour = react(f"{lead}The {obj} may be at the {place}; go there.", f"go to {place}")
        fix = react(f"No {obj} at the {place}. The {obj} may be at the {target}; go there.", actions[j])
        return Script([*texts[:j], detour, fix, *texts[j + 1:]], (j,), (), "wrong_place")

    def _with_mistake(self, task: Task, j: int, wrong: str, fix: str, rest: list[str], kind: str) -> Script:
        """Plain turns before ``j``, the wrong action, the fixing turn (``rest[0]``), then the plain rest."""
        actions = self.actions[task.task_id]
        texts = plain_texts(self._goal(task), actions)
        lead = f"My task is to {self._goal(task)}. " if j == 0 else ""
        out = [*texts[:j], react(f"{lead}Next: {wrong}.", wrong), react(fix, rest[0]), *texts[j + 1:]]
        return Script(out, (j,), (j,), kind)
