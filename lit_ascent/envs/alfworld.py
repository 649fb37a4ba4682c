"""ALFWorld text games behind the ``TextEnv`` protocol.

Games are played offline with TextWorld's PDDL engine and ALFWorld's demangling
wrappers (the same stack ALFWorld's ``AlfredTWEnv`` builds), one game per episode.
The splits are filtered exactly as ALFWorld filters them, so an official
``alfworld-download`` yields the same game sets as the shared data.

Signals: ``verified`` is the game's ``won``; an action is ``valid`` iff it is one of
the admissible commands of the current state and the game did not answer
"Nothing happens." (the engine's reply to anything it did not execute).
"""
from __future__ import annotations

import json
import logging
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from lit_ascent.envs.base import StepResult, TextEnv
from lit_ascent.trajectory import Task

log = logging.getLogger(__name__)

SPLITS = ("valid_seen", "valid_unseen", "valid_train")
FAMILIES = (
    "pick_and_place",
    "pick_two_obj_and_place",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
)
# ALFWorld's task types (trial folder prefixes) -> our family names.
_TASK_TYPE_TO_FAMILY = {"pick_and_place_simple": "pick_and_place", **{f: f for f in FAMILIES[1:]}}
NOTHING_HAPPENS = "Nothing happens."
_WELCOME = "-= Welcome to TextWorld, ALFRED! =-"
_GAMES_DIR = "json_2.1.1"
_DEFAULT_DATA_ROOT = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "alfworld"
_ENGINE_STEP_CAP = 10_000  # the rollout's max_turns ends episodes; this only guards the engine
_EXPERT_STEP_CAP = 100  # planner solutions here are 3-~15 steps


@contextmanager
def preserved_argv() -> Iterator[None]:
    """Restore ``sys.argv`` (object and contents): fast-downward's translator rebinds it."""
    original, contents = sys.argv, list(sys.argv)
    try:
        yield
    finally:
        original[:] = contents
        sys.argv = original


def _has_games(root: Path) -> bool:
    return (root / _GAMES_DIR).is_dir()


def resolve_data_root(data_root: str | os.PathLike | None = None) -> Path:
    """The folder holding ``json_2.1.1/``: ``data_root``, else ``$ALFWORLD_DATA``, else the shared data.

    An explicit ``data_root`` must hold the games; ``$ALFWORLD_DATA`` is skipped when
    it holds none (importing ``alfworld`` points it at an empty cache folder).
    """
    env_value = os.environ.get("ALFWORLD_DATA")
    if data_root is not None:
        candidates = [Path(data_root)]
    else:
        candidates = [Path(env_value)] if env_value else []
        candidates.append(_DEFAULT_DATA_ROOT)
    for root in candidates:
        if _has_games(root.expanduser()):
            return root.expanduser().resolve()
    raise FileNotFoundError(
        f"ALFWorld data not found: no '{_GAMES_DIR}/' folder under any of "
        f"(1) the data_root argument ({data_root if data_root is not None else 'not given'}), "
        f"(2) $ALFWORLD_DATA ({env_value or 'not set'}), "
        f"(3) the default {_DEFAULT_DATA_ROOT}. "
        "Pass data_root=..., set ALFWORLD_DATA, or run `alfworld-download`."
    )


def family_of(game_file: Path) -> str | None:
    """Task family from the trial's parent folder name (``<task_type>-<obj>-...``), None if unknown."""
    return _TASK_TYPE_TO_FAMILY.get(game_file.parent.parent.name.split("-", 1)[0])


def collect_games(root: Path, split: str) -> list[Path]:
    """The split's playable games, filtered like ALFWorld's ``AlfredTWEnv.collect_game_files``.

    Skips trials under ``movable``/``Sliced`` folders, unknown task types, missing
    game files and games whose ``game.tw-pddl`` is not marked ``solvable``.
    """
    split_dir = root / _GAMES_DIR / split
    games = []
    for traj in sorted(split_dir.rglob("traj_data.json")):
        trial = traj.parent
        rel = str(trial.relative_to(split_dir))
        if "movable" in rel or "Sliced" in rel:
            continue
        with open(traj) as f:
            if json.load(f).get("task_type") not in _TASK_TYPE_TO_FAMILY:
                continue
        game_file = trial / "game.tw-pddl"
        if not game_file.is_file():
            continue
        with open(game_file) as f:
            if not json.load(f).get("solvable", False):
                continue
        games.append(game_file)
    return games


def clean_intro(text: str) -> str:
    """The game's intro without TextWorld's welcome banner."""
    return text.split(_WELCOME, 1)[-1].strip()


def normalize_command(action: str) -> str:
    """ALFWorld commands are lower case, single-spaced, without a final period."""
    return " ".join(action.strip().rstrip(".").split()).lower()


@dataclass
class ExpertDemo:
    """The planner's playthrough of one game."""

    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    """The first observation (intro), then one reply per action."""
    won: bool = False


class ALFWorldEnv(TextEnv):
    """ALFWorld (text) games of one split, one TextWorld engine per episode."""

    name = "alfworld"

    def __init__(self, split: str = "valid_seen", data_root: str | None = None, list_admissible: bool = False):
        """
        Args:
            split: Game split: valid_seen (140 games), valid_unseen (134) or valid_train (200).
            data_root: Folder holding json_2.1.1/ (default: $ALFWORLD_DATA, else ../shared/data/alfworld).
            list_admissible: Append the admissible commands to every observation.
        """
        if split not in SPLITS:
            raise ValueError(f"ALFWorldEnv: split must be one of {SPLITS}, got {split!r}")
        self.split, self.data_root, self.list_admissible = split, data_root, list_admissible
        self._root: Path | None = None
        self._tasks: list[Task] | None = None
        self._game = None  # the live TextWorld gym env of the current episode
        self._admissible: list[str] = []
        self._won = False

    # --- tasks ---------------------------------------------------------------------
    @property
    def root(self) -> Path:
        if self._root is None:
            self._root = resolve_data_root(self.data_root)
        return self._root

    def tasks(self) -> list[Task]:
        if self._tasks is None:
            games = collect_games(self.root, self.split)
            self._tasks = [
                Task(self.name, str(g.relative_to(self.root)), meta=(("family", family_of(g)),)) for g in games
            ]
        return list(self._tasks)

    def game_file(self, task: Task) -> Path:
        return self.root / task.task_id

    # --- episode -------------------------------------------------------------------
    @property
    def admissible_commands(self) -> list[str]:
        """The commands the engine would execute in the current state."""
        return list(self._admissible)

    def reset(self, task: Task) -> str:
        self.close()
        self._game = _open_game(self.game_file(task))
        with preserved_argv():
            obs, infos = self._game.reset()
        self._admissible, self._won = list(infos["admissible_commands"][0]), False
        return self._render(clean_intro(obs[0]))

    def step(self, action: str) -> StepResult:
        """Run one command; invalid iff not admissible, answered "Nothing happens." or the engine raised."""
        if self._game is None:
            raise RuntimeError("ALFWorldEnv: reset() first")
        command = normalize_command(action)
        admissible = command in self._admissible
        try:
            with preserved_argv():
                obs, _, dones, infos = self._game.step([command])
            reply, won = obs[0], bool(infos["won"][0])
            self._admissible = list(infos["admissible_commands"][0])
        except Exception as err:  # odd input must cost the agent a turn, not the stream
            return StepResult(f"{type(err).__name__}: {err}", valid=False, info={"error": repr(err), "command": command})
        self._won = won
        valid = admissible and reply.strip() != NOTHING_HAPPENS
        info = {"command": command, "admissible": admissible}
        return StepResult(self._render(reply), done=won or bool(dones[0]), verified=won, valid=valid, info=info)

    def verify_at_end(self) -> bool:
        return self._won

    def _render(self, text: str) -> str:
        if not self.list_admissible:
            return text
        return f"{text}\nAdmissible actions: {', '.join(self._admissible)}"

    def fresh(self) -> ALFWorldEnv:
        """Same split and settings, no live game (a TextWorld game cannot be deep-copied)."""
        other = ALFWorldEnv(self.split, self.data_root, self.list_admissible)
        other._root, other._tasks = self._root, self._tasks
        return other

    def close(self) -> None:
        if self._game is not None:
            _close_game(self._game)
        self._game, self._admissible, self._won = None, [], False

    # --- expert --------------------------------------------------------------------
    def expert_demo(self, task: Task) -> ExpertDemo:
        """Play ``task`` with ALFWorld's planner (fast-downward), replanning every step.

        Uses its own engine: the current episode (if any) is left untouched.
        """
        game = _open_game(self.game_file(task), expert=True)
        try:
            with preserved_argv():
                obs, infos = game.reset()
            demo = ExpertDemo(observations=[clean_intro(obs[0])])
            for _ in range(_EXPERT_STEP_CAP):
                plan = infos["extra.expert_plan"][0]
                if demo.won or not plan:
                    break
                with preserved_argv():
                    obs, _, _, infos = game.step([plan[0]])
                demo.actions.append(plan[0])
                demo.observations.append(obs[0])
                demo.won = bool(infos["won"][0])
            return demo
        finally:
            _close_game(game)

    def expert_actions(self, task: Task) -> list[str]:
        """The planner's action sequence for ``task`` (median ~2 CPU-s per game, mean ~7, a few ~100)."""
        return self.expert_demo(task).actions

    # --- prompt --------------------------------------------------------------------
    def system_prompt(self) -> str:
        return _SYSTEM_PROMPT


def _open_game(game_file: Path, expert: bool = False):
    """A batch-of-one TextWorld gym env for one game, wrapped like ALFWorld's AlfredTWEnv."""
    import textworld
    import textworld.gym

    AlfredDemangler, AlfredExpert, AlfredExpertType, AlfredInfos = _alfworld_wrappers()
    infos = textworld.EnvInfos(won=True, admissible_commands=True, extras=["gamefile"])
    wrappers = [AlfredDemangler(shuffle=False), AlfredInfos]
    if expert:
        wrappers.append(AlfredExpert(expert_type=AlfredExpertType.PLANNER))
        infos.extras.append("expert_plan")
    with preserved_argv():
        env_id = textworld.gym.register_games(
            [str(game_file)], infos, batch_size=1, asynchronous=False,
            max_episode_steps=_ENGINE_STEP_CAP, wrappers=wrappers, name="lit-ascent-alfworld",
        )
        # The registry keeps the wrapper instances (and so the whole engine) alive: drop it.
        try:
            return textworld.gym.make(env_id)
        finally:
            textworld.gym.registry.pop(env_id, None)


def _alfworld_wrappers() -> tuple:
    """ALFWorld's TextWorld wrappers, imported without leaking ``$ALFWORLD_DATA``.

    ``import alfworld`` sets ``$ALFWORLD_DATA`` (to ``~/.cache/alfworld`` when unset),
    which would change how later environments resolve their data root.
    """
    before = os.environ.get("ALFWORLD_DATA")
    try:
        from alfworld.agents.environment.alfred_tw_env import (
            AlfredDemangler,
            AlfredExpert,
            AlfredExpertType,
            AlfredInfos,
        )
    finally:
        if before is None:
            os.environ.pop("ALFWORLD_DATA", None)
        else:
            os.environ["ALFWORLD_DATA"] = before
    return AlfredDemangler, AlfredExpert, AlfredExpertType, AlfredInfos


def _close_game(game) -> None:
    """Close the env and free its planner state.

    Each engine loads a private copy of fast-downward's library; it is not unloaded
    (``fast_downward.close_lib`` makes the interpreter segfault at exit), so an
    episode leaves ~3 MB behind.
    """
    try:
        lib = getattr(game.batch_env.envs[0], "downward_lib", None)
        game.close()
        if lib is not None:
            lib.cleanup()
    except Exception as err:  # best effort: a small leak is better than a crash
        log.warning("ALFWorld: closing a game's engine failed (%s: %s); continuing", type(err).__name__, err)


_SYSTEM_PROMPT = """\
You are an agent in a household simulated as a text game. The first message describes the room and your task. Reach the goal with as few actions as you can.

Every turn, write exactly two lines:
Thought: <brief reasoning: what you know, where the object may be, what comes next>
Action: <one command>

Commands (X is an object, Y a receptacle or appliance, always with its number, e.g. "apple 1", "fridge 1"):
- go to Y
- open Y / close Y
- take X from Y
- put X in/on Y (write "in/on" literally)
- clean X with Y (Y: a sink basin) / heat X with Y (microwave) / cool X with Y (fridge)
- use X (switch on a lamp)
- examine X / examine Y
- look / inventory
Pick up one object at a time. An object must be in your hands to be put, cleaned, heated or cooled. A command that cannot be executed gets the reply "Nothing happens."

Example:
Your task is to: put a cool tomato in microwave.
Thought: A tomato is likely on the countertop or in the fridge. I check countertop 1 first.
Action: go to countertop 1
Observation: On the countertop 1, you see a knife 1, and a tomato 1.
Thought: Found tomato 1. I take it.
Action: take tomato 1 from countertop 1
Observation: You pick up the tomato 1 from the countertop 1.
Thought: Now I cool it with the fridge.
Action: go to fridge 1
...
Action: cool tomato 1 with fridge 1
...
Action: put tomato 1 in/on microwave 1"""
