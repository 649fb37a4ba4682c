"""Shared fixtures: a tiny random policy (float32) and the scripted environment."""
from __future__ import annotations

import pytest
import torch

from lit_ascent.envs import ScriptedEnv, parse_action
from lit_ascent.models import LoraSettings, ModelConfig, load_policy
from lit_ascent.chat import chat_prompt_ids
from lit_ascent.trajectory import ROLE_ASSISTANT, ROLE_OBSERVATION, ROLE_PROMPT, Episode, Task, Turn

TINY = ModelConfig(name_or_path="tiny-random", dtype="float32", lora=LoraSettings(rank=4, alpha=8.0))


def hand_episode(tokenizer, texts: list[str], valid: list[bool] | None = None, task_id: str = "t",
                 system: str = "SYS", first: str = "Goal: x", observation=lambda t: f"obs {t}",
                 verified: bool = True) -> Episode:
    """A hand-written episode in the rollout's layout: prompt, then per turn the assistant text
    closed by the end-of-turn token and a user observation (no generation: fast, controlled)."""
    ep = Episode(task=Task("scripted", task_id), system=system, first_observation=first, verified=verified)

    def append(ids, role, turn):
        ep.token_ids.extend(ids), ep.roles.extend([role] * len(ids)), ep.turn_ids.extend([turn] * len(ids))

    append(chat_prompt_ids(tokenizer, system, first), ROLE_PROMPT, -1)
    ep.prompt_len = len(ep.token_ids)
    for t, text in enumerate(texts):
        start = len(ep.token_ids)
        append(tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id], ROLE_ASSISTANT, t)
        ok = True if valid is None else valid[t]
        ep.turns.append(Turn(t, text, parse_action(text), observation(t), ok, (start, len(ep.token_ids))))
        segment = f"\n<|im_start|>user\n{observation(t)}<|im_end|>\n<|im_start|>assistant\n"
        append(tokenizer(segment, add_special_tokens=False).input_ids, ROLE_OBSERVATION, t)
    return ep


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: needs the real model or a real environment (make test-slow)")
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one; scripts/gpu_check.sh)")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one intra-op thread is faster, and far faster on a shared CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def policy():
    torch.manual_seed(0)
    return load_policy(TINY)


@pytest.fixture
def scripted():
    return ScriptedEnv(num_tasks=4, episode_steps=2, verify_every=2)
