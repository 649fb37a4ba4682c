"""Teacher input: PI rendering, the invalid-turn filter, token alignment."""
from __future__ import annotations

import pytest
import torch

from lit_ascent.objectives import Distillation
from lit_ascent.privileged import render_privileged, teacher_sequence
from lit_ascent.trajectory import ROLE_ASSISTANT, Episode, Turn, target_positions
from tests.conftest import hand_episode


def _episode(tokenizer) -> Episode:
    """A hand-built two-turn episode: turn 0 invalid, turn 1 valid."""
    texts = ["Thought: try.\nAction: bad move", "Thought: now.\nAction: good move"]
    return hand_episode(tokenizer, texts, valid=[False, True], observation=lambda t: "obs")


@pytest.mark.parametrize("content", ["actions", "reasoning_actions", "full"])
def test_render_contents(content):
    turns = [Turn(0, "Thought: a\nAction: go", "go", "You went.", True, (0, 1))]
    text = render_privileged(turns, content)
    assert "go" in text
    assert ("Thought: a" in text) == (content != "actions")
    assert ("You went." in text) == (content == "full")


def test_teacher_tokens_align_with_student(policy):
    ep = _episode(policy.tokenizer)
    ids, offset = teacher_sequence(policy.tokenizer, ep, "PI TEXT")
    assert offset > 0
    assert ids[ep.prompt_len + offset:] == ep.token_ids[ep.prompt_len:]
    pos = target_positions(ep.roles)
    assert all(ids[p + 1 + offset] == ep.token_ids[p + 1] for p in pos.tolist())
    assert "PI TEXT" in policy.tokenizer.decode(ids[: ep.prompt_len + offset])


def test_filter_changes_teacher_input_not_student_positions(policy):
    ep = _episode(policy.tokenizer)
    obj = Distillation(chunk_size=8)
    unfiltered = teacher_sequence(policy.tokenizer, ep, obj.privileged_text(ep))[0]
    pos_before = obj.prepare(policy, ep)[0].clone()
    ep.pi_valid_only = True  # what InvalidTurnFilter sets
    filtered = teacher_sequence(policy.tokenizer, ep, obj.privileged_text(ep))[0]
    pos_after = obj.prepare(policy, ep)[0]
    text = policy.tokenizer.decode(filtered)
    assert filtered != unfiltered
    assert "bad move" not in text.split("<|im_start|>user")[0] and "good move" in text
    torch.testing.assert_close(pos_before, pos_after)
    assert len(pos_after) == sum(r == ROLE_ASSISTANT for r in ep.roles)


def test_distillation_loss_is_zero_at_start_and_has_grad(policy):
    ep = _episode(policy.tokenizer)
    obj = Distillation(pi_content="actions", chunk_size=5)
    # with no PI the teacher sees the student's own prompt: a fresh LoRA (B = 0) gives loss 0
    prepared = obj.prepare(policy, ep)
    out = obj.loss(policy, ep, prepared)
    assert out.loss.requires_grad and torch.isfinite(out.loss) and out.loss > 0  # PI changes the teacher
    out.loss.backward()
    grads = [p.grad for p in policy.trainable_parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("kwargs, word", [({"divergence": "tv"}, "divergence"), ({"beta": 1.5}, "beta"),
                                          ({"pi_content": "all"}, "pi_content"), ({"chunk_size": 0}, "chunk_size")])
def test_bad_objective_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        Distillation(**kwargs)
