"""The vLLM server as a child process: its temp dir, port, death with the parent, stop and log tail.

The lifecycle half of ``lit_ascent.engines.vllm`` (which speaks the server's HTTP API): standard library only,
nothing vLLM-specific but the temp dir prefix.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

TMP_PREFIX = "lit-ascent-vllm-"


def sweep_stale_dirs() -> None:
    """Remove temp dirs of engines whose process died without cleaning up (SIGKILL, OOM)."""
    for d in Path(tempfile.gettempdir()).glob(TMP_PREFIX + "*"):
        try:
            owner = int((d / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        if owner == os.getpid():
            continue
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass  # alive (another user's)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies (Linux; PR_SET_PDEATHSIG = 1)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except OSError:
        pass


def stop_server(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after ``grace_s``."""
    if proc.poll() is None:
        signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
    signal_group(proc.pid, signal.SIGKILL)  # engine-core children outliving the api server
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def cleanup(proc: subprocess.Popen | None, log_handle, tmp: Path) -> None:
    if proc is not None:
        stop_server(proc)
    if log_handle is not None:
        log_handle.close()
    shutil.rmtree(tmp, ignore_errors=True)


def log_tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"
