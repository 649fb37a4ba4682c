"""ALFWorld adapter, planner and demo cache against the shared game data (no model)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from lit_ascent.warmstart.planner_cache import load_done, write_demos
from lit_ascent.warmstart.planner_cache import main as demos_main
from lit_ascent.envs import alfworld as alf
from lit_ascent.stream_order import stream_order
from lit_ascent.envs.alfworld import ALFWorldEnv, preserved_argv, resolve_data_root
from lit_ascent.envs.base import parse_action
from lit_ascent.trajectory import Task

ROOT = Path(__file__).resolve().parents[1]
FAMILY_COUNTS = {
    "valid_seen": {"pick_and_place": 35, "pick_two_obj_and_place": 24, "look_at_obj_in_light": 13,
                   "pick_clean_then_place_in_recep": 27, "pick_heat_then_place_in_recep": 16,
                   "pick_cool_then_place_in_recep": 25},
    "valid_unseen": {"pick_and_place": 24, "pick_two_obj_and_place": 17, "look_at_obj_in_light": 18,
                     "pick_clean_then_place_in_recep": 31, "pick_heat_then_place_in_recep": 23,
                     "pick_cool_then_place_in_recep": 21},
    "valid_train": {"pick_and_place": 46, "pick_two_obj_and_place": 45, "look_at_obj_in_light": 19,
                    "pick_clean_then_place_in_recep": 37, "pick_heat_then_place_in_recep": 25,
                    "pick_cool_then_place_in_recep": 28},
}
SPLIT_SIZES = {"valid_seen": 140, "valid_unseen": 134, "valid_train": 200}
# The first valid_train game (sorted) and a winning sequence for it, written by hand.
LOOK_GAME = "look_at_obj_in_light-Book-None-DeskLamp-302"
LOOK_SOLUTION = ["go to bed 1", "take book 1 from bed 1", "go to sidetable 2", "use desklamp 1"]


def _data_reason() -> str | None:
    try:
        resolve_data_root()
    except FileNotFoundError as err:
        return f"ALFWorld data not found ({err})"
    return None


_MISSING = [m for m in ("textworld", "alfworld", "fast_downward") if importlib.util.find_spec(m) is None]
needs_data = pytest.mark.skipif(_data_reason() is not None, reason=_data_reason() or "")
needs_engine = pytest.mark.skipif(
    bool(_MISSING) or _data_reason() is not None,
    reason=f"not importable: {_MISSING} (pip install -r requirements-alfworld.txt)" if _MISSING else (_data_reason() or ""),
)


@pytest.fixture(scope="module")
def train_env():
    env = ALFWorldEnv(split="valid_train")
    yield env
    env.close()


def _task(env: ALFWorldEnv, folder: str) -> Task:
    return next(t for t in env.tasks() if f"/{folder}/" in t.task_id)


# -- construction and splits ------------------------------------------------------
def test_constructor_is_cheap_and_checks_split():
    env = ALFWorldEnv(split="valid_unseen", data_root="/nonexistent")  # nothing resolved yet
    assert env._game is None and env._root is None
    with pytest.raises(ValueError, match="split"):
        ALFWorldEnv(split="train")


def test_data_root_error_names_all_three_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "env-dir"))
    monkeypatch.setattr(alf, "_DEFAULT_DATA_ROOT", tmp_path / "default-dir")
    with pytest.raises(FileNotFoundError) as err:
        resolve_data_root()
    message = str(err.value)
    assert "data_root" in message and "ALFWORLD_DATA" in message
    assert str(tmp_path / "env-dir") in message and str(tmp_path / "default-dir") in message
    with pytest.raises(FileNotFoundError, match="explicit-dir"):
        ALFWorldEnv(data_root=str(tmp_path / "explicit-dir")).tasks()


def test_data_root_precedence(tmp_path, monkeypatch):
    tmp_path = tmp_path.resolve()
    for name in ("explicit", "env", "default"):
        (tmp_path / name / "json_2.1.1").mkdir(parents=True)
    monkeypatch.setattr(alf, "_DEFAULT_DATA_ROOT", tmp_path / "default")
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "env"))
    assert resolve_data_root(tmp_path / "explicit") == tmp_path / "explicit"
    assert resolve_data_root() == tmp_path / "env"
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "empty-cache"))  # what `import alfworld` sets
    assert resolve_data_root() == tmp_path / "default"


@needs_data
@pytest.mark.parametrize("split", list(SPLIT_SIZES))
def test_split_counts_and_families(split):
    tasks = ALFWorldEnv(split=split).tasks()
    assert len(tasks) == SPLIT_SIZES[split]
    assert Counter(t.info()["family"] for t in tasks) == FAMILY_COUNTS[split]
    ids = [t.task_id for t in tasks]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(i.startswith(f"json_2.1.1/{split}/") and i.endswith("/game.tw-pddl") for i in ids)


def test_family_balanced_stream_interleaves_families():
    tasks = [Task("alfworld", f"{fam}-{k}", meta=(("family", fam),)) for fam, n in (("a", 6), ("b", 3), ("c", 3))
             for k in range(n)]
    order = stream_order(tasks, seed=1, balance_by="family")
    assert sorted(t.task_id for t in order) == sorted(t.task_id for t in tasks)
    assert Counter(t.info()["family"] for t in order[:9]) == {"a": 3, "b": 3, "c": 3}
    assert order == stream_order(tasks, seed=1, balance_by="family")
    assert order != stream_order(tasks, seed=2, balance_by="family")


# -- playing ------------------------------------------------------------------------
@needs_engine
@pytest.mark.slow
def test_fresh_copy_of_a_live_episode_is_independent(train_env):
    """Batched evaluation and probes need copies of an env that is mid-episode (a TextWorld
    game cannot be deep-copied)."""
    from lit_ascent.envs.guarded import GuardedEnv

    task = _task(train_env, LOOK_GAME)
    train_env.reset(task)
    train_env.step(LOOK_SOLUTION[0])
    other = GuardedEnv(train_env).fresh().inner
    assert other is not train_env and other._game is None and other.tasks() == train_env.tasks()
    other.reset(task)
    assert [other.step(a).valid for a in LOOK_SOLUTION] == [True] * 4 and other.verify_at_end()
    assert train_env.step(LOOK_SOLUTION[1]).valid  # the original episode goes on where it was
    other.close()


@needs_engine
@pytest.mark.slow
def test_reset_and_hand_written_solution_is_verified(train_env):
    task = _task(train_env, LOOK_GAME)
    first = train_env.reset(task)
    assert first.startswith("You are in the middle of a room")
    assert "Welcome to TextWorld" not in first and "Your task is to: look at book under the desklamp." in first
    results = [train_env.step(a) for a in LOOK_SOLUTION]
    assert all(r.valid for r in results)
    assert [r.done for r in results] == [False, False, False, True]
    assert results[-1].verified and train_env.verify_at_end()


@needs_engine
@pytest.mark.slow
def test_nonsense_and_inadmissible_actions_are_invalid(train_env):
    train_env.reset(_task(train_env, LOOK_GAME))
    nonsense = train_env.step("dance with the fridge")
    assert not nonsense.valid and not nonsense.done and nonsense.observation == alf.NOTHING_HAPPENS
    far = train_env.step("take book 1 from bed 1")  # admissible only once at bed 1
    assert not far.valid and far.observation == alf.NOTHING_HAPPENS
    ok = train_env.step("Go to bed 1.")  # case and final period are normalised
    assert ok.valid and ok.info["command"] == "go to bed 1" and "bed 1" in ok.observation


@needs_engine
@pytest.mark.slow
def test_engine_exception_is_an_invalid_step(train_env, monkeypatch):
    train_env.reset(_task(train_env, LOOK_GAME))

    def boom(commands):
        raise RuntimeError("engine exploded")

    monkeypatch.setattr(train_env._game, "step", boom)
    result = train_env.step("go to bed 1")
    assert not result.valid and "engine exploded" in result.observation and "error" in result.info
    train_env.close()
    with pytest.raises(RuntimeError, match="reset"):
        train_env.step("look")


@needs_engine
@pytest.mark.slow
def test_list_admissible_appends_commands():
    env = ALFWorldEnv(split="valid_train", list_admissible=True)
    first = env.reset(_task(env, LOOK_GAME))
    assert "Admissible actions:" in first and "go to bed 1" in first
    assert set(env.admissible_commands) >= {"go to bed 1", "look", "inventory"}
    env.close()


@needs_engine
@pytest.mark.slow
def test_engine_leaves_argv_and_environment_alone(monkeypatch):
    import fast_downward

    sentinel = ["my-program", "--flag"]
    monkeypatch.setattr(sys, "argv", sentinel)
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)  # `import alfworld` would set it
    train_env = ALFWorldEnv(split="valid_train")
    train_env.reset(_task(train_env, LOOK_GAME))
    train_env.step("go to bed 1")
    train_env.expert_actions(_task(train_env, LOOK_GAME))
    train_env.close()
    assert sys.argv is sentinel and sys.argv == ["my-program", "--flag"]
    assert "ALFWORLD_DATA" not in os.environ
    game = json.loads(train_env.game_file(_task(train_env, LOOK_GAME)).read_text())
    with preserved_argv():  # the quirk the guard exists for
        fast_downward.pddl2sas(game["pddl_domain"], game["pddl_problem"])
        assert sys.argv != ["my-program", "--flag"]
    assert sys.argv is sentinel and sys.argv == ["my-program", "--flag"]


def test_system_prompt_is_react_and_compact():
    prompt = ALFWorldEnv().system_prompt()
    assert "Thought:" in prompt and "Action:" in prompt
    for command in ("go to", "take", "put", "in/on", "open", "close", "clean", "heat", "cool", "use", "examine",
                    "look", "inventory"):
        assert command in prompt
    assert parse_action("Thought: Found it.\nAction: take tomato 1 from countertop 1") == "take tomato 1 from countertop 1"
    assert 150 < len(prompt.split()) < 320  # roughly 250-350 tokens


# -- planner and demos ---------------------------------------------------------------
@needs_engine
@pytest.mark.slow
@pytest.mark.parametrize("family", alf.FAMILIES)
def test_planner_solves_one_game_per_family(train_env, family):
    task = next(t for t in train_env.tasks() if t.info()["family"] == family)
    actions = train_env.expert_actions(task)
    assert actions
    train_env.reset(task)
    results = [train_env.step(a) for a in actions]
    assert all(r.valid for r in results)
    assert results[-1].done and results[-1].verified


def _demos(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lit_ascent.warmstart.planner_cache", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


@needs_engine
@pytest.mark.slow
def test_demos_cli_writes_and_resumes(tmp_path):
    out = tmp_path / "demos.jsonl"
    first = _demos("--split", "valid_train", "--out", str(out), "--limit", "2")
    assert first.returncode == 0, first.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and all(r["won"] and r["actions"] for r in records)
    assert len(records[0]["observations"]) == len(records[0]["actions"]) + 1
    assert records[0]["family"] == "look_at_obj_in_light"
    again = _demos("--split", "valid_train", "--out", str(out), "--limit", "2")
    assert again.returncode == 0 and "wrote 0" in again.stderr
    assert len(out.read_text().splitlines()) == 2


@pytest.mark.parametrize("split", ["valid_seen", "valid_unseen"])
def test_demos_refuse_evaluation_splits(tmp_path, split, capsys):
    out = tmp_path / "x.jsonl"
    with pytest.raises(SystemExit) as exit_info:
        demos_main(["--split", split, "--out", str(out), "--limit", "1"])
    assert exit_info.value.code != 0
    stderr = capsys.readouterr().err
    assert "refused" in stderr and split in stderr
    with pytest.raises(ValueError, match="refused"):
        write_demos(out, split=split)
    assert not out.exists()


def test_load_done_drops_a_partial_last_line(tmp_path):
    out = tmp_path / "demos.jsonl"
    good = json.dumps({"game": "g1", "won": True})
    out.write_text(good + "\n" + '{"game": "g2", "act')
    assert load_done(out) == {"g1"}
    assert out.read_text() == good + "\n"
    out.write_text('{"game": "g0", "ac\n' + good + "\n")
    with pytest.raises(ValueError, match="corrupt"):
        load_done(out)
