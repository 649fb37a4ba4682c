"""The reference engine: transformers' own forward, one token at a time, over a KV cache kept across turns.

Each turn pre-fills only the tokens the cache has not seen (the previous stop
token and the new observation), never the whole history again. Exact for any
causal LM transformers loads; the other engines are tested against it.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from lit_ascent.engines.base import Engine, GreedyDecoder


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


class HFEngine(Engine):
    """``model.rollout.engine: hf`` (the default): ``IncrementalDecoder`` on the model itself."""

    name = "hf"

    def decoder(self, stop_ids: set[int]) -> IncrementalDecoder:
        return IncrementalDecoder(self.model, stop_ids)
