"""In-context memory: retrieval ranking and determinism, the token cap and the context room, the
teacher never sees the memory, the playbook writers are bounded and logged, and a killed stream
with a non-empty memory resumes exactly."""
from __future__ import annotations

import inspect
import logging
import math
import signal

import pytest
import torch
from conftest import hand_episode
from test_resume import fit_forked, outcomes

from callbacks.stream_checkpoint import load_state
from lit_ascent.envs import ScriptedEnv, Task
from lit_ascent.memory import NoMemory, Playbook, ProceduralMemory, fit, reflect, rule_lessons
from lit_ascent.privileged import teacher_sequence
from lit_ascent.rollout import RolloutConfig, rollout
from lit_ascent.tiny import byte_tokenizer
from lit_ascent.trajectory import episode_from_state, episode_state

TOK = byte_tokenizer()


class GoalEnv(ScriptedEnv):
    """A scripted env whose first observation is a goal given per task id (``goal: text``)."""

    def __init__(self, goals: dict[str, str]):
        super().__init__(num_tasks=len(goals), episode_steps=2, verify_every=1)
        self.goals = goals

    def tasks(self):
        return [Task(self.name, t, index=i) for i, t in enumerate(self.goals)]

    def reset(self, task):
        super().reset(Task(self.name, "task-0"))
        return f"Room.\nGoal: {self.goals[task.task_id]}"


def stored(memory: ProceduralMemory, env: GoalEnv, task_id: str, verified: bool = True, policy=None):
    ep = hand_episode(TOK, [f"Thought: ok\nAction: do {task_id}"], task_id=task_id,
                      first=env.reset(Task(env.name, task_id)), verified=verified)
    memory.observe(ep, env, policy)
    return ep


GOALS = {"a": "craft oak planks", "b": "craft stone axe", "c": "craft oak door", "d": "craft oak planks",
         "q": "craft oak fence"}


def test_procedural_ranks_by_bm25_ties_oldest_first_and_stores_only_verified():
    env, memory = GoalEnv(GOALS), ProceduralMemory(k=2, max_tokens=10_000)
    for task_id in "abcd":
        stored(memory, env, task_id)
    stored(memory, env, "q", verified=False)
    assert len(memory) == 4
    shown = memory.candidates(env, Task(env.name, "q"), env.reset(Task(env.name, "q")))
    # 'oak' is shared by a, c, d ('craft' by all, rarer terms weigh more): a and c/d score alike; oldest first
    assert [s.splitlines()[0] for s in shown] == ["Task: Goal: craft oak planks", "Task: Goal: craft oak door"]
    assert shown == memory.candidates(env, Task(env.name, "q"), env.reset(Task(env.name, "q")))  # deterministic
    assert shown[0].endswith("Step 1:\nThought: ok\nAction: do a")
    assert memory.candidates(env, Task(env.name, "z"), "Zebra stripes") == []  # no shared term: nothing shown


def test_coverage_is_the_share_of_the_query_idf_weight_a_text_holds():
    from lit_ascent.bm25 import BM25Index

    index = BM25Index(["0", "1", "2"], ["craft oak planks", "craft stone axe", "craft oak door"])

    def idf(df: int) -> float:  # Lucene's, N = 3
        return math.log(1 + (3 - df + 0.5) / (df + 0.5))

    total = idf(3) + idf(2) + idf(0)  # craft (every text), oak (two), fence (none)
    assert index.coverage("craft oak fence") == pytest.approx([(idf(3) + idf(2)) / total, idf(3) / total,
                                                               (idf(3) + idf(2)) / total])
    assert index.coverage("craft oak planks")[0] == pytest.approx(1.0)
    assert list(index.coverage("the of")) == [0.0, 0.0, 0.0]  # only stop words: no weight


def test_procedural_relevance_floor_shows_only_similar_episodes():
    env = GoalEnv(GOALS)
    first = env.reset(Task(env.name, "q"))
    memories = {floor: ProceduralMemory(k=2, max_tokens=10_000, min_overlap=floor) for floor in (0.0, 0.3, 0.9)}
    for memory in memories.values():
        for task_id in "ab":
            stored(memory, env, task_id)
    # q ('craft oak fence') shares 'goal', 'craft' and 'oak' with a (coverage 0.37), 'goal' and 'craft' with b (0.13)
    assert [len(memories[f].candidates(env, Task(env.name, "q"), first)) for f in (0.0, 0.3, 0.9)] == [2, 1, 0]
    assert memories[0.3].candidates(env, Task(env.name, "q"), first)[0].startswith("Task: Goal: craft oak planks")
    with pytest.raises(ValueError, match="min_overlap"):
        ProceduralMemory(min_overlap=1.5)


def test_procedural_keeps_the_newest_entries():
    env, memory = GoalEnv(GOALS), ProceduralMemory(k=4, max_entries=2)
    for task_id in "abc":
        stored(memory, env, task_id)
    assert [e["key"] for e in memory.entries] == ["Goal: craft stone axe", "Goal: craft oak door"]


def test_fit_caps_tokens_and_counts_the_cut():
    entries = ["x" * 30, "y" * 200, "z" * 30]
    view = fit(TOK, "H", entries, cap=70)
    assert view.text == "H\n" + "x" * 30 + "\n" + "z" * 30 and view.shown == 2 and view.cut == 1
    assert view.tokens == len(TOK(view.text, add_special_tokens=False).input_ids) <= 70
    assert fit(TOK, "H", entries, cap=5).text is None and fit(TOK, "H", entries, cap=5).cut == 3


def test_memory_is_shown_to_the_student_only(policy):
    env = GoalEnv(GOALS)
    memory = ProceduralMemory(k=1, max_tokens=10_000)
    stored(memory, env, "a")
    cfg = RolloutConfig(max_turns=2, max_new_tokens=4)
    with_memory = rollout(policy.model, policy.tokenizer, env, Task(env.name, "d"), cfg, memory=memory)
    without = rollout(policy.model, policy.tokenizer, env, Task(env.name, "d"), cfg)
    text = with_memory.memory["text"]
    assert text.startswith("Memory:") and with_memory.memory["shown"] == 1
    assert text in policy.tokenizer.decode(with_memory.token_ids[:with_memory.prompt_len])
    assert with_memory.system == without.system and with_memory.prompt_len > without.prompt_len
    # the teacher's prompt is system + PI block, the same with and without the memory; then the identical ids
    (ids_m, off_m), (ids_0, off_0) = (teacher_sequence(policy.tokenizer, e, "PI") for e in (with_memory, without))
    assert ids_m[:with_memory.prompt_len + off_m] == ids_0[:without.prompt_len + off_0]
    assert ids_m[with_memory.prompt_len + off_m:] == with_memory.token_ids[with_memory.prompt_len:]
    assert episode_from_state(episode_state(with_memory)).memory == with_memory.memory


def test_a_memory_larger_than_the_context_never_breaks_an_episode(policy):
    env = GoalEnv(GOALS)
    memory = ProceduralMemory(k=4, max_tokens=10_000)
    for task_id in "abcd":
        stored(memory, env, task_id)
    base = rollout(policy.model, policy.tokenizer, env, Task(env.name, "q"), RolloutConfig(max_turns=1, max_new_tokens=4))
    cfg = RolloutConfig(max_turns=2, max_new_tokens=4, max_context_tokens=base.prompt_len + 40)
    ep = rollout(policy.model, policy.tokenizer, env, Task(env.name, "q"), cfg, memory=memory)
    assert ep.error is None and len(ep.turns) >= 1 and ep.memory["cut"] >= 1
    assert ep.prompt_len + cfg.max_new_tokens <= cfg.max_context_tokens
    tight = RolloutConfig(max_turns=1, max_new_tokens=4, max_context_tokens=base.prompt_len + 2)
    ep = rollout(policy.model, policy.tokenizer, env, Task(env.name, "q"), tight, memory=memory)
    assert ep.memory["text"] is None and ep.memory["cut"] >= 1 and ep.prompt_len == base.prompt_len


def test_rule_lessons_quote_rejections_and_verified_actions():
    texts = ["Action: bad move", "Action: bad move", "Action: open door", "Action: bad kick", "Action: bad x"]
    ep = hand_episode(TOK, texts, valid=[False, False, True, False, False], observation=lambda t: f"No {t}.\nmore",
                      verified=True)
    assert rule_lessons(ep, "Goal: x") == ["'bad move' was rejected: No 0.", "'bad kick' was rejected: No 3.",
                                           "Goal: x was solved by: open door"]


def test_playbook_is_bounded_newest_first_and_logged(caplog, policy):
    env = GoalEnv(GOALS)
    book = Playbook(max_lessons=2, lesson_max_tokens=18)
    with caplog.at_level(logging.INFO, logger="lit_ascent.memory"):
        for task_id in "abc":
            ep = hand_episode(TOK, [f"Action: go {task_id}"], task_id=task_id, first=env.reset(Task(env.name, task_id)))
            book.observe(ep, env, policy)
    assert len(book) == 2 and all(len(TOK(x, add_special_tokens=False).input_ids) <= 18 for x in book.lessons)
    assert book.lessons == ["Goal: craft stone", "Goal: craft oak do"]  # each cut at 18 tokens (bytes), oldest dropped
    assert book.candidates(env, None, "")[0] == f"- {book.lessons[-1]}"
    assert sum("playbook lesson" in r.message for r in caplog.records) == 3
    state = book.state_dict()
    again = Playbook(max_lessons=2)
    again.load_state_dict(state)
    assert again.lessons == book.lessons


def test_model_writer_reflects_within_its_token_cap(policy):
    env = GoalEnv(GOALS)
    ep = hand_episode(policy.tokenizer, ["Action: go"], first=env.reset(Task(env.name, "a")))
    before = {n: p.clone() for n, p in policy.model.named_parameters()}
    lesson = reflect(policy, ep, max_tokens=6)
    assert isinstance(lesson, str) and len(policy.tokenizer(lesson, add_special_tokens=False).input_ids) <= 8
    assert all(torch.equal(p, before[n]) for n, p in policy.model.named_parameters())
    book = Playbook(writer="model", lesson_max_tokens=6)
    book.observe(ep, env, policy)
    assert len(book) <= 1


@pytest.mark.parametrize("cls,kwargs,match", [
    (ProceduralMemory, {"k": 0}, "k and max_entries"), (ProceduralMemory, {"match": "title"}, "match"),
    (ProceduralMemory, {"pi_content": "all"}, "pi_content"), (Playbook, {"writer": "llm"}, "writer"),
    (Playbook, {"max_lessons": 0}, "max_lessons"), (Playbook, {"max_tokens": 0}, "max_tokens"),
])
def test_bad_settings_name_the_option(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


def test_playback_refuses_a_memory(tmp_path):
    from lit_ascent.module import OaTTTModule
    from lit_ascent.playback import PlaybackConfig

    log = tmp_path / "x.jsonl"
    log.write_text("")
    with pytest.raises(ValueError, match="model.memory must be NoMemory with model.playback"):
        OaTTTModule(playback=PlaybackConfig(log=str(log)), memory=Playbook())


@pytest.mark.parametrize("memory", ["lit_ascent.memory.ProceduralMemory", "lit_ascent.memory.Playbook"])
def test_killed_stream_with_a_memory_resumes_exactly(runs, memory):
    root, cfg = runs
    name = memory.rsplit(".", 1)[1]
    common = ["--config", str(cfg), "--model.memory", memory, "--trainer.logger.init_args.name", name]
    assert fit_forked([*common, "--trainer.logger.init_args.version", "reference"]) == 0
    assert fit_forked([*common, "--trainer.logger.init_args.version", "run"], kill="4:start") == -signal.SIGKILL
    folder, ref = root / name / "run", root / name / "reference"
    assert any(load_state(folder / "stream_state.pt")["module"]["memory"].values())  # non-empty when killed
    assert fit_forked([*common, "--ckpt_path", str(folder)]) == 0
    got, want = outcomes(folder), outcomes(ref)
    assert got == want and any(r["memory/shown"] for r in got)
    assert load_state(folder / "stream_state.pt")["module"]["memory"] == \
        load_state(ref / "stream_state.pt")["module"]["memory"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from test_resume import CONFIG

    root = tmp_path_factory.mktemp("memory_resume")
    cfg = root / "config.yaml"
    cfg.write_text(CONFIG.replace("SAVE_DIR", str(root)))
    return root, cfg


def test_a_memory_chosen_on_the_command_line_keeps_its_own_defaults():
    """The default NoMemory has no settings that jsonargparse could carry over into the class a config picks
    (it once gave Playbook a max_tokens of 1024 in place of its own 512)."""
    from lit_ascent.cli import main

    cli = main(["--config", "configs/debug.yaml", "--model.memory", "lit_ascent.memory.Playbook"], run=False)
    assert isinstance(cli.model.memory, Playbook) and cli.model.memory.max_tokens == 512
    assert cli.model.memory.max_tokens == inspect.signature(Playbook).parameters["max_tokens"].default
