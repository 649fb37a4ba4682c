"""Peak memory of one ASCENT update, one child process per case (used by ``lit_ascent.bench``).

    python -m lit_ascent.bench.memory CASE [--dtype auto] [--length 1024]

Cases: ``disabled`` / ``disabled_ckpt`` (the teacher is the adapter-disabled
student, without / with gradient checkpointing), ``two_copy_ckpt`` (the
teacher is a second copy of the weights), ``div_chunked`` / ``div_unchunked``
(the full-vocabulary divergence alone, at SmolLM2's head shape). Prints one
JSON line.

tracemalloc does not see torch's allocations. Each case runs in a fresh child: it builds
what it needs (the GGUF load has its own, larger, transient peak), frees and trims the heap,
resets the kernel's peak-RSS mark (/proc/self/clear_refs "5"), runs the measured step and
reads VmHWM: the peak resident memory of exactly that step, weights and runtime included.
The child fixes glibc's mmap threshold at 1 MiB, so every tensor above it is mmapped and
returns to the OS when freed: RSS tracks the live set, not heap left over from freed chunks.
"""
from __future__ import annotations

import contextlib
import copy
import ctypes
import gc
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lit_ascent.models import ModelConfig, Policy, load_policy, resolve_dtype
from lit_ascent.objectives import Distillation
from lit_ascent.objectives.divergences import chunked_token_divergence, token_divergence
from lit_ascent.options import parse_options
from lit_ascent.chat import chat_prompt_ids
from lit_ascent.trajectory import ROLE_ASSISTANT, ROLE_OBSERVATION, ROLE_PROMPT, Episode, Task, Turn

CASES = ("disabled", "disabled_ckpt", "two_copy_ckpt", "div_chunked", "div_unchunked")


def synthetic_episode(tokenizer, length: int, seed: int = 0) -> Episode:
    """A TextCraft-shaped episode of ``length`` tokens (random assistant/observation ids, 30/20 per turn)."""
    g = torch.Generator().manual_seed(seed)
    ep = Episode(Task("bench", "synthetic"), "You craft items.", "Goal: craft a chest.")
    prompt = chat_prompt_ids(tokenizer, ep.system, ep.first_observation)
    n = ep.prompt_len = len(prompt)
    ep.token_ids, ep.roles, ep.turn_ids = list(prompt), [ROLE_PROMPT] * n, [-1] * n
    t = 0
    while len(ep.token_ids) < length:
        for role, n in ((ROLE_ASSISTANT, 30), (ROLE_OBSERVATION, 20)):
            start = len(ep.token_ids)
            ep.token_ids += torch.randint(100, 20000, (n,), generator=g).tolist()
            ep.roles += [role] * n
            ep.turn_ids += [t] * n
            if role == ROLE_ASSISTANT:
                ep.turns.append(Turn(t, "Thought: get logs\nAction: get 1 oak logs", "get 1 oak logs", "Got 1",
                                     True, (start, start + n)))
        t += 1
    return ep



def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _reset_peak() -> int:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS")


class TwoCopyPolicy(Policy):
    """The alternative design: the teacher is a second, separate copy of the weights."""

    def __init__(self, policy: Policy):
        super().__init__(policy.model, policy.tokenizer)
        self.teacher_copy = copy.deepcopy(policy.model)
        self._teacher_on = False

    @contextlib.contextmanager
    def teacher(self):
        self._teacher_on = True
        try:
            with self.teacher_copy.disable_adapter(), torch.no_grad():
                yield
        finally:
            self._teacher_on = False

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        if not self._teacher_on:
            return super().hidden(ids)
        decoder = self.teacher_copy.get_decoder()
        return decoder(input_ids=ids.to(self.device)[None], use_cache=False).last_hidden_state[0]


def memory_case(case: str, dtype: str, length: int) -> dict:
    """Peak RSS (KiB) of one measured step; runs inside a child process."""
    torch.set_num_threads(1)
    with contextlib.suppress(OSError, AttributeError):  # M_MMAP_THRESHOLD = 1 MiB, fixed: freed tensors leave RSS
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)
    runtime = _status_kib("VmRSS")
    if case.startswith("div_"):  # SmolLM2's head shape (V=49152, d=576), no model needed
        head = torch.nn.Linear(576, 49152, bias=False).to(resolve_dtype(dtype))
        h_s = torch.randn(length, 576, dtype=head.weight.dtype, requires_grad=True)
        h_t = torch.randn(length, 576, dtype=head.weight.dtype)
        before = _reset_peak()
        if case == "div_chunked":
            loss = chunked_token_divergence(h_s, h_t, head, "forward_kl", chunk_size=128).mean()
        else:
            loss = token_divergence(head(h_s), head(h_t).detach(), "forward_kl").mean()
        loss.backward()
    else:
        policy = load_policy(ModelConfig(dtype=dtype, gradient_checkpointing=case.endswith("_ckpt")))
        if case.startswith("two_copy"):
            policy = TwoCopyPolicy(policy)
        episode = synthetic_episode(policy.tokenizer, length)
        obj = Distillation(chunk_size=256)
        policy.model.train()
        before = _reset_peak()
        obj.loss(policy, episode, obj.prepare(policy, episode)).loss.backward()
    return {"case": case, "runtime_kib": runtime, "before_kib": before, "peak_kib": _status_kib("VmHWM")}


def measure_memory(cases: list[str], dtype: str, length: int) -> dict[str, dict]:
    out = {}
    for case in cases:
        cmd = [sys.executable, "-m", "lit_ascent.bench.memory", case, "--dtype", dtype,
               "--length", str(length)]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
        out[case] = json.loads(lines[-1]) if lines else {"case": case, "error": res.stderr[-2000:]}
        print(f"  memory {case}: {out[case].get('peak_kib', 'error')} KiB peak", flush=True)
    return out


@dataclass
class MemoryBenchOptions:
    """The command line of ``python -m lit_ascent.bench.memory``."""

    case: str = field(metadata={"positional": True})
    """What is measured: one of CASES."""
    dtype: str = "auto"
    """Model dtype: auto | bfloat16 | float32."""
    length: int = 1024
    """Episode length in tokens."""

    def __post_init__(self) -> None:
        if self.case not in CASES:
            raise ValueError(f"case must be one of {', '.join(CASES)}, got {self.case!r}")


def main(argv: list[str] | None = None) -> None:
    args = parse_options(MemoryBenchOptions, argv, prog="python -m lit_ascent.bench.memory",
                         description=__doc__.split("\n\n")[0])
    print(json.dumps(memory_case(args.case, args.dtype, args.length)))


if __name__ == "__main__":
    main()
