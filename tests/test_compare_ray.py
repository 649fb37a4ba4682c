"""The comparison matrix on Ray (lit_ascent.results.ray_executor): same cells as the serial executor, all at once.

The fast tests check the pieces (options, failure handling, progress, the child process wrapper); the
slow ones run the debug config (tiny model, scripted environment) on a local Ray with 2 CPUs.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lit_ascent.results import compare, ray_executor
from lit_ascent.records import read_records

DEBUG = compare.REPO / "configs/debug.yaml"
LONG_STREAM = "data:\n  env:\n    init_args: {num_tasks: %d}\n"  # long enough to be stopped in the middle


# ---- options -----------------------------------------------------------------------------


@pytest.mark.parametrize("address", [None, "auto", "ray://head:10001", "10.0.0.5:6379", "ray://[::1]:10001"])
def test_good_settings_pass(address):
    assert ray_executor.settings_error(address, 0.5, 0.25, 0) is None


@pytest.mark.parametrize("args,names", [
    (("nonsense", None, None, None), "--address 'nonsense'"),
    (("ray://head", None, None, None), "--address 'ray://head'"),
    ((None, 0.0, None, None), "--cpus-per-stream"),
    ((None, None, -1.0, None), "--gpus-per-stream"),
    ((None, None, 1.5, None), "--gpus-per-stream"),
    ((None, None, None, -1), "--max-retries"),
])
def test_bad_settings_name_the_option(args, names):
    assert names in ray_executor.settings_error(*args)


def cli(tmp_path: Path, *extra: str) -> list[str]:
    return ["--env-config", str(DEBUG), "--methods", "base", "--out", str(tmp_path / "out"), *extra]


@pytest.mark.parametrize("extra,message", [
    (["--address", "auto"], "--address: only with --executor ray"),
    (["--cpus-per-stream", "2", "--max-retries", "1"], "--cpus-per-stream, --max-retries: only with --executor ray"),
    (["--executor", "ray", "--address", "head-without-port"], "--address 'head-without-port': expected"),
    (["--executor", "ray", "--gpus-per-stream", "-1"], "--gpus-per-stream must be >= 0"),
])
def test_bad_options_exit_2_with_one_message(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exit_:
        compare.parse_args(cli(tmp_path, *extra))
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_unreachable_address_fails_before_any_stream_starts(tmp_path, capsys):
    pytest.importorskip("ray")
    for address in ("ray://127.0.0.1:1", "127.0.0.1:1"):  # nothing listens on port 1
        t0 = time.time()
        assert compare.main(cli(tmp_path, "--executor", "ray", "--address", address)) == 2
        assert time.time() - t0 < 30
        err = capsys.readouterr().err
        assert err.startswith(f"error: --address {address}: no Ray there") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_settings_from_the_command_line(tmp_path):
    args = compare.parse_args(cli(tmp_path, "--executor", "ray", "--gpus-per-stream", "0.25"))
    assert ray_executor.RaySettings.from_args(args) == ray_executor.RaySettings(gpus_per_stream=0.25)


def test_stream_env_threads_follow_the_cpus():
    assert ray_executor.stream_env(2.0, 0.0) == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2",
                                                 "CUDA_VISIBLE_DEVICES": ""}
    env = ray_executor.stream_env(0.5, 0.25)  # a fraction still gets a thread; Ray picks the GPU
    assert env["OMP_NUM_THREADS"] == "1" and "CUDA_VISIBLE_DEVICES" not in env


# ---- failures and retries ----------------------------------------------------------------


class WorkerCrashedError(Exception):  # stand-ins named like Ray's exceptions
    pass


class TaskCancelledError(Exception):
    pass


def test_failures_are_described_and_retried_while_retries_last():
    assert ray_executor.describe_failure(-signal.SIGKILL) == "train.py killed by SIGKILL"
    assert "bad config value" in ray_executor.describe_failure(compare.CONFIG_ERROR)
    assert "worker died" in ray_executor.describe_failure(WorkerCrashedError())
    assert ray_executor.should_retry(1, attempts=1, max_retries=2)
    assert ray_executor.should_retry(-signal.SIGKILL, attempts=2, max_retries=2)
    assert not ray_executor.should_retry(1, attempts=3, max_retries=2)  # out of retries
    assert not ray_executor.should_retry(compare.CONFIG_ERROR, attempts=1, max_retries=2)  # fails the same again
    assert ray_executor.should_retry(WorkerCrashedError(), attempts=1, max_retries=1)
    assert not ray_executor.should_retry(TaskCancelledError(), attempts=1, max_retries=1)  # Ctrl-C


# ---- progress ----------------------------------------------------------------------------


def record(i: int) -> str:
    return json.dumps({"task_index": i, "task_id": f"t{i}", "verified": i % 2 == 0, "turns": 2, "updates": 1})


def test_log_tail_shows_each_task_once(tmp_path):
    log = tmp_path / "experience.jsonl"
    tail = ray_executor.LogTail(log)
    assert tail.poll() == []  # not there yet
    log.write_text(record(0) + "\n" + record(1)[:20])  # the second line is still being written
    assert [r["task_index"] for r in tail.poll()] == [0]
    with open(log, "a") as f:
        f.write(record(1)[20:] + "\n" + record(2) + "\n")
    assert [r["task_index"] for r in tail.poll()] == [1, 2] and tail.poll() == []
    log.write_text(record(0) + "\n" + record(1) + "\n")  # a resume cut the log back to its checkpoint
    assert tail.poll() == []
    with open(log, "a") as f:
        f.write(record(2) + "\n" + record(3) + "\n")  # task 2 redone: shown once already
    assert [r["task_index"] for r in tail.poll()] == [3]


def test_progress_lines():
    spec = compare.plan(["rft"], [1], Path("out"))[0]
    line = ray_executor.task_line(spec, json.loads(record(2)), 40)
    assert line == "[rft seed 1] task 3/40 t2: SOLVED in 2 turns, 1 updates"
    counts = {"running": 2, "queued": 1, "finished": 3, "failed": 0}
    assert (ray_executor.overall_line(13, 240, counts)
            == "matrix: 13/240 tasks done; streams 2 running, 1 queued, 3 finished, 0 failed")


# ---- the child process a cell starts -------------------------------------------------------

PARENT = """
import signal, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from lit_ascent.results.compare import child_command
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # as a Ray worker does
child = subprocess.Popen(child_command([sys.executable, "-c", "import time; time.sleep(60)"]))
print(child.pid, flush=True)
time.sleep(60)
"""


def signal_mask(pid: int, field: str) -> int:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line.split()[1] for line in lines if line.startswith(field)), 16)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_child_takes_sigint_and_dies_with_its_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(compare.REPO)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    time.sleep(0.5)  # the wrapper has exec'd the sleeping child
    assert signal_mask(parent.pid, "SigBlk") & (1 << (signal.SIGINT - 1))
    assert not signal_mask(child, "SigBlk") & (1 << (signal.SIGINT - 1))  # Ctrl-C and ray.cancel reach it
    parent.kill()
    parent.wait()
    for _ in range(50):
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the child outlived its killed parent")


CANCELLED = """
import _thread, sys, threading, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from lit_ascent.results import compare, ray_executor
spec = compare.plan(["base"], [0], Path(sys.argv[2]))[0]
train = [sys.executable, "-c", "import pathlib, sys, time; pathlib.Path(sys.argv[1]).touch(); time.sleep(60)",
         str(spec.run_dir / "up")]

def cancel():  # what ray.cancel does to a running task
    while not (spec.run_dir / "up").exists():
        time.sleep(0.01)
    _thread.interrupt_main()

threading.Thread(target=cancel).start()
t0 = time.time()
try:
    ray_executor.stream_task(spec, train, None, {}, grace_s=30)
except KeyboardInterrupt:
    print(f"cancelled after {time.time() - t0:.1f}s")
"""


def test_cancelled_task_stops_train_and_writes_no_marker(tmp_path):
    """In a process of its own: the task signals every child of its process, as in a Ray worker."""
    proc = subprocess.run([sys.executable, "-c", CANCELLED, str(compare.REPO), str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout.startswith("cancelled after"), proc.stderr[-2000:]
    assert float(proc.stdout.split()[2].rstrip("s")) < 20  # SIGINT stopped it: no wait for the grace period
    run_dir = tmp_path / "base" / "seed0"
    log = (run_dir / "train.log").read_text()
    assert f"train.py exited with -{signal.SIGINT.value} " in log  # the exit code train.py gave, not a reaped 0
    assert not (run_dir / compare.MARKER).exists()


# ---- on a local Ray: the debug config ------------------------------------------------------


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray with 2 CPUs, shared by the module's tests (run_matrix keeps a driver's connection)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def one_thread_env(monkeypatch):
    """train.py with one intra-op thread, as the Ray executor runs it: the serial runs are then comparable."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MKL_NUM_THREADS", "1")


def outcomes(run_dir: Path) -> list[dict]:
    """Per-task records without timings."""
    return [{k: v for k, v in r.items() if k != "timings"} for r in read_records(run_dir / compare.LOG_NAME)]


def assert_same_adapter(run_dir: Path, ref: Path) -> None:
    a, b = (load_file(str(d / "adapter" / "final" / "adapter_model.safetensors")) for d in (run_dir, ref))
    assert a.keys() == b.keys() and a
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


@pytest.mark.slow
def test_ray_matrix_gives_the_serial_records(tmp_path, local_ray, one_thread_env, capsys):
    methods, seeds = ["base", "rft"], [0, 1]
    serial = compare.plan(methods, seeds, tmp_path / "serial")
    assert len(compare.run_matrix(serial, DEBUG, [], num_tasks=None)["done"]) == 4
    on_ray = compare.plan(methods, seeds, tmp_path / "ray")
    settings = ray_executor.RaySettings(max_retries=0)
    result = ray_executor.run_matrix(on_ray, DEBUG, [], None, settings=settings)
    assert result["done"] == on_ray and not result["failed"]
    for a, b in zip(serial, on_ray):
        assert outcomes(b.run_dir) == outcomes(a.run_dir) and len(outcomes(a.run_dir)) == 4
        assert json.loads((b.run_dir / compare.MARKER).read_text())["records"] == 4
        assert_same_adapter(b.run_dir, a.run_dir)
    out = capsys.readouterr().out
    assert "[rft seed 1] task 4/? " in out and "matrix: 16 tasks done; streams 0 running, 0 queued, 4 finished" in out
    again = ray_executor.run_matrix(on_ray, DEBUG, [], None, settings=settings)
    assert again["skipped"] == on_ray and not again["done"]


@pytest.mark.slow
def test_invalid_cell_fails_alone(tmp_path, local_ray, capsys):
    bad = tmp_path / "bad_lr.yaml"
    bad.write_text("model:\n  optim: {lr: fast}\n")
    specs = compare.plan(["base", str(bad)], [0], tmp_path / "out")
    result = ray_executor.run_matrix(specs, DEBUG, [], None, settings=ray_executor.RaySettings(max_retries=2))
    assert result["done"] == specs[:1] and result["failed"] == specs[1:]
    out = capsys.readouterr().out
    assert "[bad_lr seed 0] FAILED: train.py exited with 2 (bad config value), attempt 1, not retried" in out
    assert "lr" in (specs[1].run_dir / "train.log").read_text()  # train.py's one error line names it


def ray_worker_of(run_dir: Path):
    """The Ray worker process running the train.py of ``run_dir`` (train.py is its child), or None."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if len(cmdline) > 1 and cmdline[1].endswith("train.py") and str(run_dir.parent.parent) in cmdline:
            return proc.parent()  # the save_dir (the matrix's --out) is on its command line
    return None


def kill_worker_mid_stream(run_dir: Path, after_tasks: int, killed: list) -> None:
    """SIGKILL the cell's Ray worker once ``after_tasks`` tasks are logged (a thread, beside the driver)."""
    deadline = time.time() + 300
    while time.time() < deadline and compare.count_records(run_dir) < after_tasks:
        time.sleep(0.05)
    worker = ray_worker_of(run_dir)
    if worker is not None and not (run_dir / compare.MARKER).exists():
        killed.append((compare.count_records(run_dir), worker.name()))
        worker.send_signal(signal.SIGKILL)


@pytest.fixture(scope="module")
def long_overlay(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("overlay") / "long.yaml"
    path.write_text(LONG_STREAM % 12)
    return path


@pytest.fixture(scope="module")
def longer_overlay(tmp_path_factory) -> Path:
    """48 tasks (~5 s of stream): Ctrl-C takes a second or more to reach train.py through Ray's cancel."""
    path = tmp_path_factory.mktemp("overlay") / "longer.yaml"
    path.write_text(LONG_STREAM % 48)
    return path


@pytest.mark.slow
def test_killed_worker_is_retried_and_resumes_exactly(tmp_path, local_ray, long_overlay, capsys):
    killed_spec = compare.plan(["rft"], [0], tmp_path / "killed")[0]
    reference = compare.plan(["rft"], [0], tmp_path / "reference")[0]  # the same stream, left alone
    killed: list = []
    killer = threading.Thread(target=kill_worker_mid_stream, args=(killed_spec.run_dir.absolute(), 3, killed))
    killer.start()
    result = ray_executor.run_matrix([killed_spec, reference], DEBUG, [long_overlay], None,
                                     settings=ray_executor.RaySettings(max_retries=1))
    killer.join()
    assert killed and killed[0][0] < 12, "the stream finished before the worker could be killed"
    assert result["done"] == [killed_spec, reference]
    out = capsys.readouterr().out
    assert "[rft seed 0] FAILED: the Ray worker died (WorkerCrashedError); retry 1/1 from its checkpoint" in out
    log = (killed_spec.run_dir / "train.log").read_text()
    assert "# lit_ascent.results.compare: started" in log and "# lit_ascent.results.compare: continued" in log
    assert json.loads((killed_spec.run_dir / compare.MARKER).read_text())["resumed"] is True
    got, want = outcomes(killed_spec.run_dir), outcomes(reference.run_dir)
    assert [r["task_index"] for r in got] == list(range(12)) and got == want
    assert_same_adapter(killed_spec.run_dir, reference.run_dir)


@pytest.mark.slow
def test_ctrl_c_stops_every_stream_and_the_rerun_continues(tmp_path, longer_overlay, one_thread_env):
    pytest.importorskip("ray")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "lit_ascent.results.compare", "--env-config", str(DEBUG), "--extra-config",
           str(longer_overlay), "--methods", "rft", "--seeds", "0", "1", "--out", str(out), "--executor", "ray"]
    run_dirs = [out / "rft" / "seed0", out / "rft" / "seed1"]  # two streams of the same speed
    driver = subprocess.Popen(cmd, cwd=compare.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and min(compare.count_records(d) for d in run_dirs) < 1:
        time.sleep(0.05)
    driver.send_signal(signal.SIGINT)
    log, _ = driver.communicate(timeout=120)
    assert driver.returncode == 130, log[-3000:]
    assert "stopping 2 streams" in log and "stopped 2 streams; rerun the same command to continue" in log
    for run_dir in run_dirs:
        assert not (run_dir / compare.MARKER).exists() and (run_dir / compare.STATE_FILE).is_file()
        assert ray_worker_of(run_dir.absolute()) is None  # no train.py left running
        assert compare.count_records(run_dir) < 48, "the stream finished before Ctrl-C reached it"
        assert "train.py exited with 1 " in (run_dir / "train.log").read_text()  # Lightning's graceful stop
    rerun = subprocess.run(cmd, cwd=compare.REPO, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert json.loads((run_dirs[0] / compare.MARKER).read_text())["resumed"] is True
    reference = compare.plan(["rft"], [0], tmp_path / "reference")
    assert compare.run_matrix(reference, DEBUG, [longer_overlay], None)["done"] == reference
    assert outcomes(run_dirs[0]) == outcomes(reference[0].run_dir)
    assert_same_adapter(run_dirs[0], reference[0].run_dir)
