"""The guarded optimiser step: a finite step as written out by hand, a non-finite one not taken."""
import pytest
import torch
from torch.testing import assert_close

from lit_ascent.optim import guarded_step


def _setup(seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.nn.Parameter(torch.randn(4, 3, generator=g))
    x = torch.randn(5, 4, generator=g)
    return w, x, torch.optim.AdamW([w], lr=1e-1)


def _loss(w, x):
    return (x @ w).pow(2).mean()


@pytest.mark.parametrize("grad_clip", [0.0, 0.01, 1.0e6])
def test_finite_step_is_backward_clip_step(grad_clip):
    w, x, opt = _setup()
    ref_w, _, ref_opt = _setup()
    out = guarded_step(opt, [w], [_loss(w, x)], grad_clip)
    ref_opt.zero_grad()
    _loss(ref_w, x).backward()
    norm = ref_w.grad.norm()
    if grad_clip:
        torch.nn.utils.clip_grad_norm_([ref_w], grad_clip)
    ref_opt.step()
    assert out.stepped and out.grad_norm == pytest.approx(float(norm))
    assert_close(w, ref_w, rtol=0, atol=0)


def test_losses_accumulate_one_graph_at_a_time():
    w, x, opt = _setup()
    ref_w, _, ref_opt = _setup()
    built = []

    def losses():
        for part in (x[:2], x[2:]):
            built.append(w.grad is None)  # True only for the first: built after the previous backward
            yield _loss(w, part) / 2

    assert guarded_step(opt, [w], losses(), 1.0).stepped and built == [True, False]
    ref_opt.zero_grad()
    ((_loss(ref_w, x[:2]) + _loss(ref_w, x[2:])) / 2).backward()
    torch.nn.utils.clip_grad_norm_([ref_w], 1.0)
    ref_opt.step()
    assert_close(w, ref_w)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_loss_takes_no_step(bad):
    w, x, opt = _setup()
    before = w.detach().clone()
    out = guarded_step(opt, [w], [_loss(w, x), _loss(w, x) * bad], 1.0)
    assert not out.stepped and not opt.state  # AdamW's moments untouched too
    assert_close(w.detach(), before, rtol=0, atol=0)


def test_non_finite_gradient_takes_no_step():
    w, x, opt = _setup()
    before = w.detach().clone()
    loss = torch.sqrt(w - w.detach()).sum()  # 0, with an infinite gradient
    out = guarded_step(opt, [w], [loss], 1.0)
    assert torch.isfinite(loss) and not out.stepped and not torch.isfinite(torch.tensor(out.grad_norm))
    assert_close(w.detach(), before, rtol=0, atol=0)
    assert guarded_step(opt, [w], [_loss(w, x)], 1.0).stepped  # the next step zeroes the bad gradient


def test_negative_clip_is_rejected():
    w, x, opt = _setup()
    with pytest.raises(ValueError, match="grad_clip"):
        guarded_step(opt, [w], [_loss(w, x)], -1.0)
