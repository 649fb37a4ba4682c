"""Checkpoint files written atomically and read back checked: the stream's (``callbacks.stream_checkpoint``)
and the iterated cycles' (``lit_ascent.cycle_log``)."""
from __future__ import annotations

import os
from pathlib import Path

import torch


def save_atomic(state: dict, path: Path) -> None:
    """Write ``state`` so that ``path`` is always either the old or the new complete file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename itself durable
    finally:
        os.close(fd)


def read_checkpoint(path: Path, fmt: int, option: str, kind: str) -> dict:
    """A checkpoint of format ``fmt`` (plain values only: ``weights_only=True``); one that does not load or
    has another format fails with a message naming ``option`` and the ``kind`` of checkpoint expected."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(f"{option}: {str(path)!r} is not a readable {kind} ({err})") from err
    if not isinstance(state, dict) or state.get("format") != fmt:
        raise ValueError(f"{option}: {str(path)!r} is not a {kind} of format {fmt}")
    return state
