"""The reference engine: transformers' own forward, one token at a time, over a KV cache kept across turns.

Each turn pre-fills only the tokens the cache has not seen (the previous stop
token and the new observation), never the whole history again. Exact for any
causal LM transformers loads; the other engines are tested against it.
``BatchedDecoder`` is the same decoding for B independent episodes over one
batch cache (the batched evaluation, ``lit_ascent.evaluate``).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from lit_ascent.engines.base import Engine, GreedyDecoder, turn_over


class GrowingLayer(DynamicLayer):
    """A cache layer whose keys/values live in a buffer of doubling capacity.

    DynamicLayer concatenates on every step, copying the whole cache for each
    new token (O(T) per token); this writes new entries in place and copies
    only when the capacity doubles. ``keys``/``values`` are views of the filled part.
    """

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.length, self._kbuf, self._vbuf = 0, None, None
        n, new = self.length, key_states.shape[-2]
        if self._kbuf is None or n + new > self._kbuf.shape[-2]:
            self._kbuf, self._vbuf = (self._grown(b, s, max(2 * (n + new), 64))
                                      for b, s in ((self._kbuf, key_states), (self._vbuf, value_states)))
        self._kbuf[..., n:n + new, :] = key_states
        self._vbuf[..., n:n + new, :] = value_states
        self.length = n + new
        self.keys, self.values = self._kbuf[..., : n + new, :], self._vbuf[..., : n + new, :]
        return self.keys, self.values

    def _grown(self, buf, states, capacity):
        out = states.new_zeros((*states.shape[:-2], capacity, states.shape[-1]))
        if buf is not None:
            out[..., : self.length, :] = buf[..., : self.length, :]
        return out

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the batch rows ``indices`` (finished episodes leave a batched cache)."""
        if self.is_initialized and self._kbuf is not None:
            self._kbuf, self._vbuf = self._kbuf[indices], self._vbuf[indices]
            self.keys, self.values = self._kbuf[..., : self.length, :], self._vbuf[..., : self.length, :]

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("GrowingLayer does not crop")


def growing_cache() -> DynamicCache:
    """A DynamicCache made of ``GrowingLayer``s (no per-token copy of the whole cache)."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    return cache


class IncrementalDecoder(GreedyDecoder):
    """Greedy decoding with transformers' forward over a KV cache that persists across turns."""

    def __init__(self, model, stop_ids: set[int]):
        super().__init__(stop_ids)
        self.model = model
        self.cache = growing_cache()

    @torch.no_grad()
    def _feed(self) -> torch.Tensor:
        ids = torch.tensor([self.unfed], device=self.model.device)
        pos = torch.arange(self.seen, self.seen + ids.shape[1], device=ids.device)
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True,
                         cache_position=pos, logits_to_keep=1)
        self.seen += ids.shape[1]
        self.unfed = []
        return out.logits[0, -1]


def greedy_reply(model, tokenizer, system: str, user: str, max_tokens: int) -> str:
    """The model's greedy reply to one [system, user] chat (at most ``max_tokens``), as text; the
    caller chooses the weights (e.g. ``policy.teacher()``) and the mode."""
    from lit_ascent.chat import chat_prompt_ids

    decoder = IncrementalDecoder(model, {tokenizer.eos_token_id} - {None})
    decoder.extend(chat_prompt_ids(tokenizer, system, user))
    ids, _ = decoder.generate(max_tokens)
    return tokenizer.decode(ids, skip_special_tokens=True)


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
                over, closed[i] = turn_over(tokens[i], outs[i], self.stop_ids, should_stop[i], budgets[i])
                live[i] = not over
        self.unfed = pending  # each row's last token is fed with its next observation
        return list(zip(outs, closed))


class HFEngine(Engine):
    """``model.rollout.engine: hf`` (the default): ``IncrementalDecoder`` on the model itself."""

    name = "hf"

    def decoder(self, stop_ids: set[int]) -> IncrementalDecoder:
        return IncrementalDecoder(self.model, stop_ids)
