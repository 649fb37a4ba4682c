"""Replay given assistant turns through an environment into an Episode.

The token layout is exactly the rollout's (same prompt, same observation
wrapping), so a replayed expert or scripted trajectory can be distilled,
imitated or shown as privileged information like a generated one.
"""
from __future__ import annotations

from lit_ascent.envs.base import TextEnv, parse_action
from lit_ascent.rollout import _append, chat_prompt_ids, observation_ids, observation_template, safe_step
from lit_ascent.trajectory import ROLE_ASSISTANT, ROLE_OBSERVATION, ROLE_PROMPT, Episode, Task, Turn


def replay(tokenizer, env: TextEnv, task: Task, texts: list[str], context: str | None = None) -> Episode:
    """An Episode whose assistant turns are ``texts`` (each ends with the end-of-turn token)."""
    system, first_obs = env.system_prompt(), env.reset(task)
    if context:
        system = f"{system}\n\n{context}"
    ep = Episode(task=task, system=system, first_observation=first_obs)
    prompt = chat_prompt_ids(tokenizer, system, first_obs)
    _append(ep, prompt, ROLE_PROMPT, -1)
    ep.prompt_len = len(prompt)
    template = observation_template(tokenizer)
    for t, text in enumerate(texts):
        gen = tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        start = len(ep.token_ids)
        _append(ep, gen, ROLE_ASSISTANT, t)
        action = parse_action(text)
        result, error = safe_step(env, action)
        ep.turns.append(Turn(t, text, action, result.observation, result.valid, (start, len(ep.token_ids))))
        ep.error = error
        if result.done:
            ep.verified = bool(result.verified) and error is None
            return ep
        if t < len(texts) - 1:
            _append(ep, observation_ids(tokenizer, result.observation, True, template), ROLE_OBSERVATION, t)
    ep.verified = bool(env.verify_at_end())
    return ep
