"""The vllm engine (``model.rollout.engine: vllm``): a vLLM server in its own venv (``make install-vllm``).

Its episodes equal the reference ``hf`` engine's (float32) for the base and after every update (never
stale weights), it keeps the rollout's stop/budget rules, and its server never outlives the engine
or the process that started it. The tests that start a server (~40 s each on 2 CPU cores) are slow
and skipped unless ``.venv-vllm`` has vLLM; one server serves the module.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lit_ascent.engines import close_engines, engine_for
from lit_ascent.engines.server_process import sweep_stale_dirs
from lit_ascent.engines.vllm import REPO_ROOT, VLLMEngine, VLLMSettings
from lit_ascent.envs import ScriptedEnv
from lit_ascent.rollout import RolloutConfig
from test_engines import _episode, _perturb, _same


def _vllm_problem() -> str | None:
    try:
        VLLMSettings().check_installed()
    except ValueError as err:
        return str(err)
    return None


_PROBLEM = _vllm_problem()
needs_vllm = pytest.mark.skipif(_PROBLEM is not None, reason=f"vLLM not installed ({_PROBLEM}); `make install-vllm`")


def tiny_policy():
    """The project's tiny random Llama, 4 heads of 32 (vLLM's CPU attention needs a head size >= 32),
    with the rank-4 all-linear LoRA ``load_policy`` gives it."""
    from peft import LoraConfig, get_peft_model

    from lit_ascent.models import Policy
    from lit_ascent.tiny import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer(hidden=128)
    lora = LoraConfig(r=4, lora_alpha=8.0, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    return Policy(get_peft_model(model, lora).eval(), tok)


@pytest.fixture(scope="module")
def served():
    """(policy, its vllm engine): one server for the module."""
    policy = tiny_policy()
    engine = engine_for("vllm", policy.model, VLLMSettings())
    yield policy, engine
    close_engines(policy.model)


def test_missing_install_names_the_option():
    with pytest.raises(ValueError, match=r"model\.rollout\.vllm\.python: .*/nonexistent not found.*make install-vllm"):
        RolloutConfig(engine="vllm", vllm=VLLMSettings(python="/nonexistent"))
    RolloutConfig(engine="hf", vllm=VLLMSettings(python="/nonexistent"))  # only the vllm engine needs it
    with pytest.raises(ValueError, match=r"model\.rollout\.vllm\.port"):
        VLLMSettings(port=-1)
    with pytest.raises(ValueError, match=r"model\.rollout\.vllm\.startup_timeout_s"):
        VLLMSettings(startup_timeout_s=0)
    with pytest.raises(ValueError, match=r"model\.rollout\.vllm\.extra_args"):
        VLLMSettings(extra_args="--enforce-eager")


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("stop_after_action", [True, False])
def test_episodes_equal_hf_for_the_base_and_after_each_update(served, stop_after_action):
    policy, engine = served
    env = ScriptedEnv(num_tasks=2, episode_steps=6, verify_every=1)
    runs = []
    for seed in (None, 1, 2, None):  # base, two updates, back to a zero adapter: never stale weights
        _perturb(policy.model, seed)
        pushes = engine.perf.get("pushes", 0)
        ref = _episode(policy, env, "hf", stop_after_action=stop_after_action)
        got = _episode(policy, env, "vllm", stop_after_action=stop_after_action)
        _same(got, ref)
        assert engine.perf.get("pushes", 0) == pushes + (seed is not None)  # pushed once per change, base: none
        again = _episode(policy, env, "vllm", stop_after_action=stop_after_action)
        _same(again, ref)  # unchanged weights: no push, same episode (prefix cache of this adapter)
        assert engine.perf.get("pushes", 0) == pushes + (seed is not None)
        assert got.timings["engine_requests"] == len(got.turns) and got.timings["engine_request_s"] > 0
        runs.append(ref.token_ids)
    assert runs[0] != runs[1] != runs[2] and runs[3] == runs[0]  # the updates changed the episodes


@needs_vllm
@pytest.mark.slow
def test_disabled_adapter_decodes_the_base(served):
    policy, _ = served
    _perturb(policy.model, 3)
    env = ScriptedEnv(num_tasks=2, episode_steps=6, verify_every=1)
    adapted = _episode(policy, env, "vllm")
    with policy.model.disable_adapter():
        base = _episode(policy, env, "vllm")
        _same(base, _episode(policy, env, "hf"))
    assert base.token_ids != adapted.token_ids
    _same(_episode(policy, env, "vllm"), adapted)


@needs_vllm
@pytest.mark.slow
def test_stop_rules_and_budget_match_the_greedy_loop(served):
    """Stop id included (closed), budget respected, should_stop cut after the token that triggers it,
    across turns of one episode, exactly as the hf engine's loop."""
    policy, engine = served
    _perturb(policy.model, 7)  # varied tokens, so a stop id can sit inside the output
    hf = engine_for("hf", policy.model)
    prompt = policy.tokenizer("<|im_start|>user\nhello<|im_end|>\n", add_special_tokens=False).input_ids

    def both(stop_ids, steps):
        outs = []
        for eng in (engine, hf):
            dec = eng.decoder(stop_ids)
            dec.extend(prompt)
            outs.append([dec.generate(budget, should_stop) if budget else dec.extend(ids)
                         for budget, should_stop, ids in steps])
        assert outs[0] == outs[1]
        return outs[0]

    (free, closed), = both(set(), [(20, None, None)])
    assert len(free) == 20 and not closed
    k = next(i for i in range(1, 20) if free[i] not in free[:i])
    (cut, closed), = both({free[k]}, [(20, None, None)])
    assert cut == free[:k + 1] and closed
    j = max(1, k - 1)
    (cut, closed), = both(set(), [(20, lambda out: len(out) > j, None)])
    assert cut == free[:j + 1] and not closed
    # turns: budget cut, an observation, a should_stop cut, another observation, the rest
    obs = policy.tokenizer("obs\n", add_special_tokens=False).input_ids
    both({free[k]}, [(3, None, None), (0, None, obs), (9, lambda out: out[-1] == out[0], None),
                     (0, None, obs), (12, None, None)])


@needs_vllm
@pytest.mark.slow
def test_failed_start_raises_with_the_log_and_command():
    policy = tiny_policy()
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"(?s)exited with code .*command: .*--no-such-flag.*last 30 lines"):
        VLLMEngine(policy.model, VLLMSettings(extra_args=["--no-such-flag"]))
    assert time.perf_counter() - t0 < 120


CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    sys.path.insert(0, {tests!r})
    from test_engine_vllm import tiny_policy
    from lit_ascent.engines.vllm import VLLMEngine
    policy = tiny_policy()
    engine = VLLMEngine(policy.model)
    print(engine.pid, engine.tmp, flush=True)
    time.sleep(600)
""")


def _gone(pid: int, timeout_s: float = 60.0) -> bool:
    """True once neither ``pid`` nor any process of its group (the server's children) is left."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = subprocess.run(["pgrep", "-g", str(pid)], capture_output=True).returncode == 0
        if not alive and not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(0.5)
    return False


@needs_vllm
@pytest.mark.slow
def test_server_dies_with_its_parent_process():
    code = CHILD.format(root=str(REPO_ROOT), tests=str(Path(__file__).parent))
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=str(REPO_ROOT))
    try:
        line = child.stdout.readline().split()
        assert len(line) == 2 and line[0].isdigit(), f"the child did not start a server: {line!r}"
        pid, tmp = int(line[0]), Path(line[1])
        assert Path(f"/proc/{pid}").exists() and tmp.exists()
        os.kill(child.pid, signal.SIGKILL)  # no finalizer, no atexit: only PR_SET_PDEATHSIG is left
        child.wait(10)
        assert _gone(pid), f"the vLLM server {pid} outlived its SIGKILLed parent"
        assert tmp.exists() and not (tmp / "base" / "model.safetensors").exists()  # weights dropped once loaded
        sweep_stale_dirs()  # what the next engine does first: the dead process's dir goes
        assert not tmp.exists()
    finally:
        if child.poll() is None:
            child.kill()


@needs_vllm
@pytest.mark.slow
def test_close_stops_the_server_and_removes_its_files(served):  # last: closes the module's server
    policy, engine = served
    pid, tmp = engine.pid, engine.tmp
    assert Path(f"/proc/{pid}").exists() and tmp.exists()
    close_engines(policy.model)
    assert _gone(pid, 30) and not tmp.exists()
    engine.close()  # idempotent
