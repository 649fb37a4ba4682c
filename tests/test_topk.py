"""Update-step approximations and memory options: top-k teacher with a tail bucket, gradient checkpointing."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.testing import assert_close

from lit_ascent.envs import ScriptedEnv
from lit_ascent.models import load_policy
from lit_ascent.objectives import Distillation
from lit_ascent.objectives.divergences import (
    DIVERGENCES,
    chunked_topk_divergence,
    token_divergence,
    topk_teacher_targets,
    topk_tail_divergence,
)
from lit_ascent.rollout import RolloutConfig, rollout

N, V, D = 6, 11, 5


@pytest.fixture
def logits():
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, V, generator=g) * 2, torch.randn(N, V, generator=g) * 2


def _bucket_reference(s, t, k, kind, beta):
    """Independent reference: probabilities summed into k + 1 buckets in float64, then the divergence."""
    q, p = torch.softmax(t.double(), -1), torch.softmax(s.double(), -1)
    idx = q.topk(k, -1).indices
    keep = torch.zeros_like(q, dtype=torch.bool).scatter(-1, idx, True)
    qb = torch.cat([q.gather(-1, idx), (q * ~keep).sum(-1, keepdim=True)], -1)
    pb = torch.cat([p.gather(-1, idx), (p * ~keep).sum(-1, keepdim=True)], -1)
    return token_divergence(pb.log().float(), qb.log().float(), kind, beta)


@pytest.mark.parametrize("kind", DIVERGENCES)
def test_full_k_is_exact(logits, kind):
    s, t = logits
    targets = topk_teacher_targets(t, V)
    assert_close(topk_tail_divergence(s, *targets, kind), token_divergence(s, t, kind), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", DIVERGENCES)
@pytest.mark.parametrize("k", [1, 3, 7])
def test_topk_matches_bucketed_reference_and_bounds_exact(logits, kind, k):
    s, t = logits
    approx = topk_tail_divergence(s, *topk_teacher_targets(t, k), kind)
    assert_close(approx, _bucket_reference(s, t, k, kind, 0.5), rtol=1e-4, atol=1e-5)
    assert (approx <= token_divergence(s, t, kind) + 1e-5).all()  # coarse-graining lowers the divergence


def test_error_shrinks_with_k_and_is_small_for_a_peaked_teacher(logits):
    s, t = logits
    exact = token_divergence(s, t, "forward_kl")
    errors = [(exact - topk_tail_divergence(s, *topk_teacher_targets(t, k), "forward_kl")).mean() for k in (1, 4, 8)]
    assert errors[0] >= errors[1] >= errors[2] >= 0
    peaked = t * 6
    exact = token_divergence(s, peaked, "forward_kl")
    approx = topk_tail_divergence(s, *topk_teacher_targets(peaked, 3), "forward_kl")
    assert ((exact - approx) / exact).max() < 0.05


def test_chunked_topk_equals_unchunked_with_grads():
    g = torch.Generator().manual_seed(1)
    head = torch.nn.Linear(D, V, bias=False)
    h_s, h_t = torch.randn(N, D, generator=g, requires_grad=True), torch.randn(N, D, generator=g) * 3
    targets = topk_teacher_targets(head(h_t), 4)
    chunked = chunked_topk_divergence(h_s, targets, head, "jsd", 0.3, chunk_size=4)
    chunked.sum().backward()
    grads = h_s.grad.clone(), head.weight.grad.clone()
    h_s.grad, head.weight.grad = None, None
    plain = topk_tail_divergence(head(h_s), *targets, "jsd", 0.3)
    plain.sum().backward()
    assert_close(chunked, plain)
    assert_close(grads[0], h_s.grad) and assert_close(grads[1], head.weight.grad)


def test_empty_tail_has_finite_grads(logits):
    s, t = logits
    s = s.clone().requires_grad_(True)
    topk_tail_divergence(s, *topk_teacher_targets(t, V), "reverse_kl").sum().backward()
    assert torch.isfinite(s.grad).all()
    with pytest.raises(ValueError, match="k must"):
        topk_teacher_targets(t, V + 1)


def _verified_episode(policy):
    env = ScriptedEnv(num_tasks=1, episode_steps=3, verify_every=1)
    cfg = RolloutConfig(max_turns=3, max_new_tokens=8)
    return rollout(policy.model.eval(), policy.tokenizer, env, env.tasks()[0], cfg)


def test_distillation_top_k_vs_exact(policy):
    """The option plugs into the objective: k = V reproduces the exact loss, small k is a lower bound."""
    ep = _verified_episode(policy)
    vocab = policy.head.weight.shape[0]
    losses = {}
    for k in (None, vocab, 8):
        obj = Distillation(chunk_size=16, teacher_top_k=k)
        losses[k] = obj.loss(policy, ep, obj.prepare(policy, ep)).loss
    assert_close(losses[vocab], losses[None], rtol=1e-4, atol=1e-6)
    assert losses[8] <= losses[None] + 1e-6 and losses[8] > 0
    with pytest.raises(ValueError, match="teacher_top_k"):
        Distillation(teacher_top_k=0)


def test_gradient_checkpointing_gives_the_same_gradients(policy):
    from tests.conftest import TINY

    ep = _verified_episode(policy)
    obj = Distillation(chunk_size=16)
    grads, calls = [], []  # calls: saved activation elements
    for checkpointing in (False, True):
        torch.manual_seed(0)
        pol = load_policy(dataclasses.replace(TINY, gradient_checkpointing=checkpointing))
        with torch.no_grad():  # a non-zero adapter so that the loss has a gradient everywhere
            for name, p in pol.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
        pol.model.train()
        prepared = obj.prepare(pol, ep)
        saved = []  # tensors autograd keeps from the forward (checkpointed layers keep only their inputs)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            loss = obj.loss(pol, ep, prepared).loss
        loss.backward()
        calls.append(sum(saved))
        grads.append({n: p.grad.clone() for n, p in pol.model.named_parameters() if p.grad is not None})
    assert calls[1] < 0.6 * calls[0]  # checkpointing: most activations are recomputed, not kept
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 0
    for name in grads[0]:
        assert_close(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-7)
