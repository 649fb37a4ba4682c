"""One episode: multi-turn ReAct with greedy decoding and a KV cache kept across turns.

The episode is one append-only token sequence. Each turn pre-fills only the
tokens the cache has not seen (the previous stop token and the new
observation), never the whole history again.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from lit_ascent.envs.base import StepResult, TextEnv, parse_action
from lit_ascent.trajectory import ROLE_ASSISTANT, ROLE_OBSERVATION, ROLE_PROMPT, Episode, Task, Turn

log = logging.getLogger(__name__)

NO_ACTION = "No action found. End your reply with one line 'Action: <action>'."


@dataclass
class RolloutConfig:
    """Settings of one episode."""

    max_turns: int = 30
    """Turn budget per episode (50 in the papers' ALFWorld runs)."""
    max_new_tokens: int = 96
    """Token budget of one assistant turn; longer output is cut there."""
    max_context_tokens: int = 8192
    """The episode ends (unverified) when its token sequence would exceed this."""
    stop_after_action: bool = True
    """End the turn at the newline after the 'Action:' line (saves decoding)."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_context_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"rollout.{name} must be > 0, got {getattr(self, name)}")


def chat_prompt_ids(tokenizer, system: str, user: str) -> list[int]:
    """Token ids of [system, user] rendered with the chat template, ready for the assistant."""
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False).input_ids


def observation_template(tokenizer) -> tuple[str, str, str]:
    """(end_of_turn, before, after): the text the chat template puts around a user reply.

    Found by rendering a conversation with marker strings, so any chat template works.
    """
    a, o = "\u00a7A\u00a7", "\u00a7O\u00a7"
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": a}, {"role": "user", "content": o}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    between = text.split(a, 1)[1]
    before, after = between.split(o, 1)
    eot = tokenizer.eos_token or ""
    return eot, before, after


def observation_ids(tokenizer, observation: str, turn_closed: bool, template) -> list[int]:
    """Ids appended after an assistant turn: end of turn (if not generated), the reply, next header."""
    eot, before, after = template
    if turn_closed and eot and before.startswith(eot):
        before = before[len(eot):]
    return tokenizer(before + observation + after, add_special_tokens=False).input_ids


class IncrementalDecoder:
    """Greedy decoding over a KV cache that persists across turns.

    ``unfed`` holds ids appended to the sequence but not yet run through the
    model; every ``generate`` call pre-fills exactly those, then decodes.
    """

    def __init__(self, model, stop_ids: set[int]):
        from transformers import DynamicCache

        self.model, self.stop_ids = model, stop_ids
        self.cache = DynamicCache()
        self.unfed: list[int] = []
        self.seen = 0

    def extend(self, ids: list[int]) -> None:
        self.unfed.extend(ids)

    @torch.no_grad()
    def _feed(self) -> torch.Tensor:
        ids = torch.tensor([self.unfed], device=self.model.device)
        pos = torch.arange(self.seen, self.seen + ids.shape[1], device=ids.device)
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True,
                         cache_position=pos, logits_to_keep=1)
        self.seen += ids.shape[1]
        self.unfed = []
        return out.logits[0, -1]

    def generate(self, max_new_tokens: int, should_stop=None) -> tuple[list[int], bool]:
        """Greedy tokens until a stop id (included, returns closed=True) or the budget."""
        out: list[int] = []
        for _ in range(max_new_tokens):
            token = int(self._feed().argmax())
            out.append(token)
            self.unfed = [token]
            if token in self.stop_ids:
                return out, True
            if should_stop is not None and should_stop(out):
                break
        return out, False


def _action_line_done(tokenizer):
    def check(out: list[int]) -> bool:
        if "\n" not in tokenizer.decode(out[-1:]):
            return False
        return parse_action(tokenizer.decode(out)) is not None
    return check


def safe_step(env: TextEnv, action: str | None) -> tuple[StepResult, str | None]:
    """Step the env; an unparsed action is an invalid turn, an env exception ends the episode."""
    if action is None:
        return StepResult(NO_ACTION, valid=False, info={"no_action": True}), None
    try:
        return env.step(action), None
    except Exception as err:  # the stream must survive one bad episode
        log.warning("environment error on %r: %s", action, err)
        return StepResult(f"Environment error: {err}", done=True, valid=False), repr(err)


def rollout(model, tokenizer, env: TextEnv, task: Task, cfg: RolloutConfig, context: str | None = None) -> Episode:
    """Run one greedy ReAct episode of ``task`` with ``model`` as it is now.

    ``context`` (e.g. privileged information for a PI-conditioned probe) is
    appended to the system message at the same point the teacher's PI goes.
    """
    t0 = time.perf_counter()
    system, first_obs = env.system_prompt(), env.reset(task)
    if context:
        system = f"{system}\n\n{context}"
    ep = Episode(task=task, system=system, first_observation=first_obs)
    prompt = chat_prompt_ids(tokenizer, system, first_obs)
    _append(ep, prompt, ROLE_PROMPT, -1)
    ep.prompt_len = len(prompt)
    template = observation_template(tokenizer)
    stop = {tokenizer.eos_token_id} - {None}
    decoder = IncrementalDecoder(model, stop)
    decoder.extend(prompt)
    should_stop = _action_line_done(tokenizer) if cfg.stop_after_action else None
    gen_tokens = 0
    ended = False
    for t in range(cfg.max_turns):
        budget = min(cfg.max_new_tokens, cfg.max_context_tokens - len(ep.token_ids))
        if budget <= 0:
            log.info("task %s: context budget of %d tokens exhausted", task.task_id, cfg.max_context_tokens)
            break
        gen, closed = decoder.generate(budget, should_stop)
        gen_tokens += len(gen)
        start = len(ep.token_ids)
        _append(ep, gen, ROLE_ASSISTANT, t)
        text = tokenizer.decode(gen, skip_special_tokens=True)
        action = parse_action(text)
        result, error = safe_step(env, action)
        ep.turns.append(Turn(t, text, action, result.observation, result.valid, (start, len(ep.token_ids))))
        if error:
            ep.error = error
        if result.done:
            ep.verified, ended = bool(result.verified) and error is None, True
            break
        if t == cfg.max_turns - 1:
            break  # budget spent: no observation to show to a model that will not act again
        obs = observation_ids(tokenizer, result.observation, closed, template)
        _append(ep, obs, ROLE_OBSERVATION, t)
        decoder.extend(obs)
    if not ended and ep.error is None:
        ep.verified = bool(env.verify_at_end())
    dt = time.perf_counter() - t0
    ep.timings.update(rollout_s=dt, generated_tokens=gen_tokens, tokens_per_s=gen_tokens / max(dt, 1e-9))
    return ep


def _append(ep: Episode, ids: list[int], role: int, turn: int) -> None:
    ep.token_ids.extend(ids)
    ep.roles.extend([role] * len(ids))
    ep.turn_ids.extend([turn] * len(ids))
