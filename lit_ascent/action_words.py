"""What the agent does, by the first word of its actions (the verb: ``get``, ``craft``, ``go``, ``take``): the
share of each word among a set of episodes' actions. A policy can keep its invalid rate and first-token
entropy while it stops using a verb its tasks need (TextCraft: every goal needs a ``craft``); this shows it."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

UNPARSED = "(unparsed)"
"""The word of a turn whose output parsed to no action."""


def first_word(action: str | None) -> str:
    words = (action or "").split()
    return words[0] if words else UNPARSED


def word_shares(action_lists: Iterable[list[str | None]]) -> dict[str, float]:
    """Each first word's share of all the actions, commonest first; {} for no action."""
    counts = Counter(first_word(a) for actions in action_lists for a in actions)
    total = sum(counts.values())
    return {w: n / total for w, n in counts.most_common()}


def leading_words(shares: dict[str, float], n: int) -> list[str]:
    """The ``n`` commonest parsed words of ``shares``."""
    return [w for w in shares if w != UNPARSED][:n]


def top_word(shares: dict[str, float]) -> str | None:
    """The commonest parsed word of ``shares`` (None: no parsed action)."""
    return next(iter(leading_words(shares, 1)), None)


def unseen_share(shares: dict[str, float], reference: dict[str, float]) -> float:
    """The share of ``shares``' parsed actions whose word ``reference`` never uses (a policy inventing verbs:
    the collapsed TextCraft agent's ``not enough bamboo``)."""
    return sum(v for w, v in shares.items() if w != UNPARSED and w not in reference)
