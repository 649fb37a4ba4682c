"""Rollout records: token roles, turn spans, invalid turns, observations."""
from __future__ import annotations

from lit_ascent.chat import observation_template
from lit_ascent.envs import ScriptedEnv, parse_action
from lit_ascent.envs.base import StepResult, TextEnv
from lit_ascent.rollout import NO_ACTION, RolloutConfig, rollout
from lit_ascent.trajectory import ROLE_ASSISTANT, ROLE_OBSERVATION, Task


def test_parse_action():
    assert parse_action("Thought: x\nAction: get 1 stick\n") == "get 1 stick"
    assert parse_action("Action: a\nthen\naction: b") == "b"
    assert parse_action("no action here") is None
    assert parse_action("Action:   ") is None


def test_episode_is_append_only_with_roles_and_spans(policy):
    env = ScriptedEnv(num_tasks=2, episode_steps=3, verify_every=1)
    ep = rollout(policy.model, policy.tokenizer, env, env.tasks()[0], RolloutConfig(max_turns=3, max_new_tokens=5))
    assert len(ep.token_ids) == len(ep.roles) == len(ep.turn_ids)
    assert ep.roles[: ep.prompt_len] == [0] * ep.prompt_len
    assert len(ep.turns) == 3
    for t in ep.turns:
        s, e = t.span
        assert set(ep.roles[s:e]) == {ROLE_ASSISTANT} and set(ep.turn_ids[s:e]) == {t.index}
        assert e - s <= 5  # cut at the turn budget
        # the random model writes no action: an invalid turn, counted, and the episode goes on
        assert t.action is None and not t.valid and t.observation == NO_ACTION
    assert ep.num_invalid == 3 and ep.verified  # scripted verdict at the end of the budget
    obs_text = policy.tokenizer.decode([i for i, r in zip(ep.token_ids, ep.roles) if r == ROLE_OBSERVATION])
    assert obs_text.count(NO_ACTION) == 2  # no observation after the last turn


def test_observation_template_wraps_user_turn(policy):
    eot, before, after = observation_template(policy.tokenizer)
    assert eot == "<|im_end|>" and before.startswith(eot) and "user" in before and "assistant" in after


class Exploding(TextEnv):
    name = "boom"

    def tasks(self):
        return [Task(self.name, "x")]

    def reset(self, task):
        return "go"

    def step(self, action):
        raise RuntimeError("engine died")


def test_env_exception_ends_episode_as_failed(policy, monkeypatch):
    import lit_ascent.rollout as r

    monkeypatch.setattr(r, "parse_action", lambda text: "act")
    ep = rollout(policy.model, policy.tokenizer, Exploding(), Task("boom", "x"), RolloutConfig(max_turns=4, max_new_tokens=3))
    assert not ep.verified and "engine died" in ep.error and len(ep.turns) == 1


def test_verified_step_ends_episode(policy, monkeypatch):
    import lit_ascent.rollout as r

    class Win(Exploding):
        def step(self, action):
            return StepResult("done", done=True, verified=True)

    monkeypatch.setattr(r, "parse_action", lambda text: "act")
    ep = rollout(policy.model, policy.tokenizer, Win(), Task("boom", "x"), RolloutConfig(max_turns=4, max_new_tokens=3))
    assert ep.verified and len(ep.turns) == 1 and ep.turns[0].valid
