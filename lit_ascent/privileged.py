"""Privileged information (hindsight): render a verified trajectory as text and
build the teacher's input.

The teacher sees ``system + PI block`` and the same first user message, then the
identical token ids the student generated and observed, so student position p
and teacher position p + offset predict the same token.
"""
from __future__ import annotations

from lit_ascent.chat import chat_prompt_ids
from lit_ascent.trajectory import Episode, Turn

PI_CONTENTS = ("actions", "reasoning_actions", "full")
PI_HEADER = "Hindsight: a verified successful attempt at this exact task. Use it to act well."


def render_turn(turn: Turn, content: str) -> str:
    """One step of the PI block: the action, the agent's text, or text + observation."""
    if content == "actions":
        return f"Action: {turn.action}"
    body = turn.text.strip()
    if content == "full":
        body += f"\nObservation: {turn.observation.strip()}"
    return body


def render_steps(turns: list[Turn], content: str = "reasoning_actions", valid_only: bool = False) -> str:
    """``Step k:`` and each turn's rendering; ``valid_only`` drops turns with d_{i,t} = 0 (invalid-turn filter)."""
    if content not in PI_CONTENTS:
        raise ValueError(f"pi_content must be one of {PI_CONTENTS}, got {content!r}")
    kept = [t for t in turns if t.valid or not valid_only]
    return "\n".join(f"Step {k + 1}:\n{render_turn(t, content)}" for k, t in enumerate(kept))


def render_privileged(turns: list[Turn], content: str = "reasoning_actions", valid_only: bool = False) -> str:
    """The PI text z_i for ``turns``: the header, then ``render_steps``."""
    steps = render_steps(turns, content, valid_only)
    return "\n".join([PI_HEADER, steps]) if steps else PI_HEADER


def privileged_system(system: str, pi_text: str) -> str:
    """The teacher's system message: the agent's instructions, then the PI block at a fixed point."""
    return f"{system}\n\n{pi_text}"


def teacher_sequence(tokenizer, episode: Episode, pi_text: str) -> tuple[list[int], int]:
    """(teacher ids, offset): privileged prompt + the episode's ids after its prompt.

    Teacher position p + offset sees the same continuation as student position p.
    """
    prompt = chat_prompt_ids(tokenizer, privileged_system(episode.system, pi_text), episode.first_observation)
    ids = prompt + episode.token_ids[episode.prompt_len:]
    return ids, len(prompt) - episode.prompt_len


# --- Helpers for ReSAIL probes and OEL-style lessons (added; the functions above are unchanged).

LESSON_PROMPT = ("Write a short lesson (at most three sentences) that would help an agent solve this task "
                 "next time. Name the key steps and the mistakes to avoid.")
LESSON_HEADER = "Lesson from a verified successful attempt at this exact task. Use it to act well."


def render_actions(actions: list[str]) -> str:
    """The PI block of a demonstration given only as actions (e.g. a JSONL of expert actions)."""
    turns = [Turn(k, f"Action: {a}", a, "", True, (0, 0)) for k, a in enumerate(actions)]
    return render_privileged(turns, "actions")


def lesson_request(episode: Episode, content: str = "reasoning_actions") -> str:
    """The user message asking the model for a lesson about ``episode`` (OEL-style PI)."""
    trajectory = render_privileged(episode.turns, content, valid_only=True)
    return f"Task:\n{episode.first_observation}\n\n{trajectory}\n\n{LESSON_PROMPT}"


def lesson_block(lesson: str) -> str:
    """The PI text built from a generated lesson."""
    return f"{LESSON_HEADER}\n{lesson.strip()}"
