"""In-context memory of earlier tasks (the in-context baselines of the ASCENT paper).

A ``Memory`` fills a slot in the student's system message, where the PI-conditioned probe puts its
context; the teacher never sees it (``Episode.memory`` is apart from ``Episode.system``, and the
teacher's prompt is ``system + PI block``), so the teacher/student alignment rule is unchanged: the
student's prompt is longer, the token ids after it are identical. Chosen in the config as
``model.memory`` (a class path, like the objective):

- ``NoMemory``: nothing (every weight-update method as before);
- ``ProceduralMemory`` (MemP-style): each verified episode is stored; a new task is shown the ``k``
  stored episodes most similar to it (BM25, ``lit_ascent.bm25``, over the goal line or the whole
  task text), each rendered like the teacher's PI block; ``min_overlap`` > 0 shows only those that
  cover that share of the task's term weight (``BM25Index.coverage``), so a task like no earlier
  one is shown nothing rather than the nearest unrelated trajectory;
- ``Playbook`` (ACE-style): after each episode a writer adds short lessons to a bounded playbook
  shown to every later task, newest first. ``writer: rules`` (deterministic: the environment's
  rejections quoted with the rejected action, the actions of a verified episode) works at 135M;
  ``writer: model`` asks the model itself to reflect (the paper's setting).

Bounded: the block is at most ``max_tokens`` tokens and never more than the context leaves for one
full turn (``room``); entries that do not fit are left out and counted (``cut``). The memory's
state is plain lists, saved in the stream checkpoint (exact resume).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from lit_ascent.privileged import PI_CONTENTS, render_steps
from lit_ascent.trajectory import Episode, Task

log = logging.getLogger(__name__)

MATCHES = ("goal", "task")
WRITERS = ("rules", "model")
REFLECT_SYSTEM = "You review an attempt at a task and write one lesson for future tasks."
REFLECT_PROMPT = "Write one short lesson (one sentence) that would help on similar tasks."


@dataclass(frozen=True)
class MemoryView:
    """What one episode was shown: the block (None: nothing), its tokens, entries shown and cut."""

    text: str | None = None
    tokens: int = 0
    shown: int = 0
    cut: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "tokens": self.tokens, "shown": self.shown, "cut": self.cut}


def memory_diagnostics(episode: Episode, size: int) -> dict[str, float]:
    """Per task: tokens of the block the episode was shown, entries shown and cut, and the memory's
    size after the episode (the record and TensorBoard's ``memory/*``)."""
    view = episode.memory or {}
    return {"memory/tokens": float(view.get("tokens", 0)), "memory/shown": float(view.get("shown", 0)),
            "memory/cut": float(view.get("cut", 0)), "memory/size": float(size)}


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False).input_ids)


def fit(tokenizer, header: str, entries: list[str], cap: int) -> MemoryView:
    """The header and as many leading ``entries`` as fit in ``cap`` tokens (later ones that fit
    after a skipped one are shown too); the rest counted as cut."""
    kept: list[str] = []
    for entry in entries:
        if count_tokens(tokenizer, "\n".join([header, *kept, entry])) <= cap:
            kept.append(entry)
    if not kept:
        return MemoryView(cut=len(entries))
    text = "\n".join([header, *kept])
    return MemoryView(text, count_tokens(tokenizer, text), len(kept), len(entries) - len(kept))


class Memory:
    """No memory: the base of the in-context memories (``render`` shows ``candidates`` under
    ``header``; ``observe`` is called after every task's update)."""

    header = ""
    active = True
    """False only for ``NoMemory``: the loop then adds nothing to prompts, records or checkpoints."""

    def __init__(self, max_tokens: int = 1024):
        """
        Args:
            max_tokens: Most tokens of the memory block in the system message.
        """
        if max_tokens < 1:
            raise ValueError(f"memory.max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens

    def candidates(self, env, task: Task, first_observation: str) -> list[str]:
        """The entries to show, most wanted first."""
        return []

    def render(self, tokenizer, env, task: Task, first_observation: str, room: int) -> MemoryView:
        """The block for this task, at most ``min(max_tokens, room)`` tokens."""
        entries = self.candidates(env, task, first_observation)
        return fit(tokenizer, self.header, entries, min(self.max_tokens, room)) if entries else MemoryView()

    def observe(self, episode: Episode, env, policy) -> None:
        """Learn from a finished episode (after the weight update, if any)."""

    def __len__(self) -> int:
        return 0

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class NoMemory(Memory):
    """Nothing in the system message (the default)."""

    active = False

    def __init__(self):
        # No settings: jsonargparse carries a default's init_args over to the class a config switches to,
        # so a max_tokens here would silently replace the chosen memory's own default.
        super().__init__()


class ProceduralMemory(Memory):
    """Verified trajectories of earlier tasks, the ``k`` most similar shown (BM25)."""

    header = "Memory: verified successful attempts at similar earlier tasks."

    def __init__(self, k: int = 2, max_tokens: int = 1024, match: str = "goal",
                 pi_content: str = "reasoning_actions", max_entries: int = 256, min_overlap: float = 0.0):
        """
        Args:
            k: Stored episodes shown per task (the most similar first).
            max_tokens: Most tokens of the memory block.
            match: ``goal``: similarity of the goal lines (``TextEnv.goal_line``); ``task``: of the whole task text.
            pi_content: How a stored episode is rendered (as the teacher's PI: actions | reasoning_actions | full).
            max_entries: Most stored episodes (the oldest dropped first).
            min_overlap: Relevance floor: a stored episode is shown only if its key covers at least this
                share of the task's idf-weighted terms (``BM25Index.coverage``, 0 to 1). 0: any stored
                episode that shares a term (in TextCraft every goal line shares "craft", so every one).
        """
        super().__init__(max_tokens)
        if k < 1 or max_entries < 1:
            raise ValueError(f"memory: k and max_entries must be >= 1, got {k}, {max_entries}")
        if match not in MATCHES:
            raise ValueError(f"memory.match must be one of {MATCHES}, got {match!r}")
        if pi_content not in PI_CONTENTS:
            raise ValueError(f"memory.pi_content must be one of {PI_CONTENTS}, got {pi_content!r}")
        if not 0.0 <= min_overlap <= 1.0:
            raise ValueError(f"memory.min_overlap must be in [0, 1], got {min_overlap}")
        self.k, self.match, self.pi_content, self.max_entries = k, match, pi_content, max_entries
        self.min_overlap = min_overlap
        self.entries: list[dict[str, str]] = []
        self._index = None

    def key(self, env, first_observation: str) -> str:
        return env.goal_line(first_observation) if self.match == "goal" else first_observation

    def candidates(self, env, task: Task, first_observation: str) -> list[str]:
        if not self.entries:
            return []
        if self._index is None:
            from lit_ascent.bm25 import BM25Index

            self._index = BM25Index([str(i) for i in range(len(self.entries))], [e["key"] for e in self.entries])
        query = self.key(env, first_observation)
        hits = self._index.search(query, len(self.entries))
        if self.min_overlap > 0:
            coverage = self._index.coverage(query)
            hits = [i for i in hits if coverage[int(i)] >= self.min_overlap]
        return [self.entries[int(i)]["text"] for i in hits[:self.k]]

    def observe(self, episode: Episode, env, policy) -> None:
        if not episode.verified or episode.error is not None:
            return
        steps = render_steps(episode.turns, self.pi_content, valid_only=True)
        text = f"Task: {env.goal_line(episode.first_observation)}\n{steps}"
        self.entries = [*self.entries, {"key": self.key(env, episode.first_observation), "text": text}]
        self.entries = self.entries[-self.max_entries:]
        self._index = None

    def __len__(self) -> int:
        return len(self.entries)

    def state_dict(self) -> dict[str, Any]:
        return {"entries": [dict(e) for e in self.entries]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries, self._index = [dict(e) for e in state.get("entries", [])], None


class Playbook(Memory):
    """Short lessons written after each episode, the newest shown first."""

    header = "Playbook: lessons from earlier tasks (newest first)."

    def __init__(self, writer: str = "rules", max_tokens: int = 512, max_lessons: int = 32,
                 lesson_max_tokens: int = 48):
        """
        Args:
            writer: ``rules`` (deterministic, from the env's replies and the verified actions) or
                ``model`` (the model reflects on the episode, greedy).
            max_tokens: Most tokens of the playbook block.
            max_lessons: Most lessons kept (the oldest dropped first; a repeated lesson moves to the front).
            lesson_max_tokens: Most tokens of one lesson (a longer one is cut there).
        """
        super().__init__(max_tokens)
        if writer not in WRITERS:
            raise ValueError(f"memory.writer must be one of {WRITERS}, got {writer!r}")
        if max_lessons < 1 or lesson_max_tokens < 1:
            raise ValueError(f"memory: max_lessons and lesson_max_tokens must be >= 1, got {max_lessons}, "
                             f"{lesson_max_tokens}")
        self.writer, self.max_lessons, self.lesson_max_tokens = writer, max_lessons, lesson_max_tokens
        self.lessons: list[str] = []

    def candidates(self, env, task: Task, first_observation: str) -> list[str]:
        return [f"- {lesson}" for lesson in reversed(self.lessons)]

    def observe(self, episode: Episode, env, policy) -> None:
        if episode.error is not None or not episode.turns:
            return
        if self.writer == "rules":
            written = rule_lessons(episode, env.goal_line(episode.first_observation))
        else:
            written = [reflect(policy, episode, self.lesson_max_tokens)]
        for lesson in written:
            lesson = cap_tokens(policy.tokenizer, " ".join(lesson.split()), self.lesson_max_tokens)
            if lesson:
                log.info("playbook lesson (task %s): %s", episode.task.task_id, lesson)
                self.lessons = [x for x in self.lessons if x != lesson] + [lesson]
        self.lessons = self.lessons[-self.max_lessons:]

    def __len__(self) -> int:
        return len(self.lessons)

    def state_dict(self) -> dict[str, Any]:
        return {"lessons": list(self.lessons)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lessons = list(state.get("lessons", []))


def cap_tokens(tokenizer, text: str, max_tokens: int) -> str:
    ids = tokenizer(text, add_special_tokens=False).input_ids
    return text if len(ids) <= max_tokens else tokenizer.decode(ids[:max_tokens]).strip()


REJECTIONS_PER_EPISODE = 2
SOLVED_ACTIONS_SHOWN = 6
REJECTED, SOLVED_BY, MORE = "was rejected:", "was solved by:", " ..."  # the rule writer's wording (read back by the report)


def rule_lessons(episode: Episode, goal: str) -> list[str]:
    """The deterministic writer: each distinct rejected action with the env's reply (at most
    ``REJECTIONS_PER_EPISODE``), and for a verified episode its first valid actions."""
    lessons, seen = [], set()
    for turn in episode.turns:
        if not turn.valid and turn.action and turn.action not in seen and len(seen) < REJECTIONS_PER_EPISODE:
            seen.add(turn.action)
            reply = turn.observation.strip().splitlines()[0] if turn.observation.strip() else "rejected"
            lessons.append(f"'{turn.action}' {REJECTED} {reply}")
    if episode.verified:
        actions = [t.action for t in episode.turns if t.valid and t.action]
        more = MORE if len(actions) > SOLVED_ACTIONS_SHOWN else ""
        lessons.append(f"{goal} {SOLVED_BY} {'; '.join(actions[:SOLVED_ACTIONS_SHOWN])}{more}")
    return lessons


def reflect(policy, episode: Episode, max_tokens: int) -> str:
    """The model's own lesson about ``episode`` (greedy, the weights as they are, no gradient)."""
    import torch

    from lit_ascent.engines.hf import greedy_reply

    outcome = "It succeeded." if episode.verified else "It failed."
    request = (f"Task:\n{episode.first_observation}\n\nAttempt:\n{render_steps(episode.turns, 'actions')}\n"
               f"{outcome}\n\n{REFLECT_PROMPT}")
    was_training = policy.model.training
    policy.model.eval()
    try:
        with torch.no_grad():
            return greedy_reply(policy.model, policy.tokenizer, REFLECT_SYSTEM, request, max_tokens)
    finally:
        policy.model.train(was_training)
