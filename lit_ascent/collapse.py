"""Collapse diagnostics measured on a policy, shared by the stream (``callbacks.CollapseDiagnostics``) and the
iterated cycles (``lit_ascent.cycles``).

- First response token: the student's entropy and its drift KL(student || initial model) there.
- Action drift on a fixed probe set: frozen copies of episodes that hold an action; the mean
  KL(student || initial) over their action tokens and the number of their actions whose greedy tokens
  changed (teacher forcing on the probes' own ids).

``initial`` is a context manager factory that runs the initial model without gradient: ``policy.teacher``
in the stream (the teacher is the initial model there), ``Policy.teacher`` of the base class in the cycles
(all adapters off), whose own ``teacher`` is the start-of-cycle snapshot.
"""
from __future__ import annotations

import statistics
from typing import Callable, ContextManager

import torch

from lit_ascent.envs.base import action_token_mask
from lit_ascent.metrics import action_drift, first_token_stats, repeated_actions
from lit_ascent.trajectory import Episode

Initial = Callable[[], ContextManager]
TURN_ID_STRIDE = 10_000  # probe k's turn t is action k * stride + t: unique over the set
PROBE_MAX_TOKENS = 2048  # a probe is cut to its first tokens (bounds the forward's cost)


def action_positions(tokenizer, episode: Episode, max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, turn of each) for the positions whose logits predict an action token, within the
    first ``max_tokens`` tokens of ``episode``: (n,) long, (n,) long."""
    pos, turn_of = [], []
    for turn in episode.turns:
        start, end = turn.span
        for k, is_action in enumerate(action_token_mask(tokenizer, episode.token_ids[start:end])):
            if is_action and 0 < start + k < max_tokens:
                pos.append(start + k - 1)
                turn_of.append(turn.index)
    return torch.tensor(pos, dtype=torch.long), torch.tensor(turn_of, dtype=torch.long)


def first_token(policy, episode: Episode, initial: Initial) -> dict[str, float]:
    """``first_token_stats`` at the first response token of ``episode`` (two prompt forwards)."""
    prompt = episode.ids()[: episode.prompt_len]
    last = torch.tensor([episode.prompt_len - 1])
    with torch.no_grad():
        student = policy.logits(prompt, last)[0]
    with initial():
        start = policy.logits(prompt, last)[0]
    return first_token_stats(student, start)


def make_probe(tokenizer, episode: Episode, max_tokens: int, number: int) -> dict | None:
    """A frozen probe copy of ``episode`` (the ``number``-th of its set): ids (T,), positions (n,), turn ids
    unique over the set (n,); None when its first ``max_tokens`` tokens hold no action."""
    pos, turn_of = action_positions(tokenizer, episode, max_tokens)
    if not len(pos):
        return None
    return {"ids": episode.ids()[: int(pos.max()) + 1], "positions": pos, "turns": turn_of + TURN_ID_STRIDE * number}


def first_probes(tokenizer, episodes: list[Episode], size: int, max_tokens: int = PROBE_MAX_TOKENS) -> list[dict]:
    """The first ``size`` of ``episodes`` that hold an action, as probes (``make_probe``)."""
    probes = []
    for e in episodes:
        if len(probes) < size and (probe := make_probe(tokenizer, e, max_tokens, len(probes))):
            probes.append(probe)
    return probes


def no_drift() -> dict[str, float]:
    """``action_drift`` over no action position: zeros (zero fast weights, or an empty probe set)."""
    return action_drift(torch.zeros(0, 1), torch.zeros(0, 1), torch.zeros(0, dtype=torch.long))


def probe_drift(policy, probes: list[dict], initial: Initial) -> dict[str, float]:
    """``action_drift`` of the current weights over the probes' action tokens. The initial model's hidden
    states are computed once per probe and kept in it (``initial_hidden``); the LM head is never adapted."""
    student, start, turns = [], [], []
    for probe in probes:
        if "initial_hidden" not in probe:
            with initial():
                probe["initial_hidden"] = policy.hidden(probe["ids"])[probe["positions"].to(policy.device)]
        with torch.no_grad():
            student.append(policy.logits(probe["ids"], probe["positions"]).float())
            start.append(policy.head(probe["initial_hidden"]).float())
        turns.append(probe["turns"])
    if not turns:
        return no_drift()
    return action_drift(torch.cat(student), torch.cat(start), torch.cat(turns).to(student[0].device))


def deployment_diagnostics(policy, episodes: list[Episode], probes: list[dict], initial: Initial) -> dict[str, float]:
    """One deployment's collapse diagnostics: the means over its episodes of the first-token entropy and
    drift and of the repeated-action statistics, and the action drift on ``probes``."""
    rows = [repeated_actions(e.actions) | first_token(policy, e, initial) for e in episodes]
    means = {k: statistics.fmean(r[k] for r in rows) for k in rows[0]} if rows else {}
    return means | probe_drift(policy, probes, initial)
