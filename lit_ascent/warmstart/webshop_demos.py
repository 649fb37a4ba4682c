"""WebShop demonstrations: the oracle's actions with short templated thoughts, and recovery scripts
around the shop's real replies.

Every thought names only what the context shows: the instruction's words, the product and price
of the results line it clicks, the option the instruction names. Recovery mistakes:

- ``wrong_item``: open another product of the target's results page first, go back with
  ``click[< prev]`` (a valid detour; the wrong click is the mistake turn);
- ``search_button``: ``click[search]`` on the search page (invalid: the shop says to write a
  query), then the search;
- ``buy_typo``: ``click[buy]`` (invalid: no such button), then ``click[buy now]``.
"""
from __future__ import annotations

from lit_ascent.envs.webshop import BUY, PER_PAGE, WebShopEnv, parse_web_action
from lit_ascent.envs.webshop_oracle import solve
from lit_ascent.trajectory import Task
from lit_ascent.warmstart.demos import Script, react

ERROR_KINDS = ("wrong_item", "search_button", "buy_typo")


def short_name(name: str, words: int = 6) -> str:
    return " ".join(name.split()[:words])


class WebShopScripts:
    """Script builders (``Script`` per task) for the three demo kinds."""

    def __init__(self, env: WebShopEnv):
        self.env = env

    def _thought(self, task: Task, action: str) -> str:
        goal = self.env.goals()[task.task_id]
        products = self.env.catalog()[0]
        verb, arg = parse_web_action(action)
        if verb == "search":
            return "Search for the instruction's words."
        if arg == "next >":
            return "None of these matches the instruction; see the next page."
        if arg == BUY:
            return "Every option the instruction names is chosen; buy it."
        if arg.upper() in products:
            p = products[arg.upper()]
            return f"{arg} is {short_name(p.name)} at {p.price_tag}: it matches the instruction; open it."
        name = next(n for n, v in goal.options if v == arg)
        return f"The instruction asks for {name}: {arg}; click it."

    def plain_texts(self, task: Task, actions: list[str]) -> list[str]:
        return [react(self._thought(task, a), a) for a in actions]

    def plain(self, task: Task, k: int = 0) -> Script:
        return Script(self.plain_texts(task, solve(self.env, task)))

    def recovery(self, task: Task, k: int) -> Script | None:
        """Recovery demo number ``k``: error kinds rotate, falling back to the next applicable one."""
        actions = solve(self.env, task)
        texts = self.plain_texts(task, actions)
        for j in range(len(ERROR_KINDS)):
            kind = ERROR_KINDS[(k + j) % len(ERROR_KINDS)]
            script = getattr(self, f"_{kind}")(task, actions, texts)
            if script is not None:
                script.error_kind = kind
                return script
        return None

    # -- the mistakes ----------------------------------------------------------
    def _wrong_item(self, task: Task, actions: list[str], texts: list[str]) -> Script | None:
        goal = self.env.goals()[task.task_id]
        products, search = self.env.catalog()
        c = next(i for i, a in enumerate(actions) if a == f"click[{goal.asin}]")
        hits = search.search(parse_web_action(actions[0])[1])
        page = hits[(c - 1) * PER_PAGE:c * PER_PAGE]  # the target's results page (c - 1 clicks on next)
        other = next((a for a in page if a != goal.asin), None)
        if other is None:
            return None
        p = products[other]
        wrong = react(f"{other} is {short_name(p.name)} at {p.price_tag}; open it.", f"click[{other}]")
        back = react(f"{short_name(p.name)} is not what the instruction describes; go back.", "click[< prev]")
        return Script([*texts[:c], wrong, back, *texts[c:]], (c,), ())

    def _search_button(self, task: Task, actions: list[str], texts: list[str]) -> Script | None:
        wrong = react("Click the search button.", "click[search]")
        fix = react("There is no search button to click: write the query in search[...].", actions[0])
        return Script([wrong, fix, *texts[1:]], (0,), (0,))

    def _buy_typo(self, task: Task, actions: list[str], texts: list[str]) -> Script | None:
        wrong = react("Every option the instruction names is chosen; buy it.", "click[buy]")
        fix = react("There is no [buy] button: the button is [Buy Now].", actions[-1])
        n = len(actions) - 1
        return Script([*texts[:n], wrong, fix], (n,), (n,))
