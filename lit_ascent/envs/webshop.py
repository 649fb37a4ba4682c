"""WebShop (Yao et al., 2022) offline: the original's text-mode shop on its 1,000-product data.

Four kinds of page, as in the original: the search page (``search[query]``), a results page
(10 products per page of the top 50 hits, ``click[<asin>]``, ``click[next >]``, ``click[< prev]``,
``click[back to search]``), an item page (option buttons, ``click[description]`` /
``click[features]`` / ``click[reviews]`` sub-pages, ``click[buy now]``) and the sub-pages
(``click[< prev]`` back to the item). Pages are rendered like the original's text observations
as ReAct shows them: one element per line, clickable buttons in brackets. Button text is matched
case-insensitively, as the original lowercases it. An option click answers "You have clicked
<value>." (ReAct's reply) and keeps the item page.

An action that names no button of the page, a search anywhere but on the search page, an empty
query or a line that is neither ``search[...]`` nor ``click[...]`` is an invalid turn with a
message saying why; the page does not change. ``click[buy now]`` ends the episode with the
reward of ``webshop_reward``; verified iff it is 1.0.

Tasks are the synthetic goals (``webshop_data``) of one partition: the instruction products are
split, disjoint by product, into ``demo`` (warm-start demonstrations), ``stream`` and ``heldout``
parts, fixed for every seed; each product contributes ``goals_per_product`` of its goals (a stable
choice among its option combinations).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from lit_ascent.envs.base import StepResult, TextEnv
from lit_ascent.envs.webshop_data import (
    PARTITIONS,
    Goal,
    Product,
    load_products,
    product_goals,
    resolve_data_dir,
    split_products,
)
from lit_ascent.envs.webshop_reward import reward
from lit_ascent.bm25 import BM25Index
from lit_ascent.trajectory import Task

PER_PAGE = 10
SUB_PAGES = ("description", "features", "reviews")
BACK, NEXT, PREV, BUY = "back to search", "next >", "< prev", "buy now"
_ACTION_RE = re.compile(r"^\s*(search|click)\s*\[(.*)\]\s*$", re.IGNORECASE | re.DOTALL)
_PRICE_CLAUSE = re.compile(r", and price lower than [\d.]+ dollars$")

_SYSTEM_PROMPT = """\
Buy the product the instruction describes in a text web shop.
Each turn write "Thought: <short reasoning>" then "Action: <action>".
Actions:
- search[QUERY]: search the shop (only on the search page).
- click[BUTTON]: click a button shown in brackets: a product id such as click[B01ABCD234], \
click[next >], click[< prev], click[back to search], an option value such as click[large], \
click[description], click[features], click[reviews], click[buy now].
Rules: open a product that matches the instruction, click every option value the instruction \
names, then click[buy now]. The price must be lower than the instruction's bound. Buying ends the task.
Example:
Instruction: i want a blue cotton throw blanket, and price lower than 30.00 dollars
Thought: Search for the blanket's words.
Action: search[blue cotton throw blanket]
[Back to Search] Page 1 (Total results: 50) [Next >] [B01ABCD234] Cotton Throw Blanket $19.99 ...
Thought: B01ABCD234 is a cotton throw blanket under 30 dollars.
Action: click[B01ABCD234]
[Back to Search] [< Prev] color [blue][grey] Cotton Throw Blanket Price: $19.99 ... [Buy Now]
Thought: Choose blue.
Action: click[blue]
You have clicked blue.
Thought: All options chosen; buy it.
Action: click[buy now]"""


@lru_cache(maxsize=4)
def catalog(data_dir: Path) -> tuple[dict[str, Product], BM25Index]:
    """The products and their search index (built once per data folder)."""
    products = load_products(data_dir)
    return products, BM25Index(list(products), [p.search_text() for p in products.values()])


def goal_query(goal: Goal) -> str:
    """The goal's words as a search query: its instruction without the price clause."""
    return _PRICE_CLAUSE.sub("", goal.instruction)


def parse_web_action(action: str) -> tuple[str, str] | None:
    """(``search`` | ``click``, argument) or None for anything else."""
    m = _ACTION_RE.match(action)
    return (m[1].lower(), m[2].strip()) if m else None


def bracket(text: str) -> str:
    return f"[{text}]"


@dataclass
class Browser:
    """Where the agent is: the page kind and what it shows."""

    page: str = "search"
    """``search`` | ``results`` | ``item`` | ``sub`` | ``done``."""
    query: str = ""
    hits: list[str] = field(default_factory=list)
    results_page: int = 1
    asin: str | None = None
    sub: str | None = None
    chosen: dict[str, str] = field(default_factory=dict)
    """Option name -> clicked value on the current item."""


class WebShopEnv(TextEnv):
    """WebShop's text shop as a :class:`TextEnv`, one synthetic goal per task."""

    name = "webshop"

    def __init__(self, partition: str = "stream", data_dir: str | None = None, demo_size: int = 100,
                 heldout_size: int = 64, goals_per_product: int = 1):
        """
        Args:
            partition: ``demo`` / ``stream`` / ``heldout`` / ``all``: which products' goals are the tasks.
            data_dir: Folder with the two data files (None: ``$WEBSHOP_DATA``, else ../shared/data/webshop).
            demo_size: Instruction products reserved for warm-start demonstrations.
            heldout_size: Instruction products held out for the frozen evaluation.
            goals_per_product: Goals (option combinations) per product; fewer when it has fewer.
        """
        if partition not in PARTITIONS:
            raise ValueError(f"WebShopEnv: partition must be one of {PARTITIONS}, got {partition!r}")
        if goals_per_product < 1:
            raise ValueError(f"WebShopEnv: goals_per_product must be >= 1, got {goals_per_product!r}")
        self.partition, self.data_dir = partition, data_dir
        self.demo_size, self.heldout_size, self.goals_per_product = demo_size, heldout_size, goals_per_product
        self._goals: dict[str, Goal] | None = None
        self._goal: Goal | None = None
        self._browser = Browser()

    # -- data ------------------------------------------------------------------
    def catalog(self) -> tuple[dict[str, Product], BM25Index]:
        return catalog(resolve_data_dir(self.data_dir))

    def goals(self) -> dict[str, Goal]:
        """goal id -> goal, for every product's chosen goals (all partitions)."""
        if self._goals is None:
            products, _ = self.catalog()
            goals = {}
            for asin, product in products.items():
                options = product_goals(product)
                k = min(self.goals_per_product, len(options))
                goals.update((g.goal_id, g) for g in random.Random(f"goals#{asin}").sample(options, k))
            self._goals = goals
        return self._goals

    def tasks(self) -> list[Task]:
        """The partition's goals in the data's product order."""
        products, _ = self.catalog()
        goals = self.goals()
        parts = split_products(sorted({g.asin for g in goals.values()}), self.demo_size, self.heldout_size)
        out = []
        for goal in goals.values():
            part = parts[goal.asin]
            if self.partition in ("all", part):
                meta = (("asin", goal.asin), ("category", products[goal.asin].category), ("partition", part))
                out.append(Task(self.name, goal.goal_id, index=len(out), seed=0, meta=meta))
        return out

    # -- TextEnv ---------------------------------------------------------------
    def reset(self, task: Task) -> str:
        goal = self.goals().get(task.task_id)
        if goal is None:
            raise ValueError(f"WebShopEnv: unknown goal {task.task_id!r} (expected '<asin>#<k>' of this "
                             f"env's goals, goals_per_product={self.goals_per_product})")
        self._goal, self._browser = goal, Browser()
        return self.render()

    def goal(self) -> Goal:
        if self._goal is None:
            raise RuntimeError("WebShopEnv: reset() first")
        return self._goal

    def step(self, action: str) -> StepResult:
        goal, b = self.goal(), self._browser
        if b.page == "done":
            return self._invalid("the purchase is made; the episode is over")
        parsed = parse_web_action(action)
        if parsed is None:
            return self._invalid(f"{action!r} is not search[QUERY] or click[BUTTON]")
        verb, arg = parsed
        if verb == "search":
            if b.page != "search":
                return self._invalid(f"search only on the search page; click[{BACK}] first")
            if not arg:
                return self._invalid("the query is empty")
            b.page, b.query, b.hits, b.results_page = "results", arg, self.catalog()[1].search(arg), 1
            return StepResult(self.render())
        button = arg.lower()
        if button not in self.buttons():
            return self._invalid(f"there is no button {bracket(arg)} on this page")
        return self._click(button, goal)

    def _click(self, button: str, goal: Goal) -> StepResult:
        b = self._browser
        products = self.catalog()[0]
        if button == BACK:
            self._browser = Browser()
        elif button == NEXT:
            b.results_page += 1
        elif button == PREV:
            if b.page == "results":
                b.results_page -= 1
            elif b.page == "item":
                b.page, b.asin = "results", None
            else:
                b.page, b.sub = "item", None
        elif b.page == "results":
            b.page, b.asin, b.chosen = "item", button.upper(), {}
        elif button in SUB_PAGES:
            b.page, b.sub = "sub", button
        elif button == BUY:
            bought = products[b.asin]
            r = reward(bought, products[goal.asin], goal, b.chosen)
            b.page = "done"
            verified = abs(r.total - 1.0) < 1e-9
            text = f"Thank you for shopping with us! Your score (min 0.0, max 1.0): {r.total:.2f}"
            info = {"asin": b.asin, "score": r.total, **r.as_dict()}
            return StepResult(text, done=True, verified=verified, info=info)
        else:  # an option value of the item
            name = next(n for n, values in products[b.asin].options if button in values)
            b.chosen[name] = button
            return StepResult(f"You have clicked {button}.")
        return StepResult(self.render())

    def _invalid(self, why: str) -> StepResult:
        return StepResult(f"Invalid action: {why}.", valid=False, info={"invalid": why})

    # -- pages -----------------------------------------------------------------
    def _page_hits(self) -> list[str]:
        b = self._browser
        start = (b.results_page - 1) * PER_PAGE
        return b.hits[start:start + PER_PAGE]

    def buttons(self) -> list[str]:
        """The lowercased buttons ``click[...]`` accepts on the current page."""
        b = self._browser
        if b.page == "results":
            nav = [PREV] if b.results_page > 1 else []
            nav += [NEXT] if b.results_page * PER_PAGE < len(b.hits) else []
            return [BACK, *nav, *(a.lower() for a in self._page_hits())]
        if b.page == "item":
            values = [v for _, vs in self.catalog()[0][b.asin].options for v in vs]
            return [BACK, PREV, *values, *SUB_PAGES, BUY]
        if b.page == "sub":
            return [BACK, PREV]
        return []

    def render(self) -> str:
        """The current page as text: one element per line, buttons in brackets."""
        b, products = self._browser, self.catalog()[0]
        if b.page == "search":
            return f"WebShop\nInstruction:\n{self.goal().instruction}\n[Search]"
        lines = [bracket("Back to Search")]
        if b.page == "results":
            lines.append(f"Page {b.results_page} (Total results: {len(b.hits)})")
            lines += [bracket("< Prev")] if b.results_page > 1 else []
            lines += [bracket("Next >")] if b.results_page * PER_PAGE < len(b.hits) else []
            for asin in self._page_hits():
                lines += [bracket(asin), products[asin].name, products[asin].price_tag]
            return "\n".join(lines)
        product = products[b.asin]
        lines.append(bracket("< Prev"))
        if b.page == "sub":
            body = {"description": product.description, "features": "\n".join(product.bullets), "reviews": ""}
            return "\n".join(lines + [body[b.sub]]).rstrip()
        lines += [f"{name} " + "".join(bracket(v) for v in values) for name, values in product.options]
        lines += [product.name, f"Price: {product.price_tag}", "Rating: N.A."]
        lines += [bracket(s.capitalize()) for s in SUB_PAGES] + [bracket("Buy Now")]
        return "\n".join(lines)

    # -- the rest ----------------------------------------------------------------
    def system_prompt(self) -> str:
        return _SYSTEM_PROMPT

    def goal_line(self, first_observation: str) -> str:
        """The instruction (the search page's third line)."""
        lines = first_observation.splitlines()
        return lines[2] if len(lines) > 2 and lines[1] == "Instruction:" else super().goal_line(first_observation)

    def fresh(self) -> WebShopEnv:
        return WebShopEnv(self.partition, self.data_dir, self.demo_size, self.heldout_size, self.goals_per_product)

    def expert_actions(self, task: Task) -> list[str]:
        """The oracle's actions for ``task`` (``webshop_oracle.solve``)."""
        from lit_ascent.envs.webshop_oracle import solve

        return solve(self, task)
