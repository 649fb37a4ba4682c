"""Run the comparison matrix (method x seed) as train.py subprocesses.

    python -m lit_ascent.results.compare --env-config configs/textcraft/ascent.yaml \
        --methods base ascent rft rft_kl reinforce reinforce_pp tt_opsd \
        --seeds 0 1 2 --num-tasks 20 --out runs/compare
    python -m lit_ascent.results.report runs/compare --out docs/results/<name>

Every run is ``train.py fit --config ENV [--config EXTRA ...] --config METHOD``
plus fixed logger folders, so run k of method m always lands in
``OUT/m/seed<k>`` (its experience.jsonl, TensorBoard events, config.yaml,
adapter/ and train.log). Extra configs come before the method overlay, so they
cannot undo what defines the method (objective, gate). A seed sets
``seed_everything`` (LoRA init) and, unless ``--fixed-stream``, ``data.seed``
(stream order and reset seeds); all methods of a seed share the same stream.
A finished run (``done.json`` marker, or an experience log with num_tasks
lines and no stream checkpoint, or a log in the report's archive given by
``--archive``, see ``run_archive``) is skipped. Any other one that holds a stream checkpoint
(``stream_state.pt``, written after every task by the env configs) is continued
from it with ``--ckpt_path <run folder>``, so a long run can be spread over
several sittings (stop it with Ctrl-C or SIGKILL, rerun the same command; a run
killed after its last task finishes its end-of-stream hooks and gets its marker); an
unfinished one without a checkpoint is deleted and run again from the start.

Two executors schedule the same cells (``run_cell``: skip, continue or restart,
run train.py, write the marker): ``serial`` (default) runs them one after the
other here; ``ray`` (``lit_ascent.results.ray_executor``) runs each cell as one Ray task,
every stream at once on a local Ray or a cluster (``--address``), retrying a
failed stream from its checkpoint up to ``--max-retries`` times.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from lit_ascent.options import flag, parse_options
from lit_ascent.records import read_records
from lit_ascent.results.run_archive import LOG_NAME, MARKER, STATE_FILE, archived_path

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "train.py"
METHOD_DIRS = ("configs/methods", "configs/ablations")
CONFIG_ERROR = 2
"""train.py's exit code for a bad config value: the same command would fail again, so it is not retried."""
Executor = Literal["serial", "ray"]
RAY_GROUP = "Ray executor (--executor ray)"
RAY_ONLY = ("address", "cpus_per_stream", "gpus_per_stream", "max_retries")
"""Options of the Ray executor (None unless given)."""
# Runs ``argv[2:]`` in place of this process with no signal blocked (a Ray worker blocks SIGINT, and a child
# inherits that, so it could not be stopped with SIGINT) and, on Linux, asks the kernel to SIGKILL it when its
# parent dies (prctl PR_SET_PDEATHSIG), so a killed compare or Ray worker leaves no train.py writing into a run
# folder that a retry is about to continue (argv[1]: the parent's pid, in case it died before the prctl).
_CHILD = ("import ctypes, os, signal, sys; signal.pthread_sigmask(signal.SIG_SETMASK, []); "
          "sys.platform.startswith('linux') and ctypes.CDLL(None).prctl(1, 9); "
          "os.getppid() == int(sys.argv[1]) or os._exit(137); os.execvp(sys.argv[2], sys.argv[2:])")


@dataclass(frozen=True)
class RunSpec:
    """One cell of the matrix."""

    method: str
    seed: int
    configs: tuple[Path, ...]
    """The method (or ablation) overlays, in the order they are applied."""
    run_dir: Path
    """OUT/<method>/seed<k>: the logger's save_dir/name/version."""


def method_config(name: str, repo: Path = REPO) -> Path:
    """The overlay for ``name``: a YAML path, or configs/methods/<name>.yaml, or configs/ablations/<name>.yaml."""
    if name.endswith((".yaml", ".yml")):
        if not Path(name).is_file():
            raise ValueError(f"--methods: no config file {name!r}")
        return Path(name)
    for folder in METHOD_DIRS:
        path = repo / folder / f"{name}.yaml"
        if path.is_file():
            return path
    raise ValueError(f"--methods: unknown method {name!r} (no {name}.yaml in {', '.join(METHOD_DIRS)})")


def row_name(part: str) -> str:
    """A run folder's name for one overlay: a YAML path's stem, else the name itself."""
    return Path(part).stem if part.endswith((".yaml", ".yml")) else part


def plan(methods: list[str], seeds: list[int], out: Path) -> list[RunSpec]:
    """The matrix, seed-major: every method of seed 0 first, so early results are comparable.

    A method may stack overlays with ``+`` (``procedural+memory_floor``: the method, then the
    ablation); the row is named by its parts."""
    if len(set(methods)) != len(methods):
        raise ValueError(f"--methods has duplicates: {methods}")
    configs = {m: tuple(method_config(part) for part in m.split("+")) for m in methods}
    names = {m: "+".join(row_name(part) for part in m.split("+")) for m in methods}
    return [RunSpec(names[m], seed, configs[m], out / names[m] / f"seed{seed}") for seed in seeds for m in methods]


def train_command(spec: RunSpec, env_config: Path, extra_configs: list[Path], num_tasks: int | None,
                  fixed_stream: bool = False, python: str = sys.executable) -> list[str]:
    """The train.py command line of one run."""
    cmd = [python, str(TRAIN), "fit"]
    for config in (env_config, *extra_configs, *spec.configs):  # extras before the method: they cannot undo it
        cmd += ["--config", str(config)]
    cmd += ["--trainer.logger.init_args.save_dir", str(spec.run_dir.parent.parent),
            "--trainer.logger.init_args.name", spec.run_dir.parent.name,
            "--trainer.logger.init_args.version", spec.run_dir.name,
            "--seed_everything", str(spec.seed)]
    if not fixed_stream:
        cmd += ["--data.seed", str(spec.seed)]
    if num_tasks is not None:
        cmd += ["--data.num_tasks", str(num_tasks)]
    return cmd


def count_records(run_dir: Path) -> int:
    path = run_dir / LOG_NAME
    if not path.is_file():
        return 0
    with open(path) as f:
        return sum(1 for line in f if line.strip())


def is_finished(run_dir: Path, num_tasks: int | None) -> bool:
    """The marker exists, or the experience log holds ``num_tasks`` records of a run without a stream
    checkpoint (one with a checkpoint is continued instead: its end-of-stream hooks may not have run)."""
    if (run_dir / MARKER).is_file():
        return True
    return num_tasks is not None and not (run_dir / STATE_FILE).is_file() and count_records(run_dir) >= num_tasks


def is_archived(spec: RunSpec, archive: Path | None, num_tasks: int | None) -> bool:
    """A report folder's archive (``<report>/runs``) already holds this cell's finished log."""
    if archive is None:
        return False
    path = archived_path(archive, spec.method, spec.run_dir.name)
    return path.is_file() and (num_tasks is None or len(read_records(path)) >= num_tasks)


def resume_command(spec: RunSpec, cmd: list[str]) -> list[str] | None:
    """``cmd`` continued from the cell's stream checkpoint, or None when it has none."""
    if not (spec.run_dir / STATE_FILE).is_file():
        return None
    return [*cmd, "--ckpt_path", str(spec.run_dir)]


def child_command(cmd: list[str]) -> list[str]:
    """``cmd`` as a cell runs it: with no signal blocked, and killed when this process dies (Linux)."""
    return [sys.executable, "-c", _CHILD, str(os.getpid()), *cmd]


def retryable(returncode: int) -> bool:
    """A failed train.py that may succeed when continued from its checkpoint: killed, crashed, out of memory;
    not a bad config value (exit 2), which fails the same way every time."""
    return returncode not in (0, CONFIG_ERROR)


def is_done(spec: RunSpec, num_tasks: int | None, archive: Path | None) -> bool:
    """The cell needs no run: finished in its folder, or in the report's archive."""
    return is_finished(spec.run_dir, num_tasks) or is_archived(spec, archive, num_tasks)


def cell_tag(i: int, n: int, spec: RunSpec) -> str:
    return f"[{i + 1}/{n}] {spec.method} seed {spec.seed}"


def run_cell(spec: RunSpec, cmd: list[str], num_tasks: int | None, env: dict[str, str] | None = None) -> int:
    """Run one cell (continued from its checkpoint, else from scratch); write the marker when it finished.

    ``env`` is added to train.py's environment (the Ray executor's thread counts). The cell's train.log
    gets a line on where and when each attempt started and one on how it ended. Returns train.py's exit code.
    """
    resumed = resume_command(spec, cmd)
    if resumed:
        print(f"  continuing {spec.run_dir} from its checkpoint ({count_records(spec.run_dir)} records)", flush=True)
        cmd = resumed
    elif spec.run_dir.exists():
        shutil.rmtree(spec.run_dir)  # no checkpoint: a one-pass stream's partial log cannot be continued
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(spec.run_dir / "train.log", "a" if resumed else "w") as log:
        log.write(f"# lit_ascent.results.compare: {'continued' if resumed else 'started'} on {socket.gethostname()} "
                  f"at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        log.flush()
        child_env = {**os.environ, **env} if env else None
        rc = subprocess.run(child_command(cmd), stdout=log, stderr=subprocess.STDOUT, env=child_env).returncode
        log.write(f"# lit_ascent.results.compare: train.py exited with {rc} after {time.time() - t0:.0f}s\n")
    records = count_records(spec.run_dir)
    if rc == 0 and num_tasks is not None and records < num_tasks:  # train.py returns 0 only at the stream's end
        print(f"note: {spec.run_dir} holds {records} < {num_tasks} records (the stream has fewer tasks)", flush=True)
    if rc == 0:
        marker = {"method": spec.method, "seed": spec.seed, "records": records,
                  "wall_s": round(time.time() - t0, 1), "resumed": bool(resumed), "command": cmd}
        (spec.run_dir / MARKER).write_text(json.dumps(marker, indent=1))
    return rc


def run_one(spec: RunSpec, cmd: list[str], num_tasks: int | None) -> bool:
    """``run_cell`` for the serial executor: True when the cell finished."""
    return run_cell(spec, cmd, num_tasks) == 0


def run_matrix(specs: list[RunSpec], env_config: Path, extra_configs: list[Path], num_tasks: int | None,
               fixed_stream: bool = False, dry_run: bool = False, archive: Path | None = None,
               ) -> dict[str, list[RunSpec]]:
    """Run every cell that is neither finished nor in ``archive``, in order; returns {"done", "skipped", "failed"}."""
    result: dict[str, list[RunSpec]] = {"done": [], "skipped": [], "failed": []}
    for i, spec in enumerate(specs):
        cmd = train_command(spec, env_config, extra_configs, num_tasks, fixed_stream)
        tag = cell_tag(i, len(specs), spec)
        if is_done(spec, num_tasks, archive):
            print(f"{tag}: finished already, skipped", flush=True)
            result["skipped"].append(spec)
            continue
        print(f"{tag}: {' '.join(cmd)}", flush=True)
        if dry_run:
            continue
        t0 = time.time()
        ok = run_one(spec, cmd, num_tasks)
        status = "done" if ok else f"FAILED (see {spec.run_dir / 'train.log'})"
        print(f"{tag}: {status} in {time.time() - t0:.0f}s", flush=True)
        result["done" if ok else "failed"].append(spec)
    return result


@dataclass
class CompareOptions:
    """The command line of ``python -m lit_ascent.results.compare``."""

    env_config: Path
    """Complete environment config."""
    methods: list[str]
    """Names in configs/methods or configs/ablations, or overlay YAML paths; ``a+b`` stacks overlays in one row."""
    seeds: list[int] = field(default_factory=lambda: [0])
    """Seeds: each sets seed_everything and, unless --fixed-stream, data.seed."""
    num_tasks: int | None = None
    """Stream length (data.num_tasks); None: the config's."""
    out: Path = Path("runs/compare")
    """Folder of the run folders, OUT/<method>/seed<k>."""
    extra_config: list[Path] = field(default_factory=list, metadata={"nargs": "*", "action": "extend"})
    """Overlays applied after the env config and before the method."""
    fixed_stream: bool = False
    """Keep the config's data.seed for every seed (seeds then vary only the LoRA init)."""
    archive: Path | None = None
    """A report's archive (docs/results/<name>/runs): cells whose log is there are skipped."""
    dry_run: bool = False
    """Print the commands, run nothing."""
    executor: Executor = field(default="serial", metadata={"group": RAY_GROUP})
    """serial: one cell after the other, here; ray: every cell as one Ray task, all at once."""
    address: str | None = field(default=None, metadata={"group": RAY_GROUP})
    """Ray to use: None starts a local one; auto joins this machine's cluster; ray://HOST:PORT (Ray Client)
    or HOST:PORT (the head's GCS) joins that one."""
    cpus_per_stream: float | None = field(default=None, metadata={"group": RAY_GROUP})
    """CPUs Ray reserves per stream; also train.py's intra-op threads (None: RaySettings' default)."""
    gpus_per_stream: float | None = field(default=None, metadata={"group": RAY_GROUP})
    """GPUs Ray reserves per stream, fractions allowed: 0.25 puts 4 streams on a GPU (None: RaySettings' default)."""
    max_retries: int | None = field(default=None, metadata={"group": RAY_GROUP})
    """Reruns of a failed stream, each from its checkpoint (None: RaySettings' default)."""

    def __post_init__(self) -> None:
        if self.num_tasks is not None and self.num_tasks < 1:
            raise ValueError(f"--num-tasks must be >= 1, got {self.num_tasks}")
        for path in [self.env_config, *self.extra_config]:
            if not path.is_file():
                raise ValueError(f"no config file {path}")
        if self.executor == "serial":
            given = [flag(name) for name in RAY_ONLY if getattr(self, name) is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: only with --executor ray")
            return
        from lit_ascent.results import ray_executor  # imports ray only when it runs

        problem = ray_executor.settings_error(self.address, self.cpus_per_stream, self.gpus_per_stream,
                                              self.max_retries)
        if problem:
            raise ValueError(problem)


def parse_args(argv: list[str] | None = None) -> CompareOptions:
    return parse_options(CompareOptions, argv, prog="python -m lit_ascent.results.compare", description=__doc__)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        specs = plan(args.methods, args.seeds, args.out)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    if args.executor == "ray" and not args.dry_run:
        from lit_ascent.results import ray_executor

        settings = ray_executor.RaySettings.from_args(args)
        try:
            result = ray_executor.run_matrix(specs, args.env_config, args.extra_config, args.num_tasks,
                                             args.fixed_stream, args.archive, settings)
        except ray_executor.RayUnavailable as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    else:
        result = run_matrix(specs, args.env_config, args.extra_config, args.num_tasks, args.fixed_stream,
                            args.dry_run, args.archive)
    print(f"done {len(result['done'])}, skipped {len(result['skipped'])}, failed {len(result['failed'])}; "
          f"report: python -m lit_ascent.results.report {args.out} --out docs/results/<name>")
    if result.get("stopped"):
        print(f"stopped {len(result['stopped'])} streams; rerun the same command to continue them", file=sys.stderr)
        return 130
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
