"""WebShop's oracle expert: search with the goal's words, page to the target, choose its options, buy.

The oracle knows the goal's target product. It searches with the goal's instruction (without the
price clause); when the target is not among the hits it searches with the target's name instead
(``fallback_query`` says when). Then ``click[next >]`` up to the target's results page, the
target, each wanted option value, and ``click[buy now]``.
"""
from __future__ import annotations

from lit_ascent.envs.webshop import BUY, NEXT, PER_PAGE, WebShopEnv, goal_query
from lit_ascent.trajectory import Task


def oracle_query(env: WebShopEnv, task: Task) -> tuple[str, bool]:
    """(the query the oracle searches with, whether it is the name fallback)."""
    goal = env.goals()[task.task_id]
    products, search = env.catalog()
    query = goal_query(goal)
    if goal.asin in search.search(query):
        return query, False
    return products[goal.asin].name, True


def solve(env: WebShopEnv, task: Task) -> list[str]:
    """The oracle's action sequence for ``task`` (pure: reads the catalog, does not step ``env``)."""
    goal = env.goals()[task.task_id]
    query, _ = oracle_query(env, task)
    rank = env.catalog()[1].search(query).index(goal.asin)
    return ([f"search[{query}]"] + [f"click[{NEXT}]"] * (rank // PER_PAGE) + [f"click[{goal.asin}]"]
            + [f"click[{value}]" for _, value in goal.options] + [f"click[{BUY}]"])
