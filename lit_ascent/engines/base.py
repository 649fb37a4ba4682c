"""The engine seam: how the tokens of an episode are generated.

An episode's bookkeeping (``rollout.EpisodeRun``: the append-only token ids,
roles, turns, the environment loop) is one code path; only the decoding varies.
An *engine* makes one *decoder* per episode for one model. A decoder keeps the
episode's sequence: ``extend(ids)`` appends ids (prompt, observations) it has
not run yet, ``generate(budget, should_stop)`` pre-fills them and decodes
greedily until a stop id (included; closed=True), ``should_stop(tokens)`` or the
budget. Engines read the model's weights as they are when an episode starts
(``AdapterWatch``), so an update is used from the next episode on, never a stale copy.
"""
from __future__ import annotations

import importlib
import time
import weakref
from collections.abc import Callable
from typing import Protocol

import torch

ENGINES = {
    "hf": "lit_ascent.engines.hf:HFEngine",
    "fused": "lit_ascent.engines.fused:FusedEngine",
    "vllm": "lit_ascent.engines.vllm:VLLMEngine",
}
"""Engine name (``model.rollout.engine``) -> class."""


class Decoder(Protocol):
    def extend(self, ids: list[int]) -> None: ...

    def generate(self, max_new_tokens: int, should_stop: Callable[[list[int]], bool] | None = None
                 ) -> tuple[list[int], bool]: ...


class RowDecoder(Protocol):
    """Several sequences decoded together, one greedy token per row and step; a row can start a new
    sequence at any step (continuous batching: ``lit_ascent.evaluate.continuous_rollouts``)."""

    size: int
    """The number of rows."""

    def start(self, row: int, ids: list[int]) -> None: ...

    def extend(self, row: int, ids: list[int]) -> None: ...

    def release(self, row: int) -> None: ...

    def step(self, limits: dict[int, int] | None = None) -> dict[int, list[int]]:
        """Greedy tokens of every row with ids to feed (one, or more when drafts were verified; none past
        ``limits[row]``); the last is fed at the row's next step."""

    def accept(self, row: int, used: int) -> None:
        """Only the first ``used`` tokens of the row's last step count."""


def turn_over(token: int, out: list[int], stop_ids: set[int], should_stop, budget: int) -> tuple[bool, bool]:
    """(the turn ends after ``out``, whose last id is ``token``; it ended on a stop id): the rule of every
    decoder. A turn ends at a stop id (included), when ``should_stop(out)`` says so, or at ``budget`` tokens."""
    if token in stop_ids:
        return True, True
    return (should_stop is not None and should_stop(out)) or len(out) >= budget, False


def take_tokens(tokens: list[int], out: list[int], stop_ids: set[int], should_stop, budget: int
                ) -> tuple[int, bool, bool]:
    """Append ``tokens`` to the turn's ``out`` one by one until the turn is over (``turn_over``):
    (how many were taken, the turn is over, it ended on a stop id)."""
    over = closed = False
    for used, token in enumerate(tokens, 1):
        out.append(token)
        over, closed = turn_over(token, out, stop_ids, should_stop, budget)
        if over:
            return used, over, closed
    return len(tokens), over, closed


class GreedyDecoder:
    """The greedy loop shared by the in-process decoders; ``_feed`` runs the unfed ids and
    returns the (V,) logits of the last one. ``trace``, when a list, receives every decoded
    token's logits (for exactness tests)."""

    def __init__(self, stop_ids: set[int]):
        self.stop_ids = stop_ids
        self.unfed: list[int] = []
        self.seen = 0
        self.trace: list[torch.Tensor] | None = None

    def extend(self, ids: list[int]) -> None:
        self.unfed.extend(ids)

    def _feed(self) -> torch.Tensor:
        raise NotImplementedError

    def generate(self, max_new_tokens: int, should_stop=None) -> tuple[list[int], bool]:
        """Greedy tokens until a stop id (included, returns closed=True) or the budget."""
        out: list[int] = []
        while max_new_tokens > 0:
            logits = self._feed()
            if self.trace is not None:
                self.trace.append(logits.float().clone())
            token = int(logits.argmax())
            out.append(token)
            self.unfed = [token]
            over, closed = turn_over(token, out, self.stop_ids, should_stop, max_new_tokens)
            if over:
                return out, closed
        return out, False


class Engine:
    """Makes decoders for one model. ``perf`` holds cumulative seconds/counts (logged under ``perf/``)."""

    name = ""

    def __init__(self, model, settings=None):
        self._model = weakref.ref(model)  # engines are kept per model: no strong reference back
        self.settings = settings
        self.perf: dict[str, float] = {}

    @property
    def model(self):
        return self._model()

    def decoder(self, stop_ids: set[int]) -> Decoder:
        raise NotImplementedError

    def rows(self, rows: int) -> RowDecoder | None:
        """A continuous batch of ``rows`` sequences (``RowDecoder``), or None when the engine has none
        (the batched evaluation then uses transformers' batched forward, ``lit_ascent.evaluate``)."""
        return None

    def close(self) -> None:
        """Release what the engine holds (processes, buffers)."""

    def _add_perf(self, key: str, value: float) -> None:
        self.perf[key] = self.perf.get(key, 0.0) + value


def lora_layers(model) -> list:
    """PEFT LoRA layers of ``model`` (empty for a plain model)."""
    return [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]


def adapter_fingerprint(model) -> list[tuple]:
    """Per LoRA layer: whether adapters are disabled, the active adapters and their (A, B) tensors."""
    out = []
    for m in lora_layers(model):
        active = [a for a in m.active_adapters if a in m.lora_A]
        out.append((bool(m.disable_adapters), tuple(active),
                    tuple((m.lora_A[a].weight, m.lora_B[a].weight) for a in active)))
    return out


class AdapterWatch:
    """Tells whether the model's effective LoRA weights changed since the last ``changed()``
    that returned True (an update, a disabled adapter, another active adapter)."""

    def __init__(self, model):
        self.model = model
        self._seen: list[tuple] | None = None

    def changed(self) -> bool:
        now = adapter_fingerprint(self.model)
        if self._seen is not None and _same(self._seen, now):
            return False
        self._seen = [(d, a, tuple((A.detach().clone(), B.detach().clone()) for A, B in w)) for d, a, w in now]
        return True


def _same(seen: list[tuple], now: list[tuple]) -> bool:
    if len(seen) != len(now):
        return False
    for (d0, a0, w0), (d1, a1, w1) in zip(seen, now):
        if d0 != d1 or a0 != a1 or any(not (torch.equal(A0, A1) and torch.equal(B0, B1))
                                       for (A0, B0), (A1, B1) in zip(w0, w1)):
            return False
    return True


_LIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def engine_class(name: str) -> type[Engine]:
    if name not in ENGINES:
        raise ValueError(f"model.rollout.engine must be one of {sorted(ENGINES)}, got {name!r}")
    module, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def engine_for(name: str, model, settings=None) -> Engine:
    """The ``name`` engine of ``model``, built on first use and kept while the model lives."""
    engines = _LIVE.setdefault(model, {})
    if name not in engines:
        t0 = time.perf_counter()
        engines[name] = engine_class(name)(model, settings)
        engines[name]._add_perf("start_s", time.perf_counter() - t0)
    return engines[name]


def close_engines(model=None) -> None:
    """Close the engines of ``model`` (all models when None)."""
    models = [model] if model is not None else list(_LIVE.keys())
    for m in models:
        for engine in _LIVE.pop(m, {}).values():
            engine.close()
