"""Sampled-token baselines and ReSAIL reductions against naive references."""
import math

import pytest
import torch
from torch.testing import assert_close

from lit_ascent.objectives.losses import (
    RunningMoments,
    masked_mean,
    pi_sensitivity,
    policy_gradient_loss,
    sampled_kl,
    sampled_logprobs,
    segment_mean,
    select_top_steps,
    token_nll,
    top_k_count,
    trajectory_balanced_mean,
)

N, V = 6, 5


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(N, V, generator=g) * 2
    targets = torch.randint(0, V, (N,), generator=g)
    mask = torch.tensor([True, False, True, True, False, True])
    return logits, targets, mask


def ref_logprob(row, y):
    z = sum(math.exp(v) for v in row)
    return row[y] - math.log(z)


def ref_js(a_row, b_row):
    pa = torch.softmax(torch.tensor(a_row, dtype=torch.float64), 0).tolist()
    pb = torch.softmax(torch.tensor(b_row, dtype=torch.float64), 0).tolist()
    m = [(x + y) / 2 for x, y in zip(pa, pb)]
    kl = lambda a: sum(x * math.log(x / z) for x, z in zip(a, m))  # noqa: E731
    return 0.5 * kl(pa) + 0.5 * kl(pb)


def test_sampled_logprobs_and_nll_match_reference(batch):
    logits, targets, mask = batch
    ref = [ref_logprob(r, y) for r, y in zip(logits.tolist(), targets.tolist())]
    assert_close(sampled_logprobs(logits, targets), torch.tensor(ref))
    assert_close(token_nll(logits, targets), torch.tensor(-sum(ref) / N))
    kept = [-lp for lp, m in zip(ref, mask.tolist()) if m]
    assert_close(token_nll(logits, targets, mask), torch.tensor(sum(kept) / len(kept)))


def test_nll_ignores_placeholder_targets_and_takes_bf16(batch):
    logits, targets, mask = batch
    padded = torch.where(mask, targets, torch.full_like(targets, -100))
    out = token_nll(logits.bfloat16(), padded, mask)
    assert out.dtype == torch.float32
    assert_close(out, token_nll(logits.bfloat16().float(), targets, mask))


def test_all_masked_gives_zero_with_zero_grads(batch):
    logits, targets, _ = batch
    logits = logits.clone().requires_grad_()
    none = torch.zeros(N, dtype=torch.bool)
    loss = token_nll(logits, targets, none) + policy_gradient_loss(
        sampled_logprobs(logits, targets), 1.0, none
    )
    loss.backward()
    assert_close(loss.detach(), torch.tensor(0.0))
    assert_close(logits.grad, torch.zeros(N, V))


def test_masked_mean_never_sees_masked_nans():
    x = torch.tensor([1.0, float("nan"), 3.0], requires_grad=True)
    out = masked_mean(x, torch.tensor([True, False, True]))
    out.backward()
    assert_close(out.detach(), torch.tensor(2.0))
    assert_close(x.grad, torch.tensor([0.5, 0.0, 0.5]))
    assert_close(masked_mean(torch.zeros(0)), torch.tensor(0.0))


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_policy_gradient_moves_sampled_token(batch, advantage):
    logits, targets, mask = batch
    param = logits.clone().requires_grad_()
    before = sampled_logprobs(param, targets).detach()
    policy_gradient_loss(sampled_logprobs(param, targets), advantage, mask).backward()
    with torch.no_grad():
        param -= 0.1 * param.grad  # one SGD step
    delta = sampled_logprobs(param, targets).detach() - before
    assert bool((advantage * delta[mask] > 0).all())
    assert_close(delta[~mask], torch.zeros(int((~mask).sum())))


def test_policy_gradient_per_token_advantages(batch):
    _, _, mask = batch
    logp = torch.randn(N).requires_grad_()
    adv = torch.linspace(-1, 1, N)
    policy_gradient_loss(logp, adv, mask).backward()
    assert_close(logp.grad, torch.where(mask, -adv / mask.sum(), torch.zeros(N)))


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_estimators_zero_when_equal(estimator):
    logp = torch.log_softmax(torch.randn(N, V), -1)[:, 0]
    assert_close(sampled_kl(logp, logp.clone(), estimator), torch.zeros(N))


def test_kl_estimators_unbiased_and_nonnegative():
    g = torch.Generator().manual_seed(0)
    logp, logref = torch.log_softmax(torch.tensor([[1.0, 0.2, -0.5, 0.0, -1.0],
                                                   [0.0, 0.8, 0.3, -1.2, 0.5]]), -1)
    exact = sum(math.exp(a) * (a - b) for a, b in zip(logp.tolist(), logref.tolist()))
    y = torch.multinomial(logp.exp(), 200_000, replacement=True, generator=g)
    k1, k2, k3 = (sampled_kl(logp[y], logref[y], e) for e in ("k1", "k2", "k3"))
    assert_close(k1.mean(), torch.tensor(exact, dtype=torch.float32), atol=0.01, rtol=0)
    assert_close(k3.mean(), torch.tensor(exact, dtype=torch.float32), atol=0.01, rtol=0)
    assert bool((k2 >= 0).all()) and bool((k3 >= 0).all())
    with pytest.raises(ValueError, match="'k4'"):
        sampled_kl(logp, logref, "k4")


def test_running_moments_welford_and_resume():
    xs = [0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    full = RunningMoments()
    for x in xs:
        full.update(x)
    ref = torch.tensor(xs, dtype=torch.float64)
    assert math.isclose(full.mean, ref.mean().item(), rel_tol=1e-12)
    assert math.isclose(full.std, ref.std(unbiased=False).item(), rel_tol=1e-12)
    assert math.isclose(full.normalize(1.0), (1.0 - full.mean) / full.std, rel_tol=1e-12)

    first = RunningMoments()
    for x in xs[:3]:
        first.update(x)
    state = first.state_dict()
    assert all(type(v) is float for v in state.values())
    resumed = RunningMoments()
    resumed.load_state_dict(state)
    for x in xs[3:]:
        resumed.update(x)
    assert resumed.state_dict() == full.state_dict()


def test_running_moments_degenerate_std_only_centres():
    m = RunningMoments()
    assert m.normalize(1.0) == 1.0  # no data yet: mean 0, no scaling
    m.update(1.0)
    assert m.std == 0.0 and m.normalize(1.0) == 0.0


def test_segment_mean_matches_loop():
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    idx = torch.tensor([0, 0, 2, -1, 2])
    assert_close(segment_mean(vals, idx, 4), torch.tensor([1.5, 0.0, 4.0, 0.0]))


def test_pi_sensitivity_matches_reference_and_ranks_pi_steps():
    g = torch.Generator().manual_seed(0)
    without = torch.randn(N, V, generator=g)
    with_pi = without.clone()
    with_pi[4:] += 3 * torch.randn(2, V, generator=g)  # PI only moves step 2's tokens
    steps = torch.tensor([0, 0, 1, 1, 2, 2])
    scores = pi_sensitivity(with_pi.requires_grad_(), without, steps, 4)
    assert not scores.requires_grad and scores.dtype == torch.float32
    rows = [ref_js(a, b) for a, b in zip(with_pi.tolist(), without.tolist())]
    ref = torch.tensor([0.0, 0.0, (rows[4] + rows[5]) / 2, 0.0])  # step 3 is empty
    assert_close(scores, ref, atol=1e-6, rtol=1e-5)
    assert bool(scores[2] > scores[0]) and bool(scores[2] > scores[1])
    assert_close(pi_sensitivity(without, without, steps, 3), torch.zeros(3), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "rho,num_steps,k",
    [(0.05, 100, 5), (0.07, 100, 7), (0.05, 3, 1), (0.5, 3, 2), (0.34, 3, 2), (1.0, 7, 7),
     (0.3, 0, 0)],
)
def test_top_k_count_is_ceil(rho, num_steps, k):
    assert top_k_count(rho, num_steps) == k
    assert int(select_top_steps(torch.rand(num_steps), rho).sum()) == k


def test_select_top_steps_picks_highest_and_breaks_ties_low_first():
    scores = torch.tensor([0.1, 0.5, 0.5, 0.9, 0.5, float("nan")])
    assert select_top_steps(scores, 0.5).tolist() == [False, True, True, True, False, False]
    assert select_top_steps(scores, 1.0).all()
    assert select_top_steps(torch.zeros(0), 0.05).shape == (0,)
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="rho"):
            select_top_steps(scores, bad)


def test_trajectory_balanced_weights():
    # |B| = 4: traj 0 has 2 of its 3 steps selected, traj 1 its only step,
    # traj 2 none of its 2 (one with a NaN loss), traj 3 has no steps at all.
    losses = torch.tensor([1.0, 2.0, 4.0, 8.0, 16.0, float("nan")], requires_grad=True)
    traj = torch.tensor([0, 0, 0, 1, 2, 2])
    sel = torch.tensor([True, False, True, True, False, False])
    out = trajectory_balanced_mean(losses, traj, sel, 4)
    out.backward()
    assert_close(out.detach(), torch.tensor(((1.0 + 4.0) / 2 + 8.0) / 4))
    assert_close(losses.grad, torch.tensor([1 / 8, 0.0, 1 / 8, 1 / 4, 0.0, 0.0]))
    per_traj = torch.zeros(4).index_add(0, traj, losses.grad)
    assert_close(per_traj, torch.tensor([1 / 4, 1 / 4, 0.0, 0.0]))  # 1/|B| or 0


def test_trajectory_balanced_all_unselected_is_zero():
    losses = torch.ones(3, requires_grad=True)
    traj, none = torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.bool)
    out = trajectory_balanced_mean(losses, traj, none, 1)
    out.backward()
    assert_close(out.detach(), torch.tensor(0.0))
    assert_close(losses.grad, torch.zeros(3))
    empty = trajectory_balanced_mean(torch.zeros(0), traj[:0], none[:0], 0)
    assert_close(empty, torch.tensor(0.0))
