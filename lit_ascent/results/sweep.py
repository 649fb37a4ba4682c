"""The efficacy study's proxy sweep: one row per update setting, from playback cells.

A cell is one ``train.py fit`` run that replays a recorded stream (``model.playback.log``) with one
update setting and then plays the held-out set with its frozen fast weights
(``scripts/efficacy_proxy.sh`` runs a grid of them). Its folder is ``<root>/<cell>``, named
``base`` (no update) or ``<method>_lr<lr>_s<steps>_k<k>`` (lr, optimiser steps per verified
episode, replay k), and holds ``done`` once the run finished. Finished cells are archived as
``<archive>/<cell>.jsonl.gz`` (the stream's records), ``<cell>.heldout.jsonl.gz`` and
``<cell>.train.log.gz``, so the sweep outlives ``runs/``; the table is built from the archive.

    python -m lit_ascent.results.sweep --root runs/efficacy_proxy --archive docs/results/efficacy/proxy \\
        --out docs/results/efficacy/sweep

Each row: held-out success against the base cell's (paired on the same tasks: McNemar's exact p and
the 95% interval of the difference), held-out turns, invalid-action, repeated-action and back-to-back
repeat rates (the collapse diagnostics), the updates and the share of each episode's loss they absorbed, the action
drift on the probe set before the last task, the update's CPU seconds, and the share of held-out actions
whose first word is the base's commonest (TextCraft: ``craft``; ``lit_ascent.action_words``) and of those whose
first word the base never uses.
``chosen`` applies the plan's rule (docs/results/efficacy/PLAN.md): highest held-out success, then the lower
action drift, then the smaller budget lr x steps x (1 + k). With ``--streams`` (a report's run archive), the
cells that were also run as full streams get the proxy-validity table: the proxy's row above each stream seed's.
"""
from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path

from lit_ascent.action_words import top_word, unseen_share, word_shares
from lit_ascent.metrics import repeated_actions
from lit_ascent.options import parse_options
from lit_ascent.records import read_records, record_rates
from lit_ascent.results.paired import format_difference, paired_counts, paired_stats
from lit_ascent.results.run_archive import HELDOUT_NAME, HELDOUT_SUFFIX, LOG_NAME, SUFFIX, load_archive

BASE = "base"
CELL = re.compile(r"(?P<method>[a-z_]+?)_lr(?P<lr>[0-9.]+(?:e-?\d+)?)_s(?P<steps>\d+)_k(?P<k>\d+)")
LOG_SUFFIX = ".train.log.gz"
ARCHIVED = {LOG_NAME: SUFFIX, HELDOUT_NAME: HELDOUT_SUFFIX, "train.log": LOG_SUFFIX}
"""File of a cell's run -> its suffix in the archive."""


def setting(cell: str) -> dict:
    """{method, lr, steps, k} from a cell's name (the base: method 'base', no update)."""
    if cell == BASE:
        return {"method": BASE, "lr": 0.0, "steps": 0, "k": 0}
    m = CELL.fullmatch(cell)
    if m is None:
        raise ValueError(f"sweep: cell name {cell!r} is neither {BASE!r} nor <method>_lr<lr>_s<steps>_k<k>")
    return {"method": m["method"], "lr": float(m["lr"]), "steps": int(m["steps"]), "k": int(m["k"])}


def archive_cells(root: Path, archive: Path) -> list[Path]:
    """Copy every finished cell's files under ``root`` into ``archive`` (gzipped); returns the files written."""
    written = []
    for done in sorted(Path(root).glob("*/done")):
        cell = done.parent
        setting(cell.name)  # a folder that is no cell fails here, by name
        for name, suffix in ARCHIVED.items():
            found = sorted(cell.rglob(name))
            if found:
                dest = Path(archive) / f"{cell.name}{suffix}"
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(gzip.compress(found[0].read_bytes(), mtime=0))
                written.append(dest)
    return written


def load_cells(archive: Path) -> dict[str, tuple[list[dict], list[dict]]]:
    """{cell: (stream records, held-out records)} of the archived cells that have held-out records."""
    cells = {}
    for path in sorted(Path(archive).glob(f"*{HELDOUT_SUFFIX}")):
        name = path.name[:-len(HELDOUT_SUFFIX)]
        stream = Path(archive) / f"{name}{SUFFIX}"
        cells[name] = (read_records(stream) if stream.is_file() else [], read_records(path))
    return cells


def cell_row(cell: str, stream: list[dict], heldout: list[dict], base: list[dict] | None) -> dict:
    """The sweep's row of one cell (see the module docstring); ``base``: the base cell's held-out records."""
    adapted = [r for r in heldout if r.get("model", "adapted") == "adapted"]
    rates = record_rates(adapted)
    with_actions = [r["actions"] for r in adapted if "actions" in r]
    updating = [r for r in stream if r.get("updates")]
    absorbed = [a for r in updating if (a := r.get("update", {}).get("update/absorbed_fraction")) is not None]
    drift = [r for r in stream if "diagnostics/action_kl" in r]
    repeats = [repeated_actions(a) for a in with_actions]
    row = {"cell": cell, **setting(cell), "solved": sum(r["verified"] for r in adapted), "tasks": len(adapted),
           "success": rates["success_rate"], "turns": rates["turns"], "invalid_rate": rates["invalid_rate"],
           "repeat_rate": mean_of(repeats, "diagnostics/repeat_action_rate"),
           "back_to_back": mean_of(repeats, "diagnostics/back_to_back_rate"),
           "updates": sum(r.get("updates", 0) for r in stream),
           "absorbed": sum(absorbed) / len(absorbed) if absorbed else None,
           "action_kl": drift[-1]["diagnostics/action_kl"] if drift else None,
           "action_changes": drift[-1].get("diagnostics/action_changes") if drift else None,
           "update_s": sum(r.get("timings", {}).get("update_s", 0.0) for r in stream),
           "words": word_shares(with_actions)}
    if base is not None and cell != BASE:
        counts = paired_counts(adapted, base)
        row.update(counts=counts, **paired_stats(counts))
    return row


def mean_of(rows: list[dict], key: str) -> float | None:
    return sum(r[key] for r in rows) / len(rows) if rows else None


def budget(row: dict) -> float:
    """The update budget of a setting: lr x steps x (1 + k)."""
    return row["lr"] * row["steps"] * (1 + row["k"])


def chosen(rows: list[dict], method: str) -> dict | None:
    """The plan's choice among ``method``'s rows: highest held-out success, then the lower action drift
    (a missing drift counts as none), then the smaller budget."""
    mine = [r for r in rows if r["method"] == method]
    return min(mine, key=lambda r: (-r["success"], r["action_kl"] or 0.0, budget(r)), default=None)


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _outcome_cells(r: dict) -> str:
    """held-out | vs base | p | turns | invalid | repeat | back-to-back | updates | absorbed, the columns every
    table here shares."""
    vs = (format_difference(r), f"{r['p']:.3g}") if "p" in r else ("-", "-")
    return (f"{r['solved']}/{r['tasks']} | {vs[0]} | {vs[1]} | {r['turns']:.1f} | {r['invalid_rate']:.1%} "
            f"| {_num(r['repeat_rate'], '.1%')} | {_num(r.get('back_to_back'), '.1%')} | {r['updates']} "
            f"| {_num(r['absorbed'], '.0%')}")


def sweep_markdown(rows: list[dict]) -> str:
    """The sweep table, one row per cell (base first, then by method and budget), and each method's choice."""
    rows = sorted(rows, key=lambda r: (r["method"] != BASE, r["method"], budget(r), r["lr"], r["steps"], r["k"]))
    # the verb the first row (the base) uses most (TextCraft: craft): its share of each cell's held-out actions
    # and the share of its actions whose word the base never uses
    base_words = rows[0].get("words", {})
    verb = top_word(base_words)
    lines = ["| cell | lr | steps | k | held-out | vs base, points [95% CI] | p | turns | invalid | repeat "
             f"| back-to-back | updates | absorbed | action KL | changed | update s | `{verb}` actions "
             "| words the base never uses |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        words = r.get("words")
        share = words.get(verb, 0.0) if words else None
        unseen = unseen_share(words, base_words) if words else None
        lines.append(f"| {r['cell']} | {r['lr']:g} | {r['steps']} | {r['k']} | {_outcome_cells(r)} "
                     f"| {_num(r['action_kl'], '.2g')} | {_num(r['action_changes'], '.0f')} | {r['update_s']:.0f} "
                     f"| {_num(share, '.1%')} | {_num(unseen, '.1%')} |")
    methods = sorted({r["method"] for r in rows} - {BASE})
    count = {m: sum(r["method"] == m for r in rows) for m in methods}
    lines += ["", *(f"- chosen for {m} among its {count[m]} cell(s) here: {chosen(rows, m)['cell']}" for m in methods)]
    return "\n".join(lines) + "\n"


def validity_rows(rows: list[dict], streams: Path) -> list[dict]:
    """Proxy validity: for each cell also run as full streams (a report archive, ``run_archive.load_archive``:
    ``<streams>/<cell>/seed<k>.heldout.jsonl.gz``), the proxy's row, then one row per stream seed paired with the
    base run of its seed (``<streams>/base/seed<k>.heldout.jsonl.gz``); ``run`` names which."""
    heldout, logs = load_archive(Path(streams), HELDOUT_SUFFIX), load_archive(Path(streams))
    bases = heldout.get(BASE, {})
    out = []
    for row in sorted(rows, key=lambda r: r["cell"]):
        if row["cell"] == BASE or row["cell"] not in heldout:
            continue
        out.append({**row, "run": "proxy"})
        for seed, records in sorted(heldout[row["cell"]].items()):
            stream = logs.get(row["cell"], {}).get(seed, [])
            out.append({**cell_row(row["cell"], stream, records, bases.get(seed)), "run": seed})
    return out


def validity_markdown(rows: list[dict]) -> str:
    """The proxy-validity table: a setting's proxy cell above its full streams, each against its own base."""
    lines = ["| setting | run | held-out | vs base, points [95% CI] | p | turns | invalid | repeat | back-to-back "
             "| updates | absorbed |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['cell']} | {r['run']} | {_outcome_cells(r)} |" for r in rows]
    return "\n".join(lines) + "\n"


@dataclass
class SweepOptions:
    """The command line of ``python -m lit_ascent.results.sweep``."""

    root: str | None = None
    """Folder of live cells (``<root>/<cell>``, e.g. runs/efficacy_proxy); finished ones are archived first."""
    archive: str = "docs/results/efficacy/proxy"
    """Where the cells are kept (and read from)."""
    out: str = "docs/results/efficacy/sweep"
    """Output path without extension: ``.md`` (the table) and ``.json`` (the rows)."""
    streams: str | None = None
    """A report's run archive (e.g. docs/results/efficacy/runs) holding full streams of some cells: also write
    ``<out>_validity.md``, the proxy against those streams (``validity_rows``)."""


def main(argv: list[str] | None = None) -> str:
    args = parse_options(SweepOptions, argv, "python -m lit_ascent.results.sweep", __doc__.split("\n\n")[0])
    if args.root:
        archive_cells(Path(args.root), Path(args.archive))
    cells = load_cells(Path(args.archive))
    if not cells:
        raise SystemExit(f"sweep: no archived cell with held-out records in {args.archive}")
    base = cells[BASE][1] if BASE in cells else None
    rows = [cell_row(name, stream, heldout, base) for name, (stream, heldout) in cells.items()]
    text = sweep_markdown(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))
    if args.streams:
        validity = validity_markdown(validity_rows(rows, Path(args.streams)))
        out.with_name(f"{out.name}_validity.md").write_text(validity)
        text += "\n" + validity
    print(text)
    return text


if __name__ == "__main__":
    main()
