"""Decode attention for grouped-query models on the CPU: one query token runs on the key/value heads.

transformers' ``sdpa`` passes ``enable_gqa=True`` to PyTorch for a single query
token; on the CPU in bfloat16 that kernel is several times slower than the same
attention with the query *packed* onto the key/value heads ((B, H, 1, d) ->
(B, H_kv, H / H_kv, d)), and at a few thousand cached tokens it is half of
SmolLM2's decode time. ``packed_gqa_sdpa`` does the packing for exactly that case
(one query token, no mask, GQA) and hands every other call (prefill, training,
masked batches) to transformers' ``sdpa`` unchanged. Same attention, different
kernel: float32 agrees to ~1e-5, bfloat16 rounds differently (a greedy near-tie
can flip), so it is opt-in (``model.llm.packed_gqa_decode``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "sdpa_packed_gqa"


def packed_gqa_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    **kwargs) -> tuple[torch.Tensor, None]:
    """transformers attention-function signature: (B, H, q, d) query -> ((B, q, H, d) output, None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[2] != 1 or groups == 1 or attention_mask is not None or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    b, h, _, d = query.shape
    out = F.scaled_dot_product_attention(query.reshape(b, h // groups, groups, d), key, value,
                                         dropout_p=dropout, scale=scaling)
    return out.reshape(b, h, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


def use_packed_gqa(model) -> bool:
    """Switch a transformers model that uses ``sdpa`` to ``packed_gqa_sdpa``; False when it uses another kernel."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if model.config._attn_implementation != "sdpa":
        return False
    AttentionInterface.register(NAME, packed_gqa_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks sdpa builds, unchanged
    model.set_attn_implementation(NAME)
    return True
