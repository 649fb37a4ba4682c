"""Keep finished comparison runs with their report, so a matrix can span machines.

``runs/`` is scratch: a sitting on a new machine starts without it. The report
therefore copies every finished run's experience log (a run whose folder holds
compare's ``done.json``) into ``<report folder>/runs/<method>/<seed>.jsonl.gz``,
which is committed with the table, and reads that archive back next time
together with whatever ``runs/`` holds (the longer log of a run wins; on a tie
the live folder). A run's held-out evaluation records (``heldout.jsonl``, see
``callbacks/heldout.py``) are kept beside its log, as ``<seed>.heldout.jsonl.gz``.
Per-seed figures of runs whose logs were never archived can be carried over
from an earlier report's ``results.json`` (``merge_previous``).
"""
from __future__ import annotations

import gzip
from pathlib import Path

from lit_ascent.records import read_records
from lit_ascent.results.paired import Runs

MARKER = "done.json"
"""Written by compare into a run folder when the run finished its stream."""
LOG_NAME = "experience.jsonl"
STATE_FILE = "stream_state.pt"
"""A run folder's stream checkpoint (``callbacks/stream_checkpoint.py``); kept here, with the other
run-folder names, so the results tooling and the Ray workers know it without importing torch."""
SUFFIX = ".jsonl.gz"
HELDOUT_NAME = "heldout.jsonl"
HELDOUT_SUFFIX = ".heldout.jsonl.gz"
ARCHIVED = {LOG_NAME: SUFFIX, HELDOUT_NAME: HELDOUT_SUFFIX}
"""Run-folder file -> its suffix in the archive."""


def archived_path(archive: Path, method: str, seed_folder: str, suffix: str = SUFFIX) -> Path:
    """Where the archive keeps the log of ``<method>/<seed_folder>`` (``HELDOUT_SUFFIX``: its held-out records)."""
    return archive / method / f"{seed_folder}{suffix}"


def archive_finished(root: Path, archive: Path) -> list[Path]:
    """Copy each finished run's log and held-out records under ``root`` into ``archive``; returns the files written."""
    written = []
    for marker in sorted(Path(root).glob(f"*/*/{MARKER}")):
        run_dir = marker.parent
        for name, suffix in ARCHIVED.items():
            log = run_dir / name
            if not log.is_file():
                continue
            written.append(archive_file(log, archived_path(archive, run_dir.parent.name, run_dir.name, suffix)))
    return written


def archive_file(log: Path, dest: Path) -> Path:
    """``log`` gzipped into ``dest`` (mtime 0: the same log gives the same bytes, so a rerun commits nothing)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(gzip.compress(log.read_bytes(), mtime=0))
    return dest


def load_archive(archive: Path, suffix: str = SUFFIX) -> Runs:
    """All runs under ``archive``: ``<method>/<seed><suffix>`` (default: the experience logs)."""
    longer = [s for s in ARCHIVED.values() if s != suffix and s.endswith(suffix)]  # .heldout.jsonl.gz vs .jsonl.gz
    runs: Runs = {}
    for path in sorted(Path(archive).glob(f"*/*{suffix}")):
        if not path.name.endswith(tuple(longer)):
            runs.setdefault(path.parent.name, {})[path.name[:-len(suffix)]] = read_records(path)
    return runs


def merge_runs(archived: Runs, live: Runs) -> Runs:
    """Union of both; where a run is in both, the one with more records (the live one on a tie)."""
    merged: Runs = {m: dict(seeds) for m, seeds in archived.items()}
    for method, seeds in live.items():
        for seed, records in seeds.items():
            if len(records) >= len(merged.get(method, {}).get(seed, [])):
                merged.setdefault(method, {})[seed] = records
    return merged


def merge_previous(per_seed: dict[str, dict[str, dict]], previous: dict) -> dict[str, list[str]]:
    """Add to ``per_seed`` (method -> seed -> run metrics) the seeds an earlier report's table has and it lacks.

    ``previous`` is a loaded ``results.json``. Changes ``per_seed`` in place; returns
    {method: [seeds taken from previous]}.
    """
    taken: dict[str, list[str]] = {}
    for method, entry in previous.items():
        mine = per_seed.setdefault(method, {})
        for seed, metrics in entry["per_seed"].items():
            if seed not in mine:
                mine[seed] = metrics
                taken.setdefault(method, []).append(seed)
    return taken
