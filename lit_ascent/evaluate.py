"""Evaluate the current policy on a fixed task set, frozen (no updates).

Episodes are independent, so ``evaluate`` can run ``batch_size`` of them at
once: one environment per episode, one left-padded batch KV cache, each row
stopping on its own (``BatchedDecoder``). In float32 the batched episodes equal
the sequential ones token for token (tests/test_batched_eval.py); in bfloat16
the batch's different matmul shapes round differently and a near-tie can pick
another token (docs/results/bench.md reports how often), so the default stays
sequential (batch_size=1).
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from lit_ascent.envs.base import TextEnv
from lit_ascent.engines.hf import growing_cache
from lit_ascent.rollout import EpisodeRun, RolloutConfig, rollout, skip_zero_adapter
from lit_ascent.trajectory import Episode, Task

log = logging.getLogger(__name__)


def evaluate(policy, env: TextEnv, tasks: list[Task], cfg: RolloutConfig,
             contexts: list[str | None] | None = None, *, batch_size: int = 1,
             env_factory: Callable[[], TextEnv] | None = None,
             on_group: Callable[[list[Episode]], None] | None = None) -> list[Episode]:
    """Greedy episodes of ``tasks`` with the weights as they are; the adapter is not touched.

    Args:
        contexts: ``contexts[i]`` is extra system text for task i (privileged information for probes).
        batch_size: episodes decoded together (1: one after the other on ``env``).
        env_factory: builds a fresh environment per batched episode (default: ``env.fresh``).
        on_group: called with the episodes so far after each group of ``batch_size`` (e.g. to save them).
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
            for s in range(0, len(tasks), batch_size):
                chunk = list(zip(tasks[s:s + batch_size], contexts[s:s + batch_size]))
                if batch_size == 1:
                    (task, context), = chunk
                    episodes.append(rollout(policy.model, policy.tokenizer, env, task, cfg, context))
                else:
                    envs = [make_env() for _ in chunk]
                    try:
                        episodes += batched_rollouts(policy.model, policy.tokenizer, envs, chunk, cfg)
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


class BatchedDecoder:
    """Greedy decoding of B independent sequences over one batch KV cache.

    Rows share cache *slots*, not positions: every forward adds the same number
    of slots to all rows. A row with fewer ids to feed is left-padded, a row
    that already stopped gets a masked slot (a hole); position ids count each
    row's real tokens only, so every row computes what it would compute alone.
    """

    def __init__(self, model, stop_ids: set[int], rows: int, pad_id: int = 0):
        self.model, self.stop_ids, self.pad_id = model, stop_ids, pad_id
        self.cache = growing_cache()
        self.mask = torch.zeros((rows, 0), dtype=torch.long)  # (B, slots): 1 = a real token
        self.seen = [0] * rows
        self.unfed: list[list[int]] = [[] for _ in range(rows)]

    def extend(self, row: int, ids: list[int]) -> None:
        self.unfed[row].extend(ids)

    def keep(self, rows: list[int]) -> None:
        """Drop every row not in ``rows`` (finished episodes); the kept rows are renumbered 0..len-1."""
        index = torch.tensor(rows, dtype=torch.long)
        for layer in self.cache.layers:
            layer.batch_select_indices(index)
        self.mask = self.mask[index]
        self.seen = [self.seen[r] for r in rows]
        self.unfed = [self.unfed[r] for r in rows]

    @torch.no_grad()
    def _forward(self, feeds: list[list[int]]) -> torch.Tensor:
        """Feed ``feeds[i]`` to row i (left-padded to one width); (B, V) logits of each row's last slot."""
        width = max(len(f) for f in feeds)
        ids = torch.full((len(feeds), width), self.pad_id, dtype=torch.long)
        new_mask = torch.zeros_like(ids)
        pos = torch.tensor(self.seen, dtype=torch.long)[:, None].repeat(1, width)  # pads: any valid position
        for i, f in enumerate(feeds):
            if f:
                ids[i, width - len(f):] = torch.tensor(f)
                new_mask[i, width - len(f):] = 1
                pos[i, width - len(f):] = torch.arange(self.seen[i], self.seen[i] + len(f))
                self.seen[i] += len(f)
        self.mask = torch.cat([self.mask, new_mask], dim=1)
        slots = self.mask.shape[1]
        device = self.model.device
        out = self.model(input_ids=ids.to(device), attention_mask=self.mask.to(device),
                         position_ids=pos.to(device), past_key_values=self.cache, use_cache=True,
                         cache_position=torch.arange(slots - width, slots, device=device), logits_to_keep=1)
        return out.logits[:, -1]

    def generate(self, budgets: list[int], should_stop: list) -> list[tuple[list[int], bool]]:
        """Per row: greedy tokens until a stop id (closed=True), ``should_stop[i]`` or ``budgets[i]``."""
        rows = len(budgets)
        outs: list[list[int]] = [[] for _ in range(rows)]
        closed, live = [False] * rows, [b > 0 for b in budgets]
        pending, self.unfed = self.unfed, [[] for _ in range(rows)]
        while any(live):
            tokens = self._forward([p if on else [] for p, on in zip(pending, live)]).argmax(-1).tolist()
            for i in range(rows):
                if not live[i]:
                    continue
                outs[i].append(tokens[i])
                pending[i] = [tokens[i]]
                if tokens[i] in self.stop_ids:
                    closed[i], live[i] = True, False
                elif (should_stop[i] is not None and should_stop[i](outs[i])) or len(outs[i]) >= budgets[i]:
                    live[i] = False
        self.unfed = pending  # each row's last token is fed with its next observation
        return list(zip(outs, closed))


def batched_rollouts(model, tokenizer, envs: list[TextEnv], jobs: list[tuple[Task, str | None]],
                     cfg: RolloutConfig) -> list[Episode]:
    """The episodes of ``jobs`` ((task, context) pairs), env i for job i, decoded as one batch.

    Each episode follows exactly the sequential ``rollout`` logic (``EpisodeRun``);
    a finished episode leaves the batch at the next turn boundary.
    """
    runs = [EpisodeRun(tokenizer, env, task, cfg, context) for env, (task, context) in zip(envs, jobs)]
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


def outcome_rates(episodes: list[Episode]) -> dict[str, float]:
    """success_rate, mean turns and invalid-action rate of a set of episodes."""
    return record_rates([{"verified": e.verified, "turns": len(e.turns), "invalid": e.num_invalid} for e in episodes])


def record_rates(records: list[dict]) -> dict[str, float]:
    """``outcome_rates`` of episode records (``Episode.summary()``'s verified, turns, invalid)."""
    n = max(len(records), 1)
    turns = sum(r["turns"] for r in records)
    return {
        "success_rate": sum(r["verified"] for r in records) / n,
        "turns": turns / n,
        "invalid_rate": sum(r["invalid"] for r in records) / max(turns, 1),
    }
