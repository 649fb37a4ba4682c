"""Evaluate the current policy on a fixed task set, frozen (no updates).

Episodes are independent, so ``evaluate`` can run ``batch_size`` of them at
once, one environment per episode; the episodes themselves follow the
sequential ``EpisodeRun`` logic. An engine with a continuous batch
(``Engine.rows``: the fused engine) keeps ``batch_size`` episodes in flight,
each on its own cache, a finished one replaced by the next task at once
(``continuous_rollouts``); the others decode groups of ``batch_size`` episodes
over one left-padded transformers KV cache, each row stopping on its own
(``lit_ascent.engines.hf.BatchedDecoder``, ``batched_rollouts``).
In float32 the batched episodes equal the sequential ones token for token
(tests/test_batched_eval.py); in bfloat16 the batch's different matmul shapes
round differently and a near-tie can pick another token (docs/results/bench.md
reports how often), so the default stays sequential (batch_size=1).
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from lit_ascent.engines.base import RowDecoder, take_tokens
from lit_ascent.engines.hf import BatchedDecoder
from lit_ascent.envs.base import TextEnv
from lit_ascent.memory import Memory
from lit_ascent.models import cpu_threads, skip_zero_adapter
from lit_ascent.rollout import EpisodeRun, RolloutConfig, rollout, rollout_engine
from lit_ascent.trajectory import Episode, Task

log = logging.getLogger(__name__)


def evaluate(policy, env: TextEnv, tasks: list[Task], cfg: RolloutConfig,
             contexts: list[str | None] | None = None, *, batch_size: int = 1,
             env_factory: Callable[[], TextEnv] | None = None,
             on_group: Callable[[list[Episode]], None] | None = None,
             memory: Memory | None = None) -> list[Episode]:
    """Greedy episodes of ``tasks`` with the weights as they are; the adapter is not touched.

    Args:
        contexts: ``contexts[i]`` is extra system text for task i (privileged information for probes).
        batch_size: episodes decoded together (1: one after the other on ``env``).
        env_factory: builds a fresh environment per batched episode (default: ``env.fresh``).
        on_group: called with the episodes so far, in task order, whenever that prefix grows by a group of
            ``batch_size`` or more (e.g. to save them).
        memory: an in-context memory shown to every episode, read only (``lit_ascent.memory``).
    """
    if batch_size < 1:
        raise ValueError(f"evaluate: batch_size must be >= 1, got {batch_size}")
    contexts = contexts or [None] * len(tasks)
    if len(contexts) != len(tasks):
        raise ValueError(f"evaluate: {len(contexts)} contexts for {len(tasks)} tasks")
    was_training = policy.model.training
    policy.model.eval()
    episodes: list[Episode] = []
    try:
        with torch.no_grad():
            make_env = env_factory or env.fresh
            rows = rollout_engine(cfg, policy.model).rows(batch_size) if batch_size > 1 else None
            if rows is not None:
                def done(so_far: list[Episode]) -> None:
                    log.info("evaluate: %d/%d episodes, %d verified", len(so_far), len(tasks),
                             sum(e.verified for e in so_far))
                    if on_group is not None:
                        on_group(so_far)
                with cpu_threads(cfg.decode_threads, policy.model):
                    return continuous_rollouts(rows, policy.tokenizer, make_env, list(zip(tasks, contexts)), cfg,
                                               memory, on_prefix=done)
            for s in range(0, len(tasks), batch_size):
                chunk = list(zip(tasks[s:s + batch_size], contexts[s:s + batch_size]))
                if batch_size == 1:
                    (task, context), = chunk
                    episodes.append(rollout(policy.model, policy.tokenizer, env, task, cfg, context, memory=memory))
                else:
                    envs = [make_env() for _ in chunk]
                    try:
                        episodes += batched_rollouts(policy.model, policy.tokenizer, envs, chunk, cfg, memory)
                    finally:
                        for e in envs:
                            e.close()
                log.info("evaluate: %d/%d episodes, %d verified", len(episodes), len(tasks),
                         sum(e.verified for e in episodes))
                if on_group is not None:
                    on_group(episodes)
            return episodes
    finally:
        policy.model.train(was_training)


def batched_rollouts(model, tokenizer, envs: list[TextEnv], jobs: list[tuple[Task, str | None]],
                     cfg: RolloutConfig, memory: Memory | None = None) -> list[Episode]:
    """The episodes of ``jobs`` ((task, context) pairs), env i for job i, decoded as one batch.

    Each episode follows exactly the sequential ``rollout`` logic (``EpisodeRun``);
    a finished episode leaves the batch at the next turn boundary.
    """
    runs = [EpisodeRun(tokenizer, env, task, cfg, context, memory) for env, (task, context) in zip(envs, jobs)]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    decoder = BatchedDecoder(model, runs[0].stop_ids, len(runs), pad)
    for row, run in enumerate(runs):
        decoder.extend(row, run.prompt)
    active = list(range(len(runs)))  # batch row -> run index
    with skip_zero_adapter(model):
        while active:
            budgets = [runs[k].budget() for k in active]
            alive = [row for row, b in enumerate(budgets) if b > 0]
            if len(alive) < len(active):
                for row in set(range(len(active))) - set(alive):
                    runs[active[row]].finish()
                decoder.keep(alive)
                active, budgets = [active[r] for r in alive], [budgets[r] for r in alive]
            if not active:
                break
            results = decoder.generate(budgets, [runs[k].should_stop for k in active])
            for row, (k, (gen, closed)) in enumerate(zip(active, results)):
                obs = runs[k].end_turn(gen, closed)
                if obs is not None:
                    decoder.extend(row, obs)
    return [run.ep for run in runs]


@dataclass
class _InFlight:
    """One row's episode: its place in the job list, its run and environment, the current turn's tokens."""

    index: int
    run: EpisodeRun
    env: TextEnv
    budget: int
    out: list[int] = field(default_factory=list)


def continuous_rollouts(rows: RowDecoder, tokenizer, make_env: Callable[[], TextEnv],
                        jobs: list[tuple[Task, str | None]], cfg: RolloutConfig, memory: Memory | None = None,
                        on_prefix: Callable[[list[Episode]], None] | None = None) -> list[Episode]:
    """The episodes of ``jobs`` ((task, context) pairs), as many in flight as ``rows`` has rows.

    Each episode follows exactly the sequential ``rollout`` logic (``EpisodeRun``) on an environment of
    its own from ``make_env`` (closed when it ends); when one ends, the next job starts in its row at
    the next step. ``on_prefix`` gets the finished episodes in job order each time that prefix has
    grown by at least as many episodes as there are rows (and once at the end).
    """
    width = rows.size
    queue = deque(enumerate(jobs))
    episodes: list[Episode | None] = [None] * len(jobs)
    live: dict[int, _InFlight] = {}
    reported = 0

    def finish(item: _InFlight) -> None:
        episodes[item.index] = item.run.finish()
        item.env.close()

    def fill(row: int) -> None:
        while queue:
            index, (task, context) = queue.popleft()
            env = make_env()
            run = EpisodeRun(tokenizer, env, task, cfg, context, memory)
            item = _InFlight(index, run, env, run.budget())
            if item.budget > 0:
                rows.start(row, run.prompt)
                live[row] = item
                return
            finish(item)  # nothing to decode (e.g. a failed reset)
        rows.release(row)

    def report(final: bool = False) -> None:
        nonlocal reported
        done = next((k for k, e in enumerate(episodes) if e is None), len(episodes))
        if on_prefix is not None and (done - reported >= width or (final and done > reported)):
            on_prefix(episodes[:done])
            reported = done

    for row in range(width):
        fill(row)
    while live:
        limits = {row: item.budget - len(item.out) for row, item in live.items()}
        for row, tokens in rows.step(limits).items():
            item = live[row]
            used, over, closed = take_tokens(tokens, item.out, item.run.stop_ids, item.run.should_stop, item.budget)
            if not over:
                continue
            rows.accept(row, used)
            obs = item.run.end_turn(item.out, closed)
            item.budget, item.out = (item.run.budget() if obs is not None else 0), []
            if item.budget > 0:
                rows.extend(row, obs)  # fed after the turn's last token
                continue
            del live[row]
            finish(item)
            fill(row)
            report()
    report(final=True)
    return episodes
