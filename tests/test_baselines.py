"""Online baselines: imitation / RFT (+KL), REINFORCE(++), TT-OPSD."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lit_ascent.objectives import TTOPSD, Distillation, Imitation, Reinforce, ReinforcePP
from lit_ascent.trajectory import Episode
from tests.conftest import hand_episode

TEXTS = ["Thought: alpha first.\nAction: take alpha", "Thought: bravo next.\nAction: craft bravo",
         "Thought: charlie last.\nAction: get charlie"]


def make_episode(tokenizer, texts=TEXTS, verified=True) -> Episode:
    """A hand-built episode: prompt, then per turn the assistant text and an observation."""
    return hand_episode(tokenizer, texts, verified=verified)


def perturb_adapter(policy, scale: float = 0.5) -> None:
    """Give the LoRA B matrices non-zero values, so the student differs from the initial model."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)


def sampled_token_logprobs(policy, ep: Episode) -> torch.Tensor:
    """Independent reference: full forward, log-softmax, pick each assistant token."""
    ids = ep.ids()
    logp = F.log_softmax(policy.model(input_ids=ids[None]).logits[0].float(), -1)  # (T, V)
    assistant = ep.assistant_mask()[1:]
    return logp[:-1][assistant].gather(-1, ids[1:][assistant, None]).squeeze(-1)


def run_loss(obj, policy, ep):
    return obj.loss(policy, ep, obj.prepare(policy, ep))


def test_rft_loss_is_token_mean_nll(policy):
    perturb_adapter(policy)
    ep = make_episode(policy.tokenizer)
    out = run_loss(Imitation(chunk_size=7), policy, ep)
    expected = -sampled_token_logprobs(policy, ep).mean()
    torch.testing.assert_close(out.loss, expected, rtol=1e-5, atol=1e-5)
    assert out.metrics["loss/nll"] == pytest.approx(float(expected.detach()), rel=1e-5)


def test_imitation_chunked_equals_unchunked(policy):
    perturb_adapter(policy)
    ep = make_episode(policy.tokenizer)
    grads = []
    for chunk in (16, 4096):
        policy.zero_grad(set_to_none=True)
        loss = run_loss(Imitation(kl_weight=0.3, chunk_size=chunk), policy, ep).loss
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in policy.trainable_parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def mean_logprob_after_step(policy, ep, obj, lr=0.5) -> tuple[float, float]:
    before = float(sampled_token_logprobs(policy, ep).mean().detach())
    opt = torch.optim.SGD(policy.trainable_parameters(), lr=lr)
    run_loss(obj, policy, ep).loss.backward()
    opt.step()
    with torch.no_grad():
        after = float(sampled_token_logprobs(policy, ep).mean())
    return before, after


@pytest.mark.parametrize("verified,moments,sign", [
    (True, {"count": 0.0, "mean": 0.0, "m2": 0.0}, +1),   # A = 1 - 0 > 0
    (False, {"count": 2.0, "mean": 0.5, "m2": 0.5}, -1),  # A = 0 - 0.5 < 0
])
def test_reinforce_step_moves_sampled_logprob_with_advantage(policy, verified, moments, sign):
    ep = make_episode(policy.tokenizer, verified=verified)
    obj = Reinforce()
    obj.load_state_dict({"rewards": moments})
    before, after = mean_logprob_after_step(policy, ep, obj)
    assert sign * (after - before) > 1e-4


def test_reinforce_advantage_uses_baseline_before_update(policy):
    obj = Reinforce()
    advantages = []
    for verified in (True, True, False, True):
        prepared = obj.prepare(policy, make_episode(policy.tokenizer, TEXTS[:1], verified))
        advantages.append(prepared[3])
    # baselines seen: 0, 1, 1, 2/3
    assert advantages == pytest.approx([1.0, 0.0, -1.0, 1.0 / 3.0])
    assert obj.rewards.mean == pytest.approx(0.75)


def test_reinforce_pp_normalised_advantage(policy):
    obj = ReinforcePP(kl_weight=0.0)
    advantages = [obj.prepare(policy, make_episode(policy.tokenizer, TEXTS[:1], v))[3] for v in (True, False, True)]
    # 1st: centred only (no spread yet): 1 - 0; 2nd: 0 - 1 (std 0); 3rd: (1 - 0.5) / 0.5
    assert advantages == pytest.approx([1.0, -1.0, 1.0])


@pytest.mark.parametrize("cls", [Reinforce, ReinforcePP])
def test_reinforce_state_dict_round_trip(policy, cls):
    obj = cls()
    for verified in (True, False, False, True, False):
        obj.prepare(policy, make_episode(policy.tokenizer, TEXTS[:1], verified))
    restored = cls()
    restored.load_state_dict(obj.state_dict())
    assert restored.state_dict() == obj.state_dict()
    ep = make_episode(policy.tokenizer, TEXTS[:1], True)
    assert restored.prepare(policy, ep)[3] == pytest.approx(obj.prepare(policy, ep)[3])
    assert restored.rewards.count == 6


def test_kl_penalties_vanish_for_fresh_adapter(policy):
    ep = make_episode(policy.tokenizer)
    rft_kl = run_loss(Imitation(kl_weight=1.0), policy, ep)
    assert abs(rft_kl.metrics["loss/kl"]) < 1e-6
    torch.testing.assert_close(rft_kl.loss, torch.tensor(rft_kl.metrics["loss/nll"]))
    pp = run_loss(ReinforcePP(kl_weight=1.0), policy, ep)
    assert abs(pp.metrics["loss/kl"]) < 1e-6
    assert pp.metrics["loss/total"] == pytest.approx(pp.metrics["loss/pg"], abs=1e-6)


def assistant_logits(policy, ep: Episode) -> torch.Tensor:
    """(N, V) full-forward logits at the positions that predict assistant tokens."""
    return policy.model(input_ids=ep.ids()[None]).logits[0, :-1][ep.assistant_mask()[1:]].float()


def test_kl_penalties_match_reference_once_student_moved(policy):
    perturb_adapter(policy)
    ep = make_episode(policy.tokenizer)
    with torch.no_grad():
        student = assistant_logits(policy, ep)
        with policy.model.disable_adapter():
            initial = assistant_logits(policy, ep)
    logp, logq = F.log_softmax(student, -1), F.log_softmax(initial, -1)
    full_kl = (logp.exp() * (logp - logq)).sum(-1).mean()  # KL(student || initial), token mean
    out = run_loss(Imitation(kl_weight=0.5), policy, ep)
    assert out.metrics["loss/kl"] == pytest.approx(float(full_kl), rel=1e-4)
    assert out.metrics["loss/total"] == pytest.approx(out.metrics["loss/nll"] + 0.5 * float(full_kl), rel=1e-4)
    targets = ep.ids()[1:][ep.assistant_mask()[1:]]
    d = (logp - logq).gather(-1, targets[:, None]).squeeze(-1)  # log pi(y) - log pi_ref(y)
    k3 = (torch.exp(-d) - 1 + d).mean()
    pp = run_loss(ReinforcePP(kl_weight=1.0), policy, ep)
    assert pp.metrics["loss/kl"] == pytest.approx(float(k3), rel=1e-4)
    assert float(k3) > 1e-4


def test_tt_opsd_teacher_sees_only_current_turn(policy):
    tok, ep = policy.tokenizer, make_episode(policy.tokenizer)
    obj = TTOPSD(chunk_size=16)
    for turn in ep.turns:
        ids, offset = obj.turn_teacher_ids(tok, ep, turn)
        prompt = tok.decode(ids[: ep.prompt_len + offset])
        for other in ep.turns:
            assert (other.text.strip() in prompt) == (other.index == turn.index)
        # then the identical episode ids, up to the end of this turn
        assert ids[ep.prompt_len + offset:] == ep.token_ids[ep.prompt_len: turn.span[1]]


def test_tt_opsd_teacher_hidden_per_turn(policy):
    tok, ep = policy.tokenizer, make_episode(policy.tokenizer)
    obj = TTOPSD(chunk_size=16)
    pos, end, t_hidden = obj.prepare(policy, ep)
    turn = ep.turns[1]
    rows = [i for i, p in enumerate(pos.tolist()) if ep.turn_ids[p + 1] == 1]
    ids, offset = obj.turn_teacher_ids(tok, ep, turn)
    with policy.teacher():
        expected = policy.hidden(torch.tensor(ids))[pos[rows] + offset]
    torch.testing.assert_close(t_hidden[rows], expected, rtol=1e-5, atol=1e-5)
    out = obj.loss(policy, ep, (pos, end, t_hidden))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.trainable_parameters())


def test_tt_opsd_equals_ascent_on_a_single_turn(policy):
    perturb_adapter(policy)
    ep = make_episode(policy.tokenizer, TEXTS[:1])
    a = run_loss(TTOPSD(chunk_size=16), policy, ep).loss
    b = run_loss(Distillation(chunk_size=16), policy, ep).loss
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("make,arg", [
    (lambda: Imitation(kl_weight=-0.1), "objective.kl_weight"),
    (lambda: Imitation(chunk_size=0), "objective.chunk_size"),
    (lambda: Reinforce(chunk_size=-1), "objective.chunk_size"),
    (lambda: ReinforcePP(kl_weight=float("nan")), "objective.kl_weight"),
    (lambda: ReinforcePP(kl_estimator="k9"), "objective.kl_estimator"),
    (lambda: TTOPSD(pi_content="everything"), "objective.pi_content"),
])
def test_bad_arguments_name_the_argument(make, arg):
    with pytest.raises(ValueError, match=arg):
        make()
