"""One episode: multi-turn ReAct with greedy decoding and a KV cache kept across turns.

The episode is one append-only token sequence (its chat rendering:
``lit_ascent.chat``). Each turn pre-fills only the tokens the cache has not
seen (the previous stop token and the new observation), never the whole
history again. The bookkeeping of an episode (``EpisodeRun``: prompt, turn
budget, env steps, roles) is separate from the decoding, so the batched
evaluation (``lit_ascent.evaluate``) runs the very same episode logic over a
shared batch cache. How the tokens are generated is the engine's business
(``lit_ascent.engines``, ``RolloutConfig.engine``).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from lit_ascent.chat import chat_prompt_ids, observation_ids, observation_template
from lit_ascent.engines.base import ENGINES, engine_for
from lit_ascent.engines.fused import FusedSettings
from lit_ascent.engines.vllm import VLLMSettings
from lit_ascent.envs.base import StepResult, TextEnv, parse_action
from lit_ascent.memory import Memory
from lit_ascent.models import cpu_threads, skip_zero_adapter
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
    decode_threads: int = 1
    """CPU threads while decoding (0: torch's default). One row per step is overhead-bound:
    on the 2-core reference machine 1 thread decodes ~3x faster than 2."""
    engine: str = "hf"
    """How tokens are generated (``lit_ascent.engines``): hf (transformers' forward, exact; the reference),
    fused (Llama-family CPU decoder with the LoRA folded in; same greedy tokens in float32, faster),
    vllm (a vLLM server in its own environment; ``make install-vllm``)."""
    fused: FusedSettings = field(default_factory=FusedSettings)
    """Settings of the fused engine (unused by the others)."""
    vllm: VLLMSettings = field(default_factory=VLLMSettings)
    """Settings of the vllm engine (unused by the others)."""

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"rollout.engine must be one of {sorted(ENGINES)}, got {self.engine!r}")
        if self.engine == "vllm":
            self.vllm.check_installed()
        if self.decode_threads < 0:
            raise ValueError(f"rollout.decode_threads must be >= 0, got {self.decode_threads}")
        for name in ("max_turns", "max_new_tokens", "max_context_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"rollout.{name} must be > 0, got {getattr(self, name)}")


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


def safe_reset(env: TextEnv, task: Task) -> tuple[str, str | None]:
    """(first observation, None), or (an error notice, the error) when ``reset`` raised: the episode
    then ends before its first turn (the model never acts against an error text)."""
    try:
        return env.reset(task), None
    except Exception as err:  # the stream must survive one bad episode
        log.warning("environment error on reset of task %s: %s", task.task_id, err)
        return f"Environment error: {err}", repr(err)


class EpisodeRun:
    """The bookkeeping of one episode, whatever decodes its tokens.

    Protocol: feed ``prompt`` to a decoder; while ``budget()`` > 0, decode at most
    that many tokens (stopping at ``stop_ids`` or ``should_stop``), pass them to
    ``end_turn``, which steps the env and returns the observation ids to feed
    next (None when the episode is over); finally ``finish()``. A failed ``reset``
    gives an episode with ``error`` set and no turns (``budget()`` is 0 from the start).
    """

    def __init__(self, tokenizer, env: TextEnv, task: Task, cfg: RolloutConfig, context: str | None = None,
                 memory: Memory | None = None):
        self.t0 = time.perf_counter()
        self.tokenizer, self.env, self.cfg = tokenizer, env, cfg
        system = env.system_prompt()
        first_obs, error = safe_reset(env, task)
        if context:
            system = f"{system}\n\n{context}"
        self.ep = Episode(task=task, system=system, first_observation=first_obs, error=error)
        self.prompt = chat_prompt_ids(tokenizer, system, first_obs)
        if memory is not None and memory.active and error is None:
            self._show_memory(memory)
        _append(self.ep, self.prompt, ROLE_PROMPT, -1)
        self.ep.prompt_len = len(self.prompt)
        self.template = observation_template(tokenizer)
        self.stop_ids = {tokenizer.eos_token_id} - {None}
        self.should_stop = _action_line_done(tokenizer) if cfg.stop_after_action else None
        self.gen_tokens, self.ended, self.over = 0, False, error is not None
        self.env_s = time.perf_counter() - self.t0  # reset (and prompt rendering) so far

    def _show_memory(self, memory: Memory) -> None:
        """Put the memory's block after the system text: in the room the context leaves for one full turn."""
        ep = self.ep
        room = self.cfg.max_context_tokens - len(self.prompt) - self.cfg.max_new_tokens
        view = memory.render(self.tokenizer, self.env, ep.task, ep.first_observation, max(room, 0))
        ep.memory = view.as_dict()
        if view.text:
            self.prompt = chat_prompt_ids(self.tokenizer, f"{ep.system}\n\n{view.text}", ep.first_observation)

    def budget(self) -> int:
        """Tokens the next turn may generate; 0 when the episode is over."""
        if self.over or len(self.ep.turns) >= self.cfg.max_turns:
            return 0
        budget = min(self.cfg.max_new_tokens, self.cfg.max_context_tokens - len(self.ep.token_ids))
        if budget <= 0:
            log.info("task %s: context budget of %d tokens exhausted", self.ep.task.task_id,
                     self.cfg.max_context_tokens)
            return 0
        return budget

    def end_turn(self, gen: list[int], closed: bool) -> list[int] | None:
        """Record the turn, step the env; the observation ids to feed, or None when the episode ended."""
        ep, t = self.ep, len(self.ep.turns)
        self.gen_tokens += len(gen)
        start = len(ep.token_ids)
        _append(ep, gen, ROLE_ASSISTANT, t)
        text = self.tokenizer.decode(gen, skip_special_tokens=True)
        action = parse_action(text)
        t0 = time.perf_counter()
        result, error = safe_step(self.env, action)
        self.env_s += time.perf_counter() - t0
        ep.turns.append(Turn(t, text, action, result.observation, result.valid, (start, len(ep.token_ids))))
        if error:
            ep.error = error
        if result.done:
            ep.verified, self.ended, self.over = bool(result.verified) and error is None, True, True
            ep.score = result.info.get("score")
            return None
        if len(ep.turns) >= self.cfg.max_turns:
            self.over = True
            return None  # budget spent: no observation to show to a model that will not act again
        obs = observation_ids(self.tokenizer, result.observation, closed, self.template)
        _append(ep, obs, ROLE_OBSERVATION, t)
        return obs

    def finish(self) -> Episode:
        """The finished episode (verdict at the end of the budget if the env did not end it)."""
        self.over = True
        ep = self.ep
        if not self.ended and ep.error is None:
            ep.verified = bool(self.env.verify_at_end())
        dt = time.perf_counter() - self.t0
        model_s = max(dt - self.env_s, 1e-9)
        ep.timings.update(rollout_s=dt, env_s=self.env_s, model_s=model_s, generated_tokens=self.gen_tokens,
                          tokens_per_s=self.gen_tokens / model_s)
        return ep


def rollout_engine(cfg: RolloutConfig, model):
    """The engine ``cfg`` chooses for ``model`` (built on first use, with its settings)."""
    return engine_for(cfg.engine, model, getattr(cfg, cfg.engine, None))


def rollout(model, tokenizer, env: TextEnv, task: Task, cfg: RolloutConfig, context: str | None = None,
            *, memory: Memory | None = None, decoder_factory=None) -> Episode:
    """Run one greedy ReAct episode of ``task`` with ``model`` as it is now.

    ``context`` (e.g. privileged information for a PI-conditioned probe) is
    appended to the system message at the same point the teacher's PI goes;
    ``memory``'s block (``lit_ascent.memory``) after it, for the student only.
    The decoder comes from ``cfg.engine``; ``decoder_factory(model, stop_ids)``
    overrides it (tests swap in a reference that recomputes the whole sequence).
    """
    run = EpisodeRun(tokenizer, env, task, cfg, context, memory)
    engine = None if decoder_factory else rollout_engine(cfg, model)
    perf_before = dict(engine.perf) if engine else {}
    with cpu_threads(cfg.decode_threads, model), skip_zero_adapter(model):
        decoder = decoder_factory(model, run.stop_ids) if decoder_factory else engine.decoder(run.stop_ids)
        decoder.extend(run.prompt)
        while (budget := run.budget()) > 0:
            obs = run.end_turn(*decoder.generate(budget, run.should_stop))
            if obs is None:
                break
            decoder.extend(obs)
    ep = run.finish()
    if engine:
        ep.timings.update({f"engine_{k}": v - perf_before.get(k, 0.0) for k, v in engine.perf.items()
                           if v != perf_before.get(k, 0.0)})
    return ep


def _append(ep: Episode, ids: list[int], role: int, turn: int) -> None:
    ep.token_ids.extend(ids)
    ep.roles.extend([role] * len(ids))
    ep.turn_ids.extend([turn] * len(ids))
