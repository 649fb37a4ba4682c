"""Shared fixtures: a tiny random policy (float32) and the scripted environment."""
from __future__ import annotations

import pytest
import torch

from lit_ascent.envs import ScriptedEnv
from lit_ascent.models import LoraSettings, ModelConfig, load_policy

TINY = ModelConfig(name_or_path="tiny-random", dtype="float32", lora=LoraSettings(rank=4, alpha=8.0))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: needs the real model or a real environment (make test-slow)")


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
