"""A fused CPU decoder for Llama-family models: the forward written as a few plain tensor ops.

Decoding one token on a CPU is bound by reading the weights once from memory;
transformers' forward adds per-module overhead (and PEFT two more small matmuls
and an add per adapted linear layer) that costs more than the reads themselves
at SmolLM2's size. This engine runs the same mathematics with the LoRA folded
into the weights (W + s * B @ A, computed again only when the adapter changes),
q/k/v and gate/up packed into one matrix each, and a static key/value buffer per
layer; ``python -m lit_ascent.bench`` measures it against the bandwidth bound.

Not bit-identical to transformers (packed matmuls and the folded LoRA round
differently), so it is tested on greedy tokens: in float32 the episodes of the
engine contract tests equal the ``hf`` engine's. Supported: ``llama``, ``qwen2``
and ``qwen3`` model types with default-style RoPE (any ``rope_type`` transformers
computes into ``inv_freq``), SiLU MLP, no sliding window; others fail when the
engine is built, naming the model type.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lit_ascent.engines.base import AdapterWatch, Engine, take_tokens

SUPPORTED = ("llama", "qwen2", "qwen3")


@dataclass
class FusedSettings:
    """Settings of the fused engine."""

    prompt_lookup: int = 8
    """Draft tokens checked per forward, copied from the episode so far (0: one token per forward).
    Greedy output either way; fewer forwards when the agent repeats its context."""

    def __post_init__(self) -> None:
        if self.prompt_lookup < 0:
            raise ValueError(f"model.rollout.fused.prompt_lookup must be >= 0, got {self.prompt_lookup}")


def effective_weight(linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) a linear layer applies now: a PEFT LoRA layer's active adapters folded in."""
    base = getattr(linear, "base_layer", linear)
    w = base.weight.detach()
    if base is not linear and not linear.disable_adapters:
        for name in linear.active_adapters:
            if name in linear.lora_A:
                b = linear.lora_B[name].weight.detach()
                if b.any():  # PEFT may keep the adapter in float32 over a bf16 base: fold in float32
                    delta = b.float() @ linear.lora_A[name].weight.detach().float()
                    w = (w.float() + linear.scaling[name] * delta).to(base.weight.dtype)
    return w, (base.bias.detach() if base.bias is not None else None)


def _packed(*linears) -> tuple[torch.Tensor, torch.Tensor | None]:
    ws, bs = zip(*(effective_weight(lin) for lin in linears))
    bias = None if all(b is None for b in bs) else torch.cat(
        [b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(ws, bs)])
    return torch.cat(ws).contiguous(), bias


@dataclass
class LayerWeights:
    qkv: tuple[torch.Tensor, torch.Tensor | None]
    o: tuple[torch.Tensor, torch.Tensor | None]
    gate_up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]
    norm_in: torch.Tensor
    norm_post: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None


def causal_lm_parts(model):
    """(causal LM, its decoder stack) under any PEFT wrapping."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    return lm, lm.get_decoder()


def check_supported(model) -> None:
    """Raise ValueError naming what the fused engine cannot run."""
    cfg = causal_lm_parts(model)[0].config
    kind = getattr(cfg, "model_type", "?")
    problems = []
    if kind not in SUPPORTED:
        problems.append(f"model type {kind!r} (supported: {', '.join(SUPPORTED)})")
    if getattr(cfg, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {cfg.hidden_act!r}")
    if getattr(cfg, "use_sliding_window", False):
        problems.append("a sliding attention window")
    if problems:
        raise ValueError("model.rollout.engine: fused cannot run this model: " + "; ".join(problems)
                         + ". Use engine: hf.")


class FusedWeights:
    """The model's effective weights, packed for decoding; rebuilt when the adapter changes."""

    def __init__(self, model):
        lm, stack = causal_lm_parts(model)
        cfg = lm.config
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = cfg.rms_norm_eps
        rotary = stack.rotary_emb
        self.inv_freq = rotary.inv_freq.detach().float().cpu()
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        self.embed = stack.embed_tokens.weight.detach()
        self.norm = stack.norm.weight.detach()
        self.head = effective_weight(lm.get_output_embeddings())
        self.layers = []
        for layer in stack.layers:
            at, mlp = layer.self_attn, layer.mlp
            self.layers.append(LayerWeights(
                _packed(at.q_proj, at.k_proj, at.v_proj), effective_weight(at.o_proj),
                _packed(mlp.gate_proj, mlp.up_proj), effective_weight(mlp.down_proj),
                layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach(),
                getattr(getattr(at, "q_norm", None), "weight", None), getattr(getattr(at, "k_norm", None), "weight", None)))
        self.dtype, self.device = self.embed.dtype, self.embed.device
        self._cos = self._sin = torch.empty(0)

    def rope(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (end - start, head_dim) of positions [start, end), as transformers computes them."""
        if end > self._cos.shape[0]:
            pos = torch.arange(max(2 * end, 1024), dtype=torch.float32)
            freqs = torch.outer(pos, self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            self._cos = (emb.cos() * self.rope_scale).to(self.device, self.dtype)
            self._sin = (emb.sin() * self.rope_scale).to(self.device, self.dtype)
        return self._cos[start:end], self._sin[start:end]


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def prompt_lookup(ids: list[int], k: int, limit: int, ngram: int = 3) -> list[int]:
    """Up to min(k, limit) ids that followed the latest earlier occurrence of the last ``ngram`` ids of
    ``ids`` (then shorter n-grams, down to one id); [] when none occurs. A ReAct agent copies much of
    its reply from the prompt and earlier turns (recipe lines, item names, its own previous actions)."""
    k = min(k, limit)
    if k <= 0:
        return []
    for n in range(min(ngram, len(ids) - 1), 0, -1):
        tail = ids[-n:]
        for s in range(len(ids) - n - 1, -1, -1):
            if ids[s:s + n] == tail:
                return ids[s + n:s + n + k]
    return []


class KVCache:
    """One sequence's key/value buffers, a (kv_heads, capacity, head_dim) tensor per layer; ``seen``
    positions are filled. The capacity doubles when a feed needs more room."""

    def __init__(self, weights: FusedWeights):
        self.w, self.seen = weights, 0
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    def room(self, end: int) -> None:
        if self.k and end <= self.k[0].shape[1]:
            return
        cap, w = max(2 * end, 256), self.w
        grown = []
        for old in (self.k, self.v):
            new = [torch.zeros(w.kv_heads, cap, w.head_dim, dtype=w.dtype, device=w.device) for _ in w.layers]
            for n, o in zip(new, old):
                n[:, : self.seen] = o[:, : self.seen]
            grown.append(new)
        self.k, self.v = grown


@torch.no_grad()
def forward(w: FusedWeights, caches: list[KVCache], feeds: list[list[int]], keep: list[int]) -> list[torch.Tensor]:
    """Run ``feeds[i]`` (token ids, non-empty) at the end of sequence ``caches[i]``, all rows in one pass:
    the matrix products over every fed token at once (the weights are read once per forward), attention
    row by row on each row's own cache. Returns, per row, the (keep[i], V) logits of its last ``keep[i]``
    fed positions; each cache's ``seen`` advances by its feed (a caller may set it back to drop positions)."""
    hq, hk, d = w.heads, w.kv_heads, w.head_dim
    lengths = [len(f) for f in feeds]
    h = w.embed[torch.tensor([i for f in feeds for i in f], device=w.device)]
    rows = []  # (cache, start in h, length, rope cos, rope sin, causal mask)
    start = 0
    for cache, t in zip(caches, lengths):
        n = cache.seen
        cache.room(n + t)
        mask = torch.ones(t, n + t, dtype=torch.bool, device=w.device).tril(diagonal=n) if t > 1 else None
        rows.append((cache, start, t, *w.rope(n, n + t), mask))
        start += t
    for i, lw in enumerate(w.layers):
        qkv = F.linear(_rms(h, lw.norm_in, w.eps), *lw.qkv)
        out = []
        for cache, s, t, cos, sin, mask in rows:
            n = cache.seen
            q, k, v = qkv[s:s + t].split([hq * d, hk * d, hk * d], dim=-1)
            q, k, v = q.view(t, hq, d).transpose(0, 1), k.view(t, hk, d).transpose(0, 1), v.view(t, hk, d).transpose(0, 1)
            if lw.q_norm is not None:
                q, k = _rms(q, lw.q_norm, w.eps), _rms(k, lw.k_norm, w.eps)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            cache.k[i][:, n:n + t], cache.v[i][:, n:n + t] = k, v
            keys, values = cache.k[i][:, : n + t], cache.v[i][:, : n + t]
            # 4-d inputs: torch's fused CPU attention kernel (3-d ones take a slower path, 2-3x here)
            if t == 1:  # one query: pack the query heads onto their key/value head, no mask
                a = F.scaled_dot_product_attention(q.reshape(1, hk, hq // hk, d), keys[None], values[None])
            else:
                a = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask,
                                                   enable_gqa=hq != hk)
            a = a.reshape(hq, t, d)
            out.append(a.transpose(0, 1).reshape(t, hq * d))
        h = h + F.linear(out[0] if len(out) == 1 else torch.cat(out), *lw.o)
        gate, up = F.linear(_rms(h, lw.norm_post, w.eps), *lw.gate_up).chunk(2, dim=-1)
        h = h + F.linear(F.silu(gate) * up, *lw.down)
    for cache, t in zip(caches, lengths):
        cache.seen += t
    ends = torch.tensor(lengths).cumsum(0).tolist()
    picked = [torch.arange(e - k, e) for e, k in zip(ends, keep)]
    logits = F.linear(_rms(h[torch.cat(picked).to(w.device)], w.norm, w.eps), *w.head)
    return list(logits.split(keep))


class FusedDecoder:
    """One episode's decoder (the ``Decoder`` protocol): a one-row ``FusedRows``, turn by turn."""

    def __init__(self, weights: FusedWeights, stop_ids: set[int], lookup: int = 0):
        self.rows, self.stop_ids, self._started = FusedRows(weights, 1, lookup), stop_ids, False

    @property
    def trace(self) -> list[torch.Tensor] | None:
        """When a list: receives the logits of every decoded token (exactness tests)."""
        return self.rows.trace

    @trace.setter
    def trace(self, value: list[torch.Tensor] | None) -> None:
        self.rows.trace = value

    def extend(self, ids: list[int]) -> None:
        if self._started:
            self.rows.extend(0, ids)
        else:
            self.rows.start(0, ids)
            self._started = True

    def generate(self, max_new_tokens: int, should_stop=None) -> tuple[list[int], bool]:
        """Greedy tokens until a stop id (included; closed=True), ``should_stop`` or the budget. With prompt
        lookup each forward also checks draft tokens copied from the episode so far, kept only where they
        are the greedy tokens: the greedy output, in fewer forwards."""
        out: list[int] = []
        while len(out) < max_new_tokens:
            tokens = self.rows.step({0: max_new_tokens - len(out)})[0]
            used, over, closed = take_tokens(tokens, out, self.stop_ids, should_stop, max_new_tokens)
            if over:
                self.rows.accept(0, used)
                return out, closed
        return out, False


def greedy_chain(logits: torch.Tensor, draft: list[int]) -> list[int]:
    """The greedy tokens one forward over ``draft`` gives ((1 + len(draft), V) logits): each draft id is
    kept while it is the greedy token; the chain ends with the first greedy token that differs (or the
    one after the whole draft)."""
    tokens = logits.argmax(-1).tolist()
    for j, d in enumerate(draft):
        if tokens[j] != d:
            return tokens[: j + 1]
    return tokens


class FusedRows:
    """Continuous batching over ``FusedWeights``: up to ``size`` sequences, each on its own cache, decoded
    together (one forward per step for all rows; a row may pre-fill a prompt while others decode). A row
    starts a new sequence whenever its episode ends (``start``), so the batch stays full. With ``lookup``
    > 0 each row's forward also checks draft tokens, as ``FusedDecoder`` does. Greedy tokens are the
    sequential decoder's in float32 (tests/test_batched_eval.py)."""

    def __init__(self, weights: FusedWeights, rows: int, lookup: int = 0):
        self.w, self.size, self.lookup = weights, rows, lookup
        self.caches: list[KVCache | None] = [None] * rows
        # per row: every id of its sequence (the cache's, then the unfed ones; drafts are looked up here),
        # the ids not yet fed, and the last step's chain of greedy tokens with the history length before it
        self.history: list[list[int]] = [[] for _ in range(rows)]
        self.unfed: list[list[int]] = [[] for _ in range(rows)]
        self.chains: list[list[int]] = [[] for _ in range(rows)]
        self.bases = [0] * rows
        self.trace: list[torch.Tensor] | None = None
        """When a list: receives the logits of every token of every chain (one-row use: exactness tests)."""

    def start(self, row: int, ids: list[int]) -> None:
        """Begin a new sequence in ``row`` with ``ids`` (the previous one's cache is dropped)."""
        self.caches[row], self.history[row], self.unfed[row] = KVCache(self.w), list(ids), list(ids)

    def extend(self, row: int, ids: list[int]) -> None:
        self.history[row].extend(ids)
        self.unfed[row].extend(ids)

    def release(self, row: int) -> None:
        self.caches[row], self.history[row], self.unfed[row] = None, [], []

    def step(self, limits: dict[int, int] | None = None) -> dict[int, list[int]]:
        """Feed every row's pending ids (with a draft of at most ``limits[row] - 1`` ids) in one forward;
        row -> its greedy tokens (``greedy_chain``), all kept unless ``accept`` says otherwise. The last
        one is fed at the row's next step."""
        fed = [r for r, ids in enumerate(self.unfed) if ids and self.caches[r] is not None]
        if not fed:
            return {}
        limits = limits or {}
        drafts = [prompt_lookup(self.history[r], self.lookup, limits.get(r, self.lookup + 1) - 1) for r in fed]
        logits = forward(self.w, [self.caches[r] for r in fed], [self.unfed[r] + d for r, d in zip(fed, drafts)],
                         [1 + len(d) for d in drafts])
        for r, draft, rows in zip(fed, drafts, logits):
            self.chains[r], self.bases[r] = greedy_chain(rows, draft), len(self.history[r])
            self._keep(r, len(self.chains[r]))
            if self.trace is not None:
                self.trace.extend(rows[: len(self.chains[r])].float().clone())
        return {r: self.chains[r] for r in fed}

    def accept(self, row: int, used: int) -> None:
        """Only the first ``used`` tokens of ``row``'s last step count (its turn ended there)."""
        if used < len(self.chains[row]):
            self._keep(row, used)

    def _keep(self, row: int, n: int) -> None:
        """Keep the first n tokens of the row's last chain: the cache holds all but the n-th, which is unfed."""
        base, chain = self.bases[row], self.chains[row][:n]
        del self.history[row][base:]
        self.history[row].extend(chain)
        self.caches[row].seen, self.unfed[row] = base + n - 1, [chain[-1]]


class FusedEngine(Engine):
    """``model.rollout.engine: fused``: ``FusedDecoder`` on weights folded again after every update."""

    name = "fused"

    def __init__(self, model, settings: FusedSettings | None = None):
        check_supported(model)
        super().__init__(model, settings or FusedSettings())
        self.watch = AdapterWatch(model)
        self.weights: FusedWeights | None = None

    def current_weights(self) -> FusedWeights:
        """The packed weights of the model as it is now: folded again after an update, a disabled or
        switched adapter, or a cast of the weights to another dtype (e.g. the held-out evaluation's)."""
        dtype = causal_lm_parts(self.model)[1].embed_tokens.weight.dtype
        if self.watch.changed() or self.weights is None or self.weights.dtype != dtype:
            self.weights = None  # free the old copy before building the new one
            t0 = time.perf_counter()
            self.weights = FusedWeights(self.model)
            self._add_perf("fold_s", time.perf_counter() - t0)
            self._add_perf("folds", 1)
        return self.weights

    def decoder(self, stop_ids: set[int]) -> FusedDecoder:
        return FusedDecoder(self.current_weights(), stop_ids, self.settings.prompt_lookup)

    def rows(self, rows: int) -> FusedRows:
        return FusedRows(self.current_weights(), rows, self.settings.prompt_lookup)

    def close(self) -> None:
        self.weights = None
