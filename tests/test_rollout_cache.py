"""The KV cache kept across turns is exact: a cached episode equals one that recomputes everything."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close
from transformers import DynamicCache

from lit_ascent.envs import ScriptedEnv
from lit_ascent.engines.hf import GrowingLayer, IncrementalDecoder, growing_cache
from lit_ascent.models import adapter_is_zero, skip_zero_adapter
from lit_ascent.rollout import RolloutConfig, rollout


class FullRecompute:
    """Reference decoder: no cache, the whole sequence is run again for every token."""

    def __init__(self, model, stop_ids):
        self.model, self.stop_ids = model, stop_ids
        self.ids: list[int] = []
        self.trace: list[torch.Tensor] = []

    def extend(self, ids):
        self.ids.extend(ids)

    @torch.no_grad()
    def generate(self, max_new_tokens, should_stop=None):
        out = []
        for _ in range(max_new_tokens):
            logits = self.model(input_ids=torch.tensor([self.ids]), use_cache=False).logits[0, -1]
            self.trace.append(logits.float())
            token = int(logits.argmax())
            out.append(token)
            self.ids.append(token)
            if token in self.stop_ids:
                return out, True
            if should_stop is not None and should_stop(out):
                break
        return out, False


def _traced(made: list):
    def factory(model, stop_ids):
        dec = IncrementalDecoder(model, stop_ids)
        dec.trace = []
        made.append(dec)
        return dec
    return factory


@pytest.mark.parametrize("stop_after_action", [True, False])
def test_cached_rollout_equals_full_recompute(policy, stop_after_action):
    env = ScriptedEnv(num_tasks=2, episode_steps=6, verify_every=1)
    cfg = RolloutConfig(max_turns=4, max_new_tokens=24, stop_after_action=stop_after_action)
    task = env.tasks()[1]
    policy.model.eval()
    cached, refs = [], []
    ep = rollout(policy.model, policy.tokenizer, env, task, cfg, decoder_factory=_traced(cached))
    ref = rollout(policy.model, policy.tokenizer, env, task, cfg,
                  decoder_factory=lambda m, s: refs.append(FullRecompute(m, s)) or refs[-1])
    assert ep.token_ids == ref.token_ids and ep.roles == ref.roles and ep.turn_ids == ref.turn_ids
    assert [t.text for t in ep.turns] == [t.text for t in ref.turns]
    assert len(ep.turns) == 4 and sum(len(range(*t.span)) for t in ep.turns) == len(refs[0].trace)
    assert_close(torch.stack(cached[0].trace), torch.stack(refs[0].trace), rtol=1e-5, atol=1e-5)
    # the cache saw every token but the last generated one, and outgrew its first buffer
    layer = cached[0].cache.layers[0]
    assert isinstance(layer, GrowingLayer) and layer.get_seq_length() == len(ep.token_ids) - 1
    assert len(ep.token_ids) > 2 * ep.prompt_len


def test_cached_logits_equal_one_forward_over_the_episode(policy):
    """Every traced logit equals the logit of a single uncached forward at that position."""
    env = ScriptedEnv(num_tasks=1, episode_steps=3, verify_every=1)
    made = []
    ep = rollout(policy.model.eval(), policy.tokenizer, env, env.tasks()[0],
                 RolloutConfig(max_turns=3, max_new_tokens=7), decoder_factory=_traced(made))
    with torch.no_grad():
        full = policy.model(input_ids=ep.ids()[None], use_cache=False).logits[0]  # (T, V)
    pos = torch.tensor([p - 1 for t in ep.turns for p in range(*t.span)])
    assert_close(torch.stack(made[0].trace), full[pos].float(), rtol=1e-5, atol=1e-5)
    assert torch.equal(full[pos].argmax(-1), ep.ids()[pos + 1])


def test_growing_layer_matches_concatenation():
    g = torch.Generator().manual_seed(0)
    grow, ref = growing_cache(), DynamicCache()
    for n in (5, 1, 1, 70, 3, 130):  # crosses the 64-entry start and two doublings
        k, v = torch.randn(2, 3, n, 4, generator=g), torch.randn(2, 3, n, 4, generator=g)
        got, want = grow.update(k, v, 0), ref.update(k.clone(), v.clone(), 0)
        assert_close(got[0], want[0], rtol=0, atol=0) and assert_close(got[1], want[1], rtol=0, atol=0)
    assert grow.get_seq_length() == ref.get_seq_length() == 210
    keep = torch.tensor([1])
    grow.layers[0].batch_select_indices(keep), ref.layers[0].batch_select_indices(keep)
    k = torch.randn(1, 3, 2, 4, generator=g)
    assert_close(grow.update(k, k, 0)[0], ref.update(k, k, 0)[0], rtol=0, atol=0)


def test_cached_rollout_equals_plain_generate_on_the_whole_history(policy):
    """The bench's baseline (plain ``model.generate`` re-prefilling every turn) yields the same episode."""
    from lit_ascent.bench.throughput import FixedTurnsEnv, reprefill_rollout

    env = FixedTurnsEnv(ScriptedEnv(num_tasks=1), reply="ok")
    cfg = RolloutConfig(max_turns=4, max_new_tokens=6, stop_after_action=False)
    policy.model.eval()
    ep = rollout(policy.model, policy.tokenizer, env, env.tasks()[0], cfg)
    ref = reprefill_rollout(policy.model, policy.tokenizer, env, env.tasks()[0], cfg)
    assert len(ep.turns) == 4 and ep.token_ids == ref.token_ids and ep.roles == ref.roles


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_zero_adapter_is_skipped_with_identical_logits(policy, dtype):
    model = policy.model.to(dtype).eval()
    lora_a = next(m for name, m in model.named_modules() if name.endswith("lora_A.default"))
    calls = []
    lora_a.register_forward_hook(lambda *a: calls.append(1))

    def decode(ctx) -> torch.Tensor:
        calls.clear()
        with ctx:
            dec = IncrementalDecoder(model, set())
            dec.trace = []
            dec.extend(list(range(40, 70)))
            dec.generate(8)
        return torch.stack(dec.trace)

    assert adapter_is_zero(model)
    skipped, skipped_calls = decode(skip_zero_adapter(model)), len(calls)
    active, active_calls = decode(contextlib.nullcontext()), len(calls)
    assert skipped_calls == 0 and active_calls > 0  # the LoRA ops did not run, then they did
    assert torch.equal(skipped, active)  # B = 0: bit for bit the same logits
    with torch.no_grad():
        next(p for name, p in model.named_parameters() if "lora_B" in name).add_(0.01)
    assert not adapter_is_zero(model)
    decode(skip_zero_adapter(model))
    assert len(calls) > 0  # after an update the adapter is used


def test_packed_gqa_decode_matches_sdpa_and_runs_only_for_single_query_tokens(monkeypatch):
    import lit_ascent.attention as attention
    from lit_ascent.models import ModelConfig, load_policy

    cfg = dict(name_or_path="tiny-random", dtype="float32")
    torch.manual_seed(0)
    default = load_policy(ModelConfig(**cfg)).model.eval()
    torch.manual_seed(0)
    packed = load_policy(ModelConfig(**cfg, packed_gqa_decode=True)).model.eval()
    assert packed.config._attn_implementation == attention.NAME
    packed_calls = []
    original = attention.F.scaled_dot_product_attention
    spy = SimpleNamespace(scaled_dot_product_attention=lambda q, *a, **kw: packed_calls.append(q.shape)
                          or original(q, *a, **kw))
    monkeypatch.setattr(attention, "F", spy)  # only the packed path's own calls

    def decode(model) -> tuple[list[int], torch.Tensor]:
        dec = IncrementalDecoder(model, set())
        dec.trace = []
        dec.extend(list(range(40, 90)))
        tokens, _ = dec.generate(12)
        return tokens, torch.stack(dec.trace)

    tokens, logits = decode(default)
    assert not packed_calls
    packed_tokens, packed_logits = decode(packed)
    assert packed_tokens == tokens
    assert_close(packed_logits, logits, rtol=1e-5, atol=1e-5)
    # 11 single-token steps x 2 layers packed (4 heads on 2 key/value heads); the 50-token prefill went to sdpa
    assert packed_calls == [torch.Size([1, 2, 2, 8])] * 22
