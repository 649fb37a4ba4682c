"""Chat templating: the token ids of a conversation as the model's chat template renders it.

The student's episode and the teacher's privileged input (``lit_ascent.privileged``)
start from the same ``chat_prompt_ids``; every later turn of an episode appends
``observation_ids``, so the episode stays one append-only token sequence that any
chat template would have rendered the same way.
"""
from __future__ import annotations


def chat_prompt_ids(tokenizer, system: str, user: str) -> list[int]:
    """Token ids of [system, user] rendered with the chat template, ready for the assistant."""
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False).input_ids


def observation_template(tokenizer) -> tuple[str, str, str]:
    """(end_of_turn, before, after): the text the chat template puts around a user reply.

    Found by rendering a conversation with marker strings, so any chat template works.
    """
    a, o = "\u00a7A\u00a7", "\u00a7O\u00a7"
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
            {"role": "assistant", "content": a}, {"role": "user", "content": o}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    between = text.split(a, 1)[1]
    before, after = between.split(o, 1)
    eot = tokenizer.eos_token or ""
    return eot, before, after


def observation_ids(tokenizer, observation: str, turn_closed: bool, template) -> list[int]:
    """Ids appended after an assistant turn: end of turn (if not generated), the reply, next header."""
    eot, before, after = template
    if turn_closed and eot and before.startswith(eot):
        before = before[len(eot):]
    return tokenizer(before + observation + after, add_special_tokens=False).input_ids
