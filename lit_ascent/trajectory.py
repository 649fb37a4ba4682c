"""Episode and turn records: one append-only token sequence per episode.

The episode is exactly the token sequence the model saw: the prompt, then per
turn the generated assistant tokens and the tokenised observation. Every token
carries a role and a turn index, so losses select positions by mask and the
teacher's input can reuse the identical ids after its own (privileged) prompt.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

ROLE_PROMPT, ROLE_ASSISTANT, ROLE_OBSERVATION = 0, 1, 2


@dataclass(frozen=True)
class Task:
    """A cheap task descriptor yielded by the stream (no environment state)."""

    env: str
    """Environment name, e.g. ``textcraft``."""
    task_id: str
    """Identifier inside that environment (goal item, game path, ...)."""
    index: int = 0
    """Position in the stream (0-based)."""
    seed: int = 0
    """Seed handed to the environment's reset (distractors, shuffles)."""
    meta: tuple[tuple[str, Any], ...] = ()
    """Extra read-only facts (depth, family), as sorted key/value pairs."""

    def info(self) -> dict[str, Any]:
        return dict(self.meta)


@dataclass
class Turn:
    """One ReAct turn: the agent's text, the parsed action and the env reply."""

    index: int
    text: str
    """Decoded assistant text of this turn (reasoning + action line)."""
    action: str | None
    """Parsed action, None when the output had no parseable action."""
    observation: str
    """The environment's raw reply (or the parse-error notice)."""
    valid: bool
    """d_{i,t}: the environment executed the action."""
    span: tuple[int, int]
    """[start, end) of this turn's assistant tokens in ``Episode.token_ids``."""


@dataclass
class Episode:
    """A finished attempt at one task."""

    task: Task
    system: str
    """System message (instructions, and a probe's context) the student saw; the memory block is apart."""
    first_observation: str
    """The task description (first user message)."""
    token_ids: list[int] = field(default_factory=list)
    roles: list[int] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    """Turn index per token (-1 for the prompt)."""
    prompt_len: int = 0
    turns: list[Turn] = field(default_factory=list)
    verified: bool = False
    """v_i: the environment's verifier said the task was solved."""
    error: str | None = None
    """Environment error that ended the episode, if any."""
    score: float | None = None
    """The environment's graded score of the episode: its last step's ``info["score"]`` (WebShop's
    reward in [0, 1]; verified iff 1.0); None where the environment only verifies."""
    timings: dict[str, float] = field(default_factory=dict)
    # Set by callbacks before the update (see callbacks/):
    trainable: bool = True
    """False when a callback (e.g. the verification gate) vetoes the update."""
    pi_valid_only: bool = False
    """Drop invalid turns from the privileged information (invalid-turn filter)."""
    memory: dict[str, Any] | None = None
    """What the in-context memory showed the student (``MemoryView.as_dict``; None: no memory): its
    text followed ``system`` in the student's system message; the teacher does not see it."""

    @property
    def num_invalid(self) -> int:
        return sum(not t.valid for t in self.turns)

    @property
    def invalid_turns(self) -> set[int]:
        """Indices of the turns whose action the environment did not execute."""
        return {t.index for t in self.turns if not t.valid}

    @property
    def actions(self) -> list[str | None]:
        return [t.action for t in self.turns]

    def ids(self) -> torch.Tensor:
        return torch.tensor(self.token_ids, dtype=torch.long)

    def assistant_mask(self) -> torch.Tensor:
        """(T,) bool: tokens the student generated (the loss targets)."""
        return torch.tensor(self.roles, dtype=torch.long) == ROLE_ASSISTANT

    def summary(self) -> dict[str, Any]:
        """JSON-ready record of the episode (no token ids)."""
        return {
            "task_index": self.task.index,
            "env": self.task.env,
            "task_id": self.task.task_id,
            **self.task.info(),
            "verified": self.verified,
            "turns": len(self.turns),
            "invalid": self.num_invalid,
            "actions": self.actions,
            "valid": [t.valid for t in self.turns],
            "tokens": len(self.token_ids),
            "error": self.error,
            "score": self.score,
        }


def target_positions(roles: list[int] | torch.Tensor) -> torch.Tensor:
    """Positions p whose logits predict an assistant token (token p+1 is assistant).

    Returns a (N,) long tensor of indices into the sequence, N = #assistant tokens
    (an assistant token at position 0 cannot occur: the prompt comes first).
    """
    roles = torch.as_tensor(roles)
    return torch.nonzero(roles[1:] == ROLE_ASSISTANT).flatten()


def episode_state(ep: Episode) -> dict[str, Any]:
    """``ep`` as plain values (tensors, numbers, strings, lists, dicts): what a stream checkpoint
    (read with ``weights_only=True``) can hold. ``episode_from_state`` inverts it."""
    t = ep.task
    return {
        "task": {"env": t.env, "task_id": t.task_id, "index": t.index, "seed": t.seed,
                 "meta": [list(kv) for kv in t.meta]},
        "system": ep.system, "first_observation": ep.first_observation,
        "token_ids": torch.tensor(ep.token_ids, dtype=torch.long),
        "roles": torch.tensor(ep.roles, dtype=torch.int8), "turn_ids": torch.tensor(ep.turn_ids, dtype=torch.int32),
        "prompt_len": ep.prompt_len,
        "turns": [{"index": u.index, "text": u.text, "action": u.action, "observation": u.observation,
                   "valid": u.valid, "span": list(u.span)} for u in ep.turns],
        "verified": ep.verified, "error": ep.error, "score": ep.score, "timings": dict(ep.timings),
        "trainable": ep.trainable, "pi_valid_only": ep.pi_valid_only, "memory": ep.memory,
    }


def episode_from_state(state: dict[str, Any]) -> Episode:
    """The Episode that ``episode_state`` wrote."""
    t = state["task"]
    task = Task(t["env"], t["task_id"], t["index"], t["seed"], tuple(tuple(kv) for kv in t["meta"]))
    turns = [Turn(u["index"], u["text"], u["action"], u["observation"], u["valid"], tuple(u["span"]))
             for u in state["turns"]]
    return Episode(task=task, system=state["system"], first_observation=state["first_observation"],
                   token_ids=state["token_ids"].tolist(), roles=state["roles"].tolist(),
                   turn_ids=state["turn_ids"].tolist(), prompt_len=state["prompt_len"], turns=turns,
                   verified=state["verified"], error=state["error"], score=state.get("score"),
                   timings=dict(state["timings"]),
                   trainable=state["trainable"],
                   pi_valid_only=state["pi_valid_only"], memory=state.get("memory"))
