"""Learning diagnostics against hand computations: repeated actions, action tokens, action drift."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import hand_episode

from callbacks.diagnostics import CollapseDiagnostics
from lit_ascent.collapse import action_positions
from lit_ascent.envs.base import action_span, action_token_mask
from lit_ascent.metrics import action_drift, repeated_actions
from lit_ascent.outcome import TaskOutcome


@pytest.mark.parametrize("actions,rate,back_to_back,run", [
    ([], 0.0, 0.0, 0),
    (["a", "b", "c"], 0.0, 0.0, 1),
    (["a", "a", "a", "a"], 3 / 4, 3 / 4, 4),                 # the collapse: one action in a loop
    (["a", "b", "a", "b", "a"], 3 / 5, 0.0, 1),              # repeats without a run
    (["a", None, "a", "a", None, None], 2 / 6, 1 / 6, 2),    # no action never repeats and breaks a run
])
def test_repeated_actions(actions, rate, back_to_back, run):
    stats = repeated_actions(actions)
    assert stats["diagnostics/repeat_action_rate"] == pytest.approx(rate)
    assert stats["diagnostics/back_to_back_rate"] == pytest.approx(back_to_back)
    assert stats["diagnostics/longest_action_run"] == run


def test_action_span_and_token_mask(policy):
    text = "Thought: get wood\nAction: get 1 oak log\n"
    start, end = action_span(text)
    assert text[start:end] == "get 1 oak log"
    assert action_span("no action here") is None
    tok = policy.tokenizer  # byte-level: one token per character
    ids = tok(text, add_special_tokens=False).input_ids + [tok.eos_token_id]
    mask = action_token_mask(tok, ids)
    assert "".join(tok.decode([i]) for i, m in zip(ids, mask) if m) == "get 1 oak log"
    assert not any(action_token_mask(tok, tok("Thought: hm", add_special_tokens=False).input_ids))


def _perturbed(policy, seed=1, scale=0.3):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return policy


def test_action_drift_matches_a_hand_computation(policy):
    texts = ["Thought: a\nAction: go north", "Thought: b\nAction: take key"]
    ep = hand_episode(policy.tokenizer, texts)
    pos, turn_of = action_positions(policy.tokenizer, ep, max_tokens=10_000)
    ids = ep.token_ids
    assert "".join(policy.tokenizer.decode([ids[p + 1]]) for p in pos) == "go northtake key"
    assert turn_of.tolist() == [0] * 8 + [1] * 8

    cb = CollapseDiagnostics(probe_episodes=2)
    cb.maybe_add_probe(policy.tokenizer, ep)
    _perturbed(policy)
    got = cb.measure(policy)

    with torch.no_grad():  # by hand: full logits of both models, KL summed over the vocabulary
        s = policy.model(input_ids=torch.tensor([ids])).logits[0, pos]
        with policy.model.disable_adapter():
            q = policy.model(input_ids=torch.tensor([ids])).logits[0, pos]
    p_s, p_q = torch.softmax(s.double(), -1), torch.softmax(q.double(), -1)
    kl = (p_s * (p_s.log() - p_q.log())).sum(-1).mean()
    changed = {int(t) for t, a, b in zip(turn_of, s.argmax(-1), q.argmax(-1)) if a != b}
    assert got["diagnostics/action_kl"] == pytest.approx(float(kl), rel=1e-4)
    assert got["diagnostics/action_changes"] == len(changed) and got["diagnostics/probe_actions"] == 2
    assert got["diagnostics/action_kl"] > 0


def test_action_drift_pure_function():
    student = torch.tensor([[0.0, 2.0], [1.0, 0.0], [0.0, 0.0]])
    initial = torch.tensor([[0.0, 1.0], [0.0, 1.0], [0.0, 0.0]])
    out = action_drift(student, initial, torch.tensor([5, 5, 6]))
    def kl(a, b):
        pa, pb = torch.softmax(a, -1), torch.softmax(b, -1)
        return float((pa * (pa / pb).log()).sum())
    want = (kl(student[0], initial[0]) + kl(student[1], initial[1]) + 0.0) / 3
    assert out["diagnostics/action_kl"] == pytest.approx(want, rel=1e-6)
    assert out["diagnostics/action_changes"] == 1 and out["diagnostics/probe_actions"] == 2
    assert not math.isnan(action_drift(torch.zeros(0, 2), torch.zeros(0, 2), torch.zeros(0))["diagnostics/action_kl"])


def test_probe_set_is_fixed_and_measured_only_when_the_weights_change(policy, monkeypatch):
    cb = CollapseDiagnostics(every_n_tasks=0, probe_episodes=1)
    module = SimpleNamespace(policy=policy, counters={"updates": 0}, log_dict=lambda *a, **k: None)
    first = hand_episode(policy.tokenizer, ["Action: go north"], task_id="a")
    second = hand_episode(policy.tokenizer, ["Action: go south"], task_id="b")
    first, second = TaskOutcome(first, "float32"), TaskOutcome(second, "float32")
    cb.on_episode(None, module, first)
    assert first.diagnostics["diagnostics/action_kl"] == 0.0  # zero fast weights: no drift, no forward
    calls = []
    monkeypatch.setattr(cb, "measure", lambda p: calls.append(1) or {"diagnostics/action_kl": 0.5})
    _perturbed(policy)
    module.counters["updates"] = 1
    cb.on_episode(None, module, second)
    cb.on_episode(None, module, second)
    assert len(cb.probes) == 1 and len(calls) == 1  # one probe kept; one measurement per weight change
    assert second.diagnostics["diagnostics/action_kl"] == 0.5
    restored = CollapseDiagnostics(probe_episodes=1)
    restored.load_state_dict(cb.state_dict())
    torch.testing.assert_close(restored.probes, cb.probes, rtol=0, atol=0)


def test_bad_diagnostics_settings_name_the_option():
    with pytest.raises(ValueError, match="diagnostics.probe_episodes"):
        CollapseDiagnostics(probe_episodes=-1)
    with pytest.raises(ValueError, match="diagnostics.probe_max_tokens"):
        CollapseDiagnostics(probe_max_tokens=1)


def test_absorbed_fraction_matches_a_hand_computation(policy):
    from lit_ascent.module import OaTTTModule
    from lit_ascent.objectives import Distillation

    objective = Distillation(chunk_size=16)
    module = OaTTTModule(objective=objective)
    module.policy = policy
    ep = hand_episode(policy.tokenizer, ["Thought: a\nAction: go north", "Thought: b\nAction: take key"])
    _perturbed(policy, scale=0.05)  # a student that differs from the teacher
    policy.model.train()
    prepared = objective.prepare(policy, ep)
    loss = objective.loss(policy, ep, prepared).loss
    before = float(loss.detach())
    loss.backward()
    with torch.no_grad():  # one plain gradient step by hand
        for p in policy.trainable_parameters():
            p -= 0.5 * p.grad
    with torch.no_grad():
        after = float(objective.loss(policy, ep, prepared).loss)
    rng = torch.get_rng_state()
    stats = module.absorbed(ep, prepared, before)
    assert stats["update/loss_before"] == before
    assert stats["update/loss_after"] == pytest.approx(after, rel=1e-6)
    assert stats["update/absorbed_fraction"] == pytest.approx(1 - after / before, rel=1e-6)
    assert 0 < stats["update/absorbed_fraction"] < 1  # a gradient step on the same loss removed part of it
    assert policy.model.training and torch.equal(torch.get_rng_state(), rng)  # mode and RNG as they were
