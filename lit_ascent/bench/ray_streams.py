"""Wall clock of the comparison matrix on Ray next to the serial executor: two short streams.

    python -m lit_ascent.bench.ray_streams [--out docs/results/bench_ray]    # SmolLM2 on TextCraft, reference base
    python -m lit_ascent.bench.ray_streams --quick --out /tmp/bench_ray      # debug config: checks the bench end to end

Both executors run the same two streams as ``python -m lit_ascent.results.compare`` subprocesses, so the times
are what a user waits for: Ray's start, imports, model loads and the streams. The streams are one
method with two seeds on one fixed stream (``--fixed-stream``: the seeds change only the LoRA
initialisation), so they carry about the same work and the ideal ratio is 1 / number of cores.
Ray runs first, so the serial run finds the model file in the page cache: the ratio errs high.
Target: Ray / serial <= 0.6 on 2 cores with ``--cpus-per-stream 1``.
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from lit_ascent.options import parse_options
from lit_ascent.results.compare import REPO, plan
from lit_ascent.records import read_records
from lit_ascent.results.run_archive import LOG_NAME

TARGET = 0.6


@dataclass(frozen=True)
class Setup:
    """The two streams."""

    env_config: str
    method: str
    num_tasks: int
    max_turns: int | None
    """Overrides model.rollout.max_turns when set."""
    seeds: tuple[int, ...] = (0, 1)


FULL = Setup("configs/textcraft/ascent.yaml", "ascent", num_tasks=2, max_turns=6)
QUICK = Setup("configs/debug.yaml", "rft", num_tasks=4, max_turns=None)


def compare_command(setup: Setup, out: Path, overlay: Path | None, executor: str) -> list[str]:
    cmd = [sys.executable, "-m", "lit_ascent.results.compare", "--env-config", setup.env_config, "--methods", setup.method,
           "--seeds", *map(str, setup.seeds), "--fixed-stream", "--num-tasks", str(setup.num_tasks), "--out", str(out)]
    if overlay is not None:
        cmd += ["--extra-config", str(overlay)]
    if executor == "ray":
        cmd += ["--executor", "ray", "--cpus-per-stream", "1", "--max-retries", "0"]
    return cmd


def timed_run(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> float:
    """Wall seconds of ``cmd`` (run in the repository, output to ``log``, ``env`` added); exits on failure."""
    print(" ".join(cmd), flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                            env={**os.environ, **env} if env else None).returncode
    wall = time.perf_counter() - t0
    if rc != 0:
        sys.exit(f"failed ({rc}) after {wall:.0f}s; its output: {log}\n" + log.read_text()[-3000:])
    return wall


def outcomes(out: Path, setup: Setup) -> list[list[tuple]]:
    """(task, verified, turns) per task of each stream."""
    return [[(r["task_id"], r["verified"], r["turns"]) for r in read_records(spec.run_dir / LOG_NAME)]
            for spec in plan([setup.method], list(setup.seeds), out)]


def machine() -> dict:
    import ray
    import torch

    return {"date": time.strftime("%Y-%m-%d"), "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "torch": torch.__version__, "ray": ray.__version__,
            "load_avg_1min_start": os.getloadavg()[0]}


def run(setup: Setup, work: Path, serial_threads: int | None = None) -> dict:
    overlay = None
    if setup.max_turns is not None:
        overlay = work / "turns.yaml"
        overlay.write_text(f"model:\n  rollout: {{max_turns: {setup.max_turns}}}\n")
    r: dict = {"setup": asdict(setup), "machine": machine(), "commands": {}, "serial_threads": serial_threads}
    threads = {"OMP_NUM_THREADS": str(serial_threads), "MKL_NUM_THREADS": str(serial_threads)} if serial_threads else None
    for executor in ("ray", "serial"):  # Ray first: the serial run gets the warm page cache
        cmd = compare_command(setup, work / executor, overlay, executor)
        r["commands"][executor] = " ".join(cmd[1:]).replace(str(work), "<tmp>")
        r[f"{executor}_s"] = timed_run(cmd, work / f"{executor}.log", threads if executor == "serial" else None)
    r["machine"]["load_avg_1min_end"] = os.getloadavg()[0]
    r["ratio"] = r["ray_s"] / r["serial_s"]
    r["met"] = r["ratio"] <= TARGET
    r["same_outcomes"] = outcomes(work / "ray", setup) == outcomes(work / "serial", setup)
    return r


def markdown(r: dict, quick: bool) -> str:
    m, s = r["machine"], r["setup"]
    turns = f", {s['max_turns']} turns at most" if s["max_turns"] else ""
    serial_threads = f"{r['serial_threads']} thread(s)" if r["serial_threads"] else "torch's default threads"
    flags = (" --quick" if quick else "") + (f" --serial-threads {r['serial_threads']}" if r["serial_threads"] else "")
    quick_note = ("`--quick` checks the bench itself: the debug streams last seconds, so the ratio measures "
                  "start-up (Ray's, imports), not streams.") if quick else ""
    return "\n".join([
        "# Bench: the comparison matrix on Ray vs serial", "",
        f"{m['date']}; {m['cpu']}, {m['cores']} cores, torch {m['torch']}, ray {m['ray']}; 1-min load average "
        f"{m['load_avg_1min_start']:.1f} at the start, {m['load_avg_1min_end']:.1f} at the end; "
        f"`python -m lit_ascent.bench.ray_streams{flags}`.", "",
        f"Two streams: `{s['env_config']}`, method `{s['method']}`, seeds {', '.join(map(str, s['seeds']))} on one "
        f"fixed stream, {s['num_tasks']} tasks{turns}.", "",
        "| executor | wall-clock s |", "|---|---|",
        f"| serial (one stream after the other, {serial_threads}) | {r['serial_s']:.1f} |",
        f"| ray (`--cpus-per-stream 1`: both at once, 1 thread each) | {r['ray_s']:.1f} |", "",
        f"Ray / serial: **{r['ratio']:.2f}** (target <= {TARGET}: {'met' if r['met'] else 'not met'}). "
        f"Per-task outcomes (task, solved, turns) {'identical' if r['same_outcomes'] else 'differ'} between the "
        "two (with other thread counts, floating-point sums may round differently). " + quick_note, "",
        "Wall-clock includes everything a user waits for: Ray's start, imports, model loads. "
        "Ray runs first, so the serial run finds the model file in the page cache. "
        "Commands (`<tmp>`: a scratch folder):", "",
        *[f"- {executor}: `python {cmd}`" for executor, cmd in r["commands"].items()], ""])


@dataclass
class RayStreamsOptions:
    """The command line of ``python -m lit_ascent.bench.ray_streams``."""

    quick: bool = False
    """Debug config (tiny model, scripted env): the bench itself."""
    out: str = "docs/results/bench_ray"
    """Output path without extension."""
    serial_threads: int | None = None
    """OMP_NUM_THREADS of the serial run (None: torch's, all cores)."""

    def __post_init__(self) -> None:
        if self.serial_threads is not None and self.serial_threads < 1:
            raise ValueError(f"--serial-threads must be >= 1, got {self.serial_threads}")


def main(argv: list[str] | None = None) -> None:
    args = parse_options(RayStreamsOptions, argv, prog="python -m lit_ascent.bench.ray_streams",
                         description=__doc__.split("\n\n")[0])
    with tempfile.TemporaryDirectory(prefix="bench_ray_") as work:
        result = run(QUICK if args.quick else FULL, Path(work), args.serial_threads)
    result["quick"] = args.quick
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(markdown(result, args.quick))
    print(markdown(result, args.quick))


if __name__ == "__main__":
    main()
