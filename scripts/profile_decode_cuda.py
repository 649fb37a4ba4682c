"""Where the hf engine's decode time goes on a CUDA GPU (docs/results/gpu/profile_hf.txt).

    python scripts/profile_decode_cuda.py

SmolLM2's architecture with random weights (``lit_ascent.bench.cuda``): decode tokens/s with a non-zero
and a zero LoRA, then ``torch.profiler`` over 16 decoded tokens, ops sorted by CPU time.
"""
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lit_ascent.bench.cuda import smollm2_shaped  # noqa: E402
from lit_ascent.bench.engines import perturb  # noqa: E402
from lit_ascent.engines import engine_for  # noqa: E402
from lit_ascent.options import parse_options  # noqa: E402


@dataclass
class ProfileOptions:
    """The command line of ``python scripts/profile_decode_cuda.py`` (none: the sizes are fixed)."""


def decoder(policy, ids):
    dec = engine_for("hf", policy.model).decoder(set())
    dec.extend(ids)
    dec.generate(4)
    return dec


def main(argv: list[str] | None = None) -> None:
    parse_options(ProfileOptions, argv, prog="python scripts/profile_decode_cuda.py", description=__doc__)
    for dt in (torch.float32, torch.bfloat16):
        policy = smollm2_shaped(dt, "cuda")
        ids = list(range(100, 356))
        for scale, label in ((2e-3, "lora"), (0.0, "zero adapter")):
            perturb(policy.model, scale)
            dec = decoder(policy, ids)
            torch.cuda.synchronize()
            t = time.perf_counter()
            dec.generate(32)
            torch.cuda.synchronize()
            print(dt, label, f"{32 / (time.perf_counter() - t):.1f} tok/s", flush=True)
        perturb(policy.model)
        dec = decoder(policy, ids)
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            dec.generate(16)
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=14, max_name_column_width=40))


if __name__ == "__main__":
    main()
