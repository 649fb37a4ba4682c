"""The comparison matrix on Ray: every (method, seed) stream at once, on this machine or a cluster.

    python -m lit_ascent.results.compare --env-config configs/textcraft/ascent.yaml --methods base ascent rft \
        --seeds 0 1 2 --out runs/compare --executor ray [--address auto] [--cpus-per-stream 1] \
        [--gpus-per-stream 0.25] [--max-retries 2]

A stream is sequential (task i+1 sees the weights after task i's update), so the unit of parallelism is
the stream: each cell that ``compare.is_done`` does not skip becomes one Ray task, which calls
``compare.run_cell``, the serial executor's cell (continue from the stream checkpoint or restart,
train.py as a subprocess, the ``done.json`` marker), with ``OMP_NUM_THREADS`` = ``--cpus-per-stream``. Ray reserves
``--cpus-per-stream`` CPUs and ``--gpus-per-stream`` GPUs per task and sets ``CUDA_VISIBLE_DEVICES``;
a stream without a GPU gets none visible.

A stream that fails (train.py crashed or was killed, the Ray worker died, Ray's memory monitor killed
it) is reported with its cell and submitted again, continuing from its checkpoint, up to
``--max-retries`` times; the others go on. A bad config value (train.py exit 2) is not retried.
Ctrl-C cancels every task: train.py gets SIGINT (SIGKILL ``stop_grace_s`` later), and the stream
checkpoints, written atomically after each task, let the same command continue.

The driver prints a line per finished task of each stream and an overall line, read from the run
folders' experience logs: on a cluster ``--out`` must be storage that every node and the driver see
(the retries and reruns need that too).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lit_ascent.results import compare
from lit_ascent.results.compare import REPO, RunSpec

_HOST_PORT = re.compile(r"^(?:ray://)?(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]+):(?P<port>\d{1,5})$")


class RayUnavailable(RuntimeError):
    """Ray cannot be used as asked (not installed, or ``--address`` unreachable): nothing was started."""


@dataclass(frozen=True)
class RaySettings:
    """How the Ray executor schedules the cells."""

    address: str | None = None
    """None: start a local Ray; ``auto``: join this machine's cluster; ``ray://HOST:PORT`` or ``HOST:PORT``."""
    cpus_per_stream: float = 1.0
    """CPUs reserved per stream; train.py's intra-op threads (at least 1)."""
    gpus_per_stream: float = 0.0
    """GPUs reserved per stream; a fraction shares one GPU between streams."""
    max_retries: int = 2
    """Times a failed stream is submitted again, continuing from its checkpoint."""
    stop_grace_s: float = 60.0
    """After SIGINT (Ctrl-C), seconds train.py has to stop before it is killed."""
    poll_s: float = 1.0
    """Seconds between looks at the run folders for progress."""

    @classmethod
    def from_args(cls, args: compare.CompareOptions) -> RaySettings:
        """The settings given on the command line; RaySettings' defaults for the others."""
        given = {k: getattr(args, k) for k in compare.RAY_ONLY}
        return cls(**{k: v for k, v in given.items() if v is not None})


def settings_error(address: str | None, cpus: float | None, gpus: float | None, retries: int | None) -> str | None:
    """What is wrong with the Ray options (a message naming the option), or None."""
    if address is not None and address != "auto" and not _HOST_PORT.match(address):
        return f"--address {address!r}: expected auto, ray://HOST:PORT or HOST:PORT"
    if cpus is not None and not cpus > 0:
        return f"--cpus-per-stream must be > 0, got {cpus}"
    if gpus is not None and not gpus >= 0:
        return f"--gpus-per-stream must be >= 0, got {gpus}"
    if gpus is not None and gpus > 1 and gpus != int(gpus):
        return f"--gpus-per-stream above 1 must be a whole number, got {gpus}"
    if retries is not None and retries < 0:
        return f"--max-retries must be >= 0, got {retries}"
    return None


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast when a ``[ray://]HOST:PORT`` address takes no connection (Ray itself would retry for minutes)."""
    match = _HOST_PORT.match(address)
    if match is None:
        return
    try:
        socket.create_connection((match["host"].strip("[]"), int(match["port"])), timeout=timeout_s).close()
    except OSError as err:
        raise RayUnavailable(f"--address {address}: no Ray there ({err})") from err


def connect(address: str | None) -> bool:
    """Start a local Ray (``address`` None) or join the cluster at ``address``; True when this call did, so
    the caller shuts it down. A driver that called ``ray.init`` itself keeps that connection."""
    try:
        import ray
    except ImportError as err:
        raise RayUnavailable("--executor ray needs ray (pip install -r requirements.txt)") from err
    if address is not None:
        check_reachable(address)
    if ray.is_initialized():
        return False
    local = {"address": "local", "include_dashboard": False} if address is None else {"address": address}
    try:
        ray.init(**local, log_to_driver=False)
    except (ConnectionError, ValueError, RuntimeError, TimeoutError) as err:
        raise RayUnavailable(f"--address {address or '(local)'}: cannot start or join Ray ({err})") from err
    return True


def stream_env(cpus_per_stream: float, gpus_per_stream: float) -> dict[str, str]:
    """train.py's environment in a Ray task: intra-op threads follow the CPUs; no GPU unless one is reserved."""
    threads = str(max(1, int(cpus_per_stream)))
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    if gpus_per_stream == 0:
        env["CUDA_VISIBLE_DEVICES"] = ""  # Ray sets it when it assigns a GPU
    return env


def absolute(spec: RunSpec) -> RunSpec:
    """The cell with absolute paths: a Ray worker does not run in the driver's working directory."""
    return dataclasses.replace(spec, configs=tuple(c.absolute() for c in spec.configs), run_dir=spec.run_dir.absolute())


def signal_train(signalled: set[int], kill: bool = False) -> None:
    """SIGINT to this worker's train.py (Lightning's graceful stop) unless sent already; SIGKILL with ``kill``.

    A worker runs one task at a time: its children are that task's train.py. They are never waited for
    here: the cell's own ``subprocess.run`` must reap train.py to get its exit code.
    """
    import psutil

    for child in psutil.Process().children():
        if kill:
            child.kill()
        elif child.pid not in signalled:
            child.send_signal(signal.SIGINT)
            signalled.add(child.pid)


def stream_task(spec: RunSpec, cmd: list[str], num_tasks: int | None, env: dict[str, str], grace_s: float) -> int:
    """One Ray task: ``compare.run_cell`` in a thread; train.py's exit code.

    ray.cancel raises KeyboardInterrupt in the worker's main thread, which a blocking wait on train.py
    would not see until train.py ended: the main thread waits in short steps instead and, when cancelled,
    stops train.py (SIGINT, SIGKILL ``grace_s`` later) before it gives up the task.
    """
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(compare.run_cell, spec, cmd, num_tasks, env)
        try:
            while True:
                try:
                    return future.result(timeout=0.2)
                except FutureTimeout:
                    continue
        except KeyboardInterrupt:
            signalled: set[int] = set()
            deadline = time.monotonic() + grace_s
            while not future.done():  # again and again: train.py may have been starting when the cancel came
                signal_train(signalled, kill=time.monotonic() > deadline)
                wait([future], timeout=0.2)
            raise


def describe_failure(outcome: int | BaseException) -> str:
    """Why an attempt failed, in words: train.py's exit code or signal, or the Ray error."""
    if isinstance(outcome, int):
        if outcome < 0:
            return f"train.py killed by {signal.Signals(-outcome).name}"
        return f"train.py exited with {outcome}" + (" (bad config value)" if outcome == compare.CONFIG_ERROR else "")
    name = type(outcome).__name__
    if name == "OutOfMemoryError":
        return "Ray's memory monitor killed the worker (out of memory)"
    if name in ("WorkerCrashedError", "NodeDiedError", "ActorDiedError"):
        return f"the Ray worker died ({name})"
    return f"{name}: {str(outcome).strip().splitlines()[-1] if str(outcome).strip() else ''}"


def should_retry(outcome: int | BaseException, attempts: int, max_retries: int) -> bool:
    """Submit a failed stream again: retries left, and a failure a continuation may get past."""
    if attempts > max_retries:
        return False
    if isinstance(outcome, int):
        return compare.retryable(outcome)
    return type(outcome).__name__ != "TaskCancelledError"


class LogTail:
    """The records a growing experience log gained since the last look (complete lines only).

    A continued stream cuts its log back to the checkpoint and redoes the tasks after it; a restarted
    one starts a new file: tasks already shown are not shown again.
    """

    def __init__(self, path: Path):
        self.path, self.offset, self.inode, self.shown = path, 0, None, -1

    def poll(self) -> list[dict]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []
        if st.st_ino != self.inode or st.st_size < self.offset:
            self.inode, self.offset = st.st_ino, 0
        if st.st_size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read(st.st_size - self.offset)
        chunk = chunk[:chunk.rfind(b"\n") + 1]
        self.offset += len(chunk)
        new = []
        for line in chunk.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # blank, or cut by a crash
            if record.get("task_index", -1) > self.shown:
                self.shown = record["task_index"]
                new.append(record)
        return new


def task_line(spec: RunSpec, record: dict, num_tasks: int | None) -> str:
    outcome = "SOLVED" if record.get("verified") else "failed"
    return (f"[{spec.method} seed {spec.seed}] task {record['task_index'] + 1}/{num_tasks or '?'} "
            f"{record.get('task_id')}: {outcome} in {record.get('turns')} turns, {record.get('updates', 0)} updates")


def overall_line(tasks_done: int, tasks_total: int | None, counts: dict[str, int]) -> str:
    streams = ", ".join(f"{n} {state}" for state, n in counts.items())
    tasks = f"{tasks_done}/{tasks_total}" if tasks_total else str(tasks_done)
    return f"matrix: {tasks} tasks done; streams {streams}"


class Matrix:
    """The driver's view of the cells in flight: submission, retries, progress, stop."""

    def __init__(self, specs: list[RunSpec], commands: list[list[str]], num_tasks: int | None,
                 settings: RaySettings):
        import ray

        self.specs, self.commands, self.num_tasks, self.settings = specs, commands, num_tasks, settings
        self.env = stream_env(settings.cpus_per_stream, settings.gpus_per_stream)
        pythonpath = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        self.remote = ray.remote(stream_task).options(
            num_cpus=settings.cpus_per_stream, num_gpus=settings.gpus_per_stream, max_retries=0,
            runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
        self.in_flight: dict[Any, int] = {}  # ObjectRef -> cell index
        self.attempts = [0] * len(specs)
        self.started_log: list[tuple | None] = [None] * len(specs)  # train.log's identity when submitted
        self.tails = [LogTail(s.run_dir / compare.LOG_NAME) for s in specs]
        self.done: list[int] = []
        self.failed: list[int] = []
        self.last_overall: tuple | None = None

    def submit(self, i: int) -> None:
        self.attempts[i] += 1
        self.started_log[i] = _log_identity(self.specs[i].run_dir)
        ref = self.remote.remote(self.specs[i], self.commands[i], self.num_tasks, self.env, self.settings.stop_grace_s)
        self.in_flight[ref] = i

    def settle(self, ref: Any) -> None:
        """A task ended: the cell finished, is submitted again, or failed for good."""
        import ray

        i = self.in_flight.pop(ref)
        spec = self.specs[i]
        try:
            outcome: int | BaseException = ray.get(ref)
        except ray.exceptions.RayError as err:
            outcome = err.cause if isinstance(err, ray.exceptions.RayTaskError) and err.cause else err
        self.print_tasks()
        if outcome == 0:
            self.done.append(i)
            print(f"[{spec.method} seed {spec.seed}] finished ({compare.count_records(spec.run_dir)} records, "
                  f"attempt {self.attempts[i]})", flush=True)
            return
        reason = describe_failure(outcome)
        if should_retry(outcome, self.attempts[i], self.settings.max_retries):
            print(f"[{spec.method} seed {spec.seed}] FAILED: {reason}; retry {self.attempts[i]}/"
                  f"{self.settings.max_retries} from its checkpoint ({spec.run_dir / 'train.log'})", flush=True)
            self.submit(i)
            return
        self.failed.append(i)
        print(f"[{spec.method} seed {spec.seed}] FAILED: {reason}, attempt {self.attempts[i]}, not retried "
              f"(see {spec.run_dir / 'train.log'})", flush=True)

    def counts(self) -> dict[str, int]:
        running = sum(_log_identity(self.specs[i].run_dir) != self.started_log[i] for i in self.in_flight.values())
        return {"running": running, "queued": len(self.in_flight) - running, "finished": len(self.done),
                "failed": len(self.failed)}

    def print_tasks(self) -> None:
        """A line per task the streams finished since the last look."""
        for i, tail in enumerate(self.tails):
            for record in tail.poll():
                print(task_line(self.specs[i], record, self.num_tasks), flush=True)

    def print_overall(self, force: bool = False) -> None:
        """The overall line, when something changed."""
        counts = self.counts()
        done = sum(tail.shown + 1 for tail in self.tails)
        if force or (done, counts) != self.last_overall:
            total = self.num_tasks * len(self.specs) if self.num_tasks else None
            print(overall_line(done, total, counts), flush=True)
        self.last_overall = done, counts

    def run(self) -> None:
        import ray

        for i in range(len(self.specs)):
            self.submit(i)
        self.print_overall(force=True)
        while self.in_flight:
            ready, _ = ray.wait(list(self.in_flight), num_returns=1, timeout=self.settings.poll_s)
            for ref in ready:
                self.settle(ref)
            self.print_tasks()
            self.print_overall()

    def stop(self) -> list[int]:
        """Ctrl-C: cancel every task (train.py gets SIGINT, then SIGKILL), wait for them; the cells stopped."""
        import ray

        refs, stopped = list(self.in_flight), sorted(self.in_flight.values())
        print(f"stopping {len(refs)} streams (each keeps its checkpoint) ...", flush=True)
        for ref in refs:
            ray.cancel(ref)
        _, late = ray.wait(refs, num_returns=len(refs), timeout=self.settings.stop_grace_s + 10)
        for ref in late:
            ray.cancel(ref, force=True)
        self.in_flight.clear()
        return stopped


def _log_identity(run_dir: Path) -> tuple | None:
    """train.log's (inode, size, mtime): it changes when a task starts writing it."""
    try:
        st = (run_dir / "train.log").stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def run_matrix(specs: list[RunSpec], env_config: Path, extra_configs: list[Path], num_tasks: int | None,
               fixed_stream: bool = False, archive: Path | None = None, settings: RaySettings = RaySettings(),
               ) -> dict[str, list[RunSpec]]:
    """Run every cell that is neither finished nor in ``archive`` as a Ray task, all at once.

    Returns {"done", "skipped", "failed", "stopped"} like ``compare.run_matrix`` ("stopped": Ctrl-C).
    Raises RayUnavailable, before any stream starts, when Ray cannot be started or joined.
    """
    started = connect(settings.address)
    result: dict[str, list[RunSpec]] = {"done": [], "skipped": [], "failed": [], "stopped": []}
    todo: list[RunSpec] = []  # as given; the Ray tasks get them with absolute paths
    cells: list[RunSpec] = []
    commands: list[list[str]] = []
    env_config, extra_configs = env_config.absolute(), [p.absolute() for p in extra_configs]
    for i, spec in enumerate(specs):
        tag = compare.cell_tag(i, len(specs), spec)
        if compare.is_done(spec, num_tasks, archive):
            print(f"{tag}: finished already, skipped", flush=True)
            result["skipped"].append(spec)
            continue
        todo.append(spec)
        cells.append(absolute(spec))
        commands.append(compare.train_command(cells[-1], env_config, extra_configs, num_tasks, fixed_stream))
        print(f"{tag}: {' '.join(commands[-1])}", flush=True)
    matrix = Matrix(cells, commands, num_tasks, settings)
    try:
        matrix.run()
    except KeyboardInterrupt:
        result["stopped"] = [todo[i] for i in matrix.stop()]
    finally:
        if started:
            import ray

            ray.shutdown()
    result["done"], result["failed"] = [todo[i] for i in sorted(matrix.done)], [todo[i] for i in sorted(matrix.failed)]
    return result
