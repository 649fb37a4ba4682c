"""Divergences against naive float64 references, at their limits, chunked == unchunked."""
import math

import pytest
import torch
from torch.testing import assert_close

from lit_ascent.objectives.divergences import (
    DIVERGENCES,
    checkpointed_chunks,
    chunked_token_divergence,
    forward_kl,
    generalized_jsd,
    reverse_kl,
    token_divergence,
)

N, V, D = 6, 7, 5


def _probs(logits):
    return torch.softmax(logits.double(), dim=-1).tolist()


def ref_kl(a_logits, b_logits):
    """KL(a || b) per row as an explicit python sum of a_v * log(a_v / b_v)."""
    rows = []
    for a, b in zip(_probs(a_logits), _probs(b_logits)):
        rows.append(sum(av * math.log(av / bv) for av, bv in zip(a, b) if av > 0))
    return torch.tensor(rows, dtype=torch.float32)


def ref_jsd(student_logits, teacher_logits, beta):
    """beta KL(q||m) + (1-beta) KL(p||m), m = beta q + (1-beta) p, explicit sums."""
    rows = []
    for p, q in zip(_probs(student_logits), _probs(teacher_logits)):
        m = [beta * qv + (1 - beta) * pv for pv, qv in zip(p, q)]
        kl_qm = sum(qv * math.log(qv / mv) for qv, mv in zip(q, m))
        kl_pm = sum(pv * math.log(pv / mv) for pv, mv in zip(p, m))
        rows.append(beta * kl_qm + (1 - beta) * kl_pm)
    return torch.tensor(rows, dtype=torch.float32)


@pytest.fixture
def logits():
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, V, generator=g) * 2, torch.randn(N, V, generator=g) * 2


def test_kls_match_reference(logits):
    s, t = logits
    assert_close(forward_kl(s, t), ref_kl(t, s))
    assert_close(reverse_kl(s, t), ref_kl(s, t))


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.9])
def test_jsd_matches_reference(logits, beta):
    s, t = logits
    assert_close(generalized_jsd(s, t, beta), ref_jsd(s, t, beta))


def test_jsd_endpoints_are_the_two_kls(logits):
    s, t = logits
    assert_close(generalized_jsd(s, t, 0.0), ref_kl(t, s))  # forward KL(q || p)
    assert_close(generalized_jsd(s, t, 1.0), ref_kl(s, t))  # reverse KL(p || q)


def test_jsd_scaled_limits_approach_the_endpoints(logits):
    # The mixture convention is the one continuous with the endpoints once
    # scaled: JSD_b / b -> KL(q||p) as b -> 0, JSD_b / (1-b) -> KL(p||q) as b -> 1.
    s, t = logits
    fkl, rkl = forward_kl(s, t), reverse_kl(s, t)
    for eps, tol in [(1e-2, 0.3), (1e-3, 0.06), (1e-4, 0.01)]:
        assert_close(generalized_jsd(s, t, eps) / eps, fkl, rtol=tol, atol=0)
        assert_close(generalized_jsd(s, t, 1 - eps) / eps, rkl, rtol=tol, atol=0)


def test_jsd_half_is_symmetric_and_bounded(logits):
    s, t = logits
    js = generalized_jsd(s, t, 0.5)
    assert_close(js, generalized_jsd(t, s, 0.5))
    assert bool((js >= 0).all()) and bool((js <= math.log(2) + 1e-6).all())
    for beta in (0.2, 0.7):  # 0 <= JSD_beta <= binary entropy H(beta)
        h = -beta * math.log(beta) - (1 - beta) * math.log(1 - beta)
        assert bool((generalized_jsd(s, t, beta) <= h + 1e-6).all())


@pytest.mark.parametrize("kind", DIVERGENCES)
@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
def test_identical_inputs_give_zero(logits, kind, beta):
    s, _ = logits
    assert_close(token_divergence(s, s.clone(), kind, beta), torch.zeros(N), atol=1e-6, rtol=0)


def test_forward_kl_gradient_is_p_minus_q_over_n(logits):
    s, t = logits
    s = s.clone().requires_grad_()
    forward_kl(s, t).mean().backward()
    expected = (torch.softmax(s.detach(), -1) - torch.softmax(t, -1)) / N
    assert_close(s.grad, expected)


@pytest.mark.parametrize("kind", DIVERGENCES)
def test_bf16_inputs_compute_in_float32(logits, kind):
    s, t = (x.bfloat16() for x in logits)
    out = token_divergence(s, t, kind)
    assert out.dtype == torch.float32
    assert_close(out, token_divergence(s.float(), t.float(), kind))
    ref = {"forward_kl": ref_kl(t, s), "reverse_kl": ref_kl(s, t), "jsd": ref_jsd(s, t, 0.5)}
    assert_close(out, ref[kind])


def test_zero_probability_entries_stay_finite(logits):
    s, t = logits
    t = t.clone()
    t[:, 0] = float("-inf")  # teacher rules out token 0
    s = s.clone().requires_grad_()
    out = forward_kl(s, t)
    assert_close(out, ref_kl(t, s))
    out.sum().backward()
    assert bool(torch.isfinite(s.grad).all())


@pytest.mark.parametrize("kind", DIVERGENCES)
def test_empty_input(kind):
    out = token_divergence(torch.zeros(0, V, dtype=torch.bfloat16), torch.zeros(0, V), kind)
    assert out.shape == (0,) and out.dtype == torch.float32


def test_bad_arguments_raise():
    x = torch.zeros(2, V)
    with pytest.raises(ValueError, match="'tv'"):
        token_divergence(x, x, "tv")
    with pytest.raises(ValueError, match="beta"):
        generalized_jsd(x, x, 1.5)
    head = torch.nn.Linear(D, V)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_token_divergence(torch.zeros(2, D), torch.zeros(2, D), head, "jsd", chunk_size=0)


def _chunk_setup(n=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(D, V)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, D, generator=g))
    hs = torch.randn(n, D, generator=g).requires_grad_()
    ht = torch.randn(n, D, generator=g)
    return head, hs, ht


def _value_and_grads(loss_fn, head, hs):
    head.zero_grad()
    hs.grad = None
    out = loss_fn()
    (out * torch.arange(1, out.numel() + 1)).sum().backward()  # position-weighted
    return out.detach(), hs.grad.clone(), head.weight.grad.clone(), head.bias.grad.clone()


@pytest.mark.parametrize("kind", DIVERGENCES)
@pytest.mark.parametrize("chunk_size", [1, 3, 10, 64])
def test_chunked_equals_unchunked(kind, chunk_size):
    head, hs, ht = _chunk_setup()
    full = _value_and_grads(
        lambda: token_divergence(head(hs), head(ht).detach(), kind, 0.3), head, hs
    )
    chunked = _value_and_grads(
        lambda: chunked_token_divergence(hs, ht, head, kind, 0.3, chunk_size), head, hs
    )
    for a, b in zip(full, chunked):
        assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_chunked_keeps_no_logits_for_backward():
    head, hs, ht = _chunk_setup()
    ht.requires_grad_()
    saved_shapes = []

    def pack(t):
        saved_shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = chunked_token_divergence(hs, ht, head, "forward_kl", chunk_size=4)
    assert not [s for s in saved_shapes if s and s[-1] == V], saved_shapes
    out.sum().backward()
    assert ht.grad is None  # the teacher never receives gradient


def test_chunked_empty_batch_backward_gives_zero_grads():
    head, hs, ht = _chunk_setup(n=0)
    out = chunked_token_divergence(hs, ht, head, "jsd")
    assert out.shape == (0,)
    out.sum().backward()
    assert_close(head.weight.grad, torch.zeros(V, D))


def test_checkpointed_chunks_concatenate_the_chunks_and_pass_none_through():
    head, hs, ht = _chunk_setup(n=7)

    def fn(h, t, none):
        assert none is None
        return torch.stack([head(h).sum(-1), head(t).sum(-1)], dim=-1)  # (n, 2)

    full = _value_and_grads(lambda: fn(hs, ht, None)[:, 0] * fn(hs, ht, None)[:, 1], head, hs)
    chunked = _value_and_grads(lambda: checkpointed_chunks(fn, hs, ht, None, chunk_size=3).prod(-1), head, hs)
    for a, b in zip(full, chunked):
        assert_close(b, a)
