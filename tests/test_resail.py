"""ReSAIL objective: SGS sensitivity and selection, TLB weights, PR retention (tiny model, fp32)."""
import math

import pytest
import torch
from torch.testing import assert_close

from lit_ascent.objectives import Distillation, ReSAIL
from lit_ascent.objectives.losses import pi_sensitivity
from lit_ascent.trajectory import Episode
from tests.conftest import hand_episode

PI = "Hindsight: a verified successful attempt.\nStep 1:\nThought: open the box first.\nAction: open box"


def make_episode(tok, k: int, num_turns: int) -> Episode:
    """A verified episode with ``num_turns`` hand-written turns (no generation: fast, controlled)."""
    texts = [f"Thought: step {t} of {k}.\nAction: do {k}-{t}\n" for t in range(num_turns)]
    return hand_episode(tok, texts, task_id=f"task-{k}", system="Solve the task.", first=f"Goal {k}.",
                        observation=lambda t: "ok")


def grads(policy, loss) -> torch.Tensor:
    policy.model.zero_grad(set_to_none=True)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in policy.trainable_parameters()])


def close(actual, expected, rtol=1e-4):
    actual, expected = actual.detach(), expected.detach()
    assert_close(actual, expected, rtol=rtol, atol=rtol * float(expected.abs().max()))


def test_sensitivity_zero_without_pi_and_pi_steps_ranked_first(policy):
    tok = policy.tokenizer
    eps = [make_episode(tok, 0, 2), make_episode(tok, 1, 2)]
    prep = ReSAIL(selection_ratio=0.5).prepare_batch(policy, eps, ["", PI])  # "" = no PI at all
    assert_close(prep[0].scores, torch.zeros(2))
    assert (prep[1].scores > 0).all()
    # K = ceil(0.5 * 4) = 2: exactly the two steps whose PI changes the teacher
    assert prep[0].selected.tolist() == [False, False]
    assert prep[1].selected.tolist() == [True, True]


def test_sensitivity_is_token_mean_js_of_the_two_teacher_views(policy):
    tok = policy.tokenizer
    ep = make_episode(tok, 3, 3)
    obj = ReSAIL(selection_ratio=0.5, chunk_size=7)  # chunked != one chunk
    p = obj.prepare_batch(policy, [ep], [PI])[0]
    with policy.teacher():
        with_pi = policy.logits(p.teacher_ids, p.positions + p.offset)
        without = policy.logits(ep.ids(), p.positions)
    close(p.scores, pi_sensitivity(with_pi, without, p.steps, p.num_steps))


def test_selection_stats_count_the_invalid_steps_kept(policy):
    tok = policy.tokenizer
    texts = [f"Thought: step {t}.\nAction: do {t}\n" for t in range(3)]
    eps = [hand_episode(tok, texts, valid=[True, False, False], task_id="a"), make_episode(tok, 1, 1)]
    obj = ReSAIL(selection_ratio=0.5)
    prep = obj.prepare_batch(policy, eps, ["", PI])  # the no-PI episode's steps score 0: K = 2 of 4 kept
    assert prep[0].invalid.tolist() == [False, True, True] and prep[1].invalid.tolist() == [False]
    prep[0].selected, prep[1].selected = torch.tensor([False, True, False]), torch.tensor([True])  # fixed by hand
    stats = obj.loss_batch(policy, eps, prep).metrics
    assert stats["resail/invalid_share"] == pytest.approx(2 / 4)
    assert stats["resail/selected_invalid_share"] == pytest.approx(1 / 2)  # kept: a's step 1 (invalid), b's step 0


@pytest.mark.parametrize("rho", [0.25, 1.0])
def test_valid_steps_only_never_distils_an_invalid_step(policy, rho):
    tok = policy.tokenizer
    texts = [f"Thought: step {t}.\nAction: do {t}\n" for t in range(4)]
    eps = [hand_episode(tok, texts, valid=[False, True, False, True], task_id="a"), make_episode(tok, 1, 2)]
    obj = ReSAIL(selection_ratio=rho, valid_steps_only=True)
    prep = obj.prepare_batch(policy, eps, [PI, ""])  # the PI steps (some invalid) outscore the no-PI ones
    selected = torch.cat([p.selected for p in prep])
    invalid = torch.cat([p.invalid for p in prep])
    assert not (selected & invalid).any()
    assert int(selected.sum()) == math.ceil(rho * 4)  # K over the 4 valid steps of U
    if rho == 0.25:  # the most PI-sensitive valid step: one of episode a's (with PI), not b's
        assert prep[0].selected.any() and not prep[1].selected.any()
    assert obj.loss_batch(policy, eps, prep).metrics["resail/selected_invalid_share"] == 0.0
    all_invalid = [hand_episode(tok, texts[:2], valid=[False, False])]
    nothing = ReSAIL(selection_ratio=rho, valid_steps_only=True, retention_weight=0.0)
    assert nothing.loss_batch(policy, all_invalid, nothing.prepare_batch(policy, all_invalid, [PI])) is None


def test_ascent_valid_steps_only_drops_the_invalid_turns_tokens(policy):
    from lit_ascent.objectives.base import student_targets

    texts = [f"Thought: step {t}.\nAction: do {t}\n" for t in range(3)]
    ep = hand_episode(policy.tokenizer, texts, valid=[True, False, True])
    pos, _ = Distillation(valid_steps_only=True).targets(ep)
    every, _, _ = student_targets(ep)
    lo, hi = ep.turns[1].span  # turn 1's assistant tokens: predicted from positions lo - 1 .. hi - 2
    assert sorted(pos.tolist()) == [i for i in every.tolist() if not lo <= i + 1 < hi]
    assert 0 < len(pos) < len(every)
    obj = Distillation(valid_steps_only=True)
    assert torch.isfinite(obj.loss(policy, ep, obj.prepare(policy, ep)).loss)
    rejected = hand_episode(policy.tokenizer, texts[:1], valid=[False])
    assert obj.prepare(policy, rejected) is None  # no valid turn: no target
    assert Distillation().targets(ep)[0].tolist() == every.tolist()  # the default distils every turn


@pytest.mark.parametrize("rho", [0.05, 0.3, 0.5, 1.0])
def test_selected_count_is_ceil_rho_steps(policy, rho):
    eps = [make_episode(policy.tokenizer, k, n) for k, n in enumerate([1, 2, 4])]  # |U| = 7 steps
    prep = ReSAIL(selection_ratio=rho).prepare_batch(policy, eps)
    selected = torch.cat([p.selected for p in prep])
    assert len(selected) == 7
    assert int(selected.sum()) == math.ceil(rho * 7)
    if rho == 1.0:
        assert selected.all()


def test_tlb_gives_each_selected_trajectory_weight_one_over_batch(policy):
    tok = policy.tokenizer
    eps = [make_episode(tok, k, n) for k, n in enumerate([2, 3, 1])]
    texts = [PI, "", PI]  # trajectory 1 has zero sensitivity: never selected below
    obj = ReSAIL(selection_ratio=0.5, retention_weight=0.0)  # K = ceil(0.5 * 6) = 3
    prep = obj.prepare_batch(policy, eps, texts)
    assert [int(p.selected.sum()) for p in prep] == [2, 0, 1]
    g_batch = grads(policy, obj.loss_batch(policy, eps, prep).loss)
    # each trajectory alone (same selection, |B| = 1) is its per-trajectory mean
    g0 = grads(policy, obj.loss_batch(policy, [eps[0]], [prep[0]]).loss)
    g2 = grads(policy, obj.loss_batch(policy, [eps[2]], [prep[2]]).loss)
    close(g_batch, (g0 + g2) / 3)
    # the token mean (no TLB) weights by token count instead: a different gradient
    token_mean = ReSAIL(selection_ratio=0.5, retention_weight=0.0, trajectory_balance=False)
    g_tok = grads(policy, token_mean.loss_batch(policy, eps, prep).loss)
    assert not torch.allclose(g_tok, g_batch, rtol=1e-3, atol=0)


def test_rho_one_without_tlb_or_pr_is_plain_distillation(policy):
    ep = make_episode(policy.tokenizer, 5, 3)
    obj = ReSAIL(selection_ratio=1.0, trajectory_balance=False, retention_weight=0.0)
    ref = Distillation()
    close(obj.loss(policy, ep, obj.prepare(policy, ep)).loss, ref.loss(policy, ep, ref.prepare(policy, ep)).loss)


def test_retention_is_zero_for_a_fresh_adapter(policy):
    eps = [make_episode(policy.tokenizer, k, 2) for k in range(2)]
    obj = ReSAIL(retention_weight=0.5)
    prep = obj.prepare_batch(policy, eps)
    ret = obj.retention_loss(policy, list(zip(eps, prep)))
    assert_close(ret, torch.tensor(0.0), atol=1e-7, rtol=0)
    out = obj.loss_batch(policy, eps, prep)
    assert out.metrics["loss/retention"] == pytest.approx(0.0, abs=1e-7)


def test_retention_gradient_points_toward_the_teacher(policy):
    torch.manual_seed(1)
    with torch.no_grad():  # move the student away from the teacher
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    eps = [make_episode(policy.tokenizer, k, 2) for k in range(2)]
    obj = ReSAIL(retention_weight=1.0)
    prep = obj.prepare_batch(policy, eps)
    pairs = list(zip(eps, prep))
    before = obj.retention_loss(policy, pairs)
    assert before > 0
    grads(policy, before)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p -= 0.5 * p.grad
    after = obj.retention_loss(policy, pairs)
    assert after < before


def test_unselected_trajectories_cost_no_student_forward(policy, monkeypatch):
    eps = [make_episode(policy.tokenizer, k, 2) for k in range(4)]
    obj = ReSAIL(selection_ratio=0.05, retention_weight=0.0)  # K = 1 of 8 steps
    prep = obj.prepare_batch(policy, eps)
    calls = []
    hidden = policy.hidden
    monkeypatch.setattr(policy, "hidden", lambda ids: calls.append(len(ids)) or hidden(ids))
    obj.loss_batch(policy, eps, prep)
    assert len(calls) == 1


@pytest.mark.parametrize("kwargs, name", [({"selection_ratio": 0.0}, "selection_ratio"),
                                          ({"selection_ratio": 1.5}, "selection_ratio"),
                                          ({"retention_weight": -0.1}, "retention_weight"),
                                          ({"divergence": "kl"}, "divergence")])
def test_bad_arguments_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ReSAIL(**kwargs)


def test_online_stream_runs_with_the_resail_overlay(tmp_path):
    from lit_ascent.cli import main

    cli = main(["fit", "--config", "configs/debug.yaml", "--config", "configs/resail/online_resail.yaml",
                "--trainer.logger.init_args.save_dir", str(tmp_path), "--data.num_tasks", "2",
                "--data.env.init_args.verify_every", "1", "--report.verbose", "false"])
    obj = cli.model.objective
    assert isinstance(obj, ReSAIL)
    assert (obj.selection_ratio, obj.retention_weight, obj.trajectory_balance) == (0.25, 0.5, True)
    assert cli.model.counters["updates"] == 2
