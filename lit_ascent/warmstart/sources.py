"""Per-environment factories: the training tasks and demo scripts, the evaluation tasks
and their reference (planner) scripts. Training never sees an evaluation task:
TextCraft trains on split ``train`` and evaluates on ``eval`` (disjoint by goal);
ALFWorld trains on ``valid_train`` planner demos and evaluates on ``valid_seen``/``valid_unseen``;
WebShop trains on the ``demo`` products' goals and evaluates on another partition (disjoint by product).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lit_ascent.envs.base import TextEnv
from lit_ascent.stream_order import stream_order
from lit_ascent.trajectory import Task
from lit_ascent.warmstart.demos import Script

ENVS = ("textcraft", "alfworld", "webshop")
ALFWORLD_EVAL_SPLITS = ("valid_seen", "valid_unseen")
STREAM_BALANCE = {"textcraft": None, "alfworld": "family", "webshop": None}
"""The streams' ``data.balance_by`` (configs/<env>/ascent.yaml)."""
WEBSHOP_DEMO_GOALS_PER_PRODUCT = 3
"""WebShop demos: up to 3 goals (option combinations) of each of the 100 demo products."""


@dataclass
class DemoSource:
    """What the demo builder needs: an environment, its training tasks in order, a script per kind."""

    env: TextEnv
    tasks: list[Task]
    scripts: dict[str, Callable[[Task, int], Script | None]]


def textcraft_training(depths: list[int], seed: int) -> DemoSource:
    from lit_ascent.envs.textcraft import TextCraftEnv
    from lit_ascent.warmstart.textcraft_demos import TextCraftScripts

    env = TextCraftEnv(depths=depths, split="train")
    scripts = TextCraftScripts(env)
    kinds = {"plain": scripts.plain, "recovery": scripts.recovery, "hindsight": scripts.plain}
    return DemoSource(env, stream_order(env.tasks(), seed), kinds)


def alfworld_training(demos_jsonl: str | None, seed: int) -> DemoSource:
    from lit_ascent.warmstart.alfworld_demos import (
        ALFWorldScripts,
        load_records,
        record_task,
        require_alfworld,
    )

    require_alfworld()
    if not demos_jsonl:
        raise ValueError("--demos-jsonl is required with --env alfworld "
                         "(write it with `python -m lit_ascent.warmstart.planner_cache --split valid_train --out FILE`)")
    from lit_ascent.envs.alfworld import ALFWorldEnv

    records = load_records(demos_jsonl)
    env = ALFWorldEnv(split="valid_train")
    scripts = ALFWorldScripts(env, {r["game"]: r["actions"] for r in records},
                              {r["game"]: r["observations"][0] for r in records})
    tasks = [record_task(r, i) for i, r in enumerate(records)]
    kinds = {"plain": scripts.plain, "recovery": scripts.recovery, "hindsight": scripts.plain}
    return DemoSource(env, stream_order(tasks, seed), kinds)


def webshop_training(seed: int) -> DemoSource:
    from lit_ascent.envs.webshop import WebShopEnv
    from lit_ascent.warmstart.webshop_demos import WebShopScripts

    env = WebShopEnv(partition="demo", goals_per_product=WEBSHOP_DEMO_GOALS_PER_PRODUCT)
    scripts = WebShopScripts(env)
    kinds = {"plain": scripts.plain, "recovery": scripts.recovery, "hindsight": scripts.plain}
    return DemoSource(env, stream_order(env.tasks(), seed), kinds)


def training_source(env: str, depths: list[int], seed: int, demos_jsonl: str | None = None) -> DemoSource:
    if env == "textcraft":
        return textcraft_training(depths, seed)
    if env == "alfworld":
        return alfworld_training(demos_jsonl, seed)
    if env == "webshop":
        return webshop_training(seed)
    raise ValueError(f"--env must be one of {ENVS}, got {env!r}")


def evaluation_source(env: str, depths: list[int], split: str | None,
                      max_distractors: int = 10) -> tuple[TextEnv, list[Task], Callable]:
    """(env, all evaluation tasks, reference script of a task); ``max_distractors`` is TextCraft's;
    WebShop's ``split`` is a partition (default ``stream``)."""
    if env == "textcraft":
        from lit_ascent.envs.textcraft import TextCraftEnv
        from lit_ascent.warmstart.textcraft_demos import TextCraftScripts

        tc = TextCraftEnv(depths=depths, split=split or "eval", max_distractors=max_distractors)
        return tc, tc.tasks(), TextCraftScripts(tc).plain
    if env == "alfworld":
        from lit_ascent.warmstart.alfworld_demos import (
            plain_texts,
            require_alfworld,
            task_goal,
        )

        require_alfworld()
        from lit_ascent.envs.alfworld import ALFWorldEnv

        split = split or "valid_seen"
        if split not in ALFWORLD_EVAL_SPLITS:
            raise ValueError(f"--split for alfworld evaluation must be one of {ALFWORLD_EVAL_SPLITS}, got {split!r}")
        alf = ALFWorldEnv(split=split)

        def reference(task: Task, k: int = 0) -> Script:
            demo = alf.expert_demo(task)
            return Script(plain_texts(task_goal(demo.observations[0]), demo.actions))

        return alf, alf.tasks(), reference
    if env == "webshop":
        from lit_ascent.envs.webshop import WebShopEnv
        from lit_ascent.warmstart.webshop_demos import WebShopScripts

        shop = WebShopEnv(partition=split or "stream")
        return shop, shop.tasks(), WebShopScripts(shop).plain
    raise ValueError(f"--env must be one of {ENVS}, got {env!r}")
