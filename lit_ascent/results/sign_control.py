"""The sign control of a held-out gain (docs/results/webshop_efficacy/PLAN.md).

``scripts/sign_control.sh`` replays a run's end-of-stream fast weights on its held-out goals at scale +1
(which must reproduce the run's own held-out play) and at scale -1 (the same change to the model, the
opposite direction). A learned change helps at +1 and not at -1; a perturbation that only flips
near-tied greedy choices moves both alike. This module archives those plays and pairs them, goal by goal,
with the base run of the same seed and with each other, per seed and pooled over seeds.

    python -m lit_ascent.results.sign_control --root runs/webshop_sign \
        --archive docs/results/webshop_efficacy/sign_control --runs docs/results/webshop_efficacy/runs
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lit_ascent.options import parse_options
from lit_ascent.records import read_jsonl
from lit_ascent.results.heldout_table import heldout_end
from lit_ascent.results.paired import COUNTS, Records, format_difference, paired_counts, paired_stats
from lit_ascent.results.run_archive import HELDOUT_SUFFIX, archive_file, load_archive

SCALES = ("1", "-1")
PAIRS = (("+1", "base"), ("-1", "base"), ("+1", "-1"))
"""The comparisons of each seed: (row, reference), 'base' being the base run's held-out play."""


def archive_controls(root: Path, archive: Path) -> list[Path]:
    """Each finished play ``<root>/<seed>/scale<s>/`` (its ``done`` marker) as ``<archive>/<seed>_scale<s>...``:
    the held-out records and the log, gzipped."""
    written = []
    for marker in sorted(Path(root).glob("*/scale*/done")):
        play = marker.parent
        stem = f"{play.parent.name}_{play.name}"
        written.append(archive_file(play / "heldout.jsonl", archive / f"{stem}{HELDOUT_SUFFIX}"))
        if (play / "train.log").is_file():
            written.append(archive_file(play / "train.log", archive / f"{stem}.train.log.gz"))
    return written


def load_controls(archive: Path) -> dict[str, dict[str, Records]]:
    """seed folder -> scale ('1', '-1') -> the adapted model's held-out records."""
    controls: dict[str, dict[str, Records]] = {}
    for path in sorted(Path(archive).glob(f"*_scale*{HELDOUT_SUFFIX}")):
        seed, scale = path.name[:-len(HELDOUT_SUFFIX)].split("_scale")
        controls.setdefault(seed, {})[scale] = heldout_end(read_jsonl(path))[0]
    return controls


def same_play(a: Records, b: Records) -> int:
    """Goals on which two plays took the same actions (matched by ``task_id``)."""
    theirs = {r["task_id"]: r["actions"] for r in b}
    return sum(r["task_id"] in theirs and r["actions"] == theirs[r["task_id"]] for r in a)


def sign_rows(controls: dict[str, dict[str, Records]], heldout: dict[str, dict[str, Records]],
              method: str = "ascent", base: str = "base") -> list[dict]:
    """Per seed with both scales and both runs' held-out plays, and pooled over them: each of ``PAIRS`` as
    ``COUNTS`` (only_method = only the row, only_base = only the reference) with ``paired_stats``; per seed
    also ``reproduced``: goals where scale +1 took the method run's own actions, of ``goals``."""
    rows, pooled = [], {pair: dict.fromkeys(COUNTS, 0) for pair in PAIRS}
    for seed, plays in sorted(controls.items()):
        if set(plays) != set(SCALES) or seed not in heldout.get(method, {}) or seed not in heldout.get(base, {}):
            continue
        own = heldout_end(heldout[method][seed])[0]
        reproduced = {"reproduced": same_play(plays["1"], own), "goals": len(own)}
        plays = {"+1": plays["1"], "-1": plays["-1"], "base": heldout_end(heldout[base][seed])[0]}
        for row, ref in PAIRS:
            counts = paired_counts(plays[row], plays[ref])
            rows.append({"seed": seed, "row": row, "reference": ref, **counts, **paired_stats(counts), **reproduced})
            pooled[(row, ref)] = {k: pooled[(row, ref)][k] + counts[k] for k in COUNTS}
    if len({r["seed"] for r in rows}) > 1:
        rows += [{"seed": "pooled", "row": row, "reference": ref, **c, **paired_stats(c)}
                 for (row, ref), c in pooled.items()]
    return rows


def sign_markdown(rows: list[dict]) -> str:
    """The rows as a markdown table; success counts are the row's and the reference's solved goals."""
    head = ["seed", "comparison", "row solved", "reference solved", "only row", "only reference", "McNemar exact p",
            "difference (pp, 95% CI)", "+1 reproduces the run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        reproduced = f"{r['reproduced']}/{r['goals']} goals" if "goals" in r else "-"
        lines.append(f"| {r['seed']} | {r['row']} vs {r['reference']} | {r['both'] + r['only_method']} "
                     f"| {r['both'] + r['only_base']} | {r['only_method']} | {r['only_base']} | {r['p']:.3g} "
                     f"| {format_difference(r)} | {reproduced} |")
    return "\n".join(lines) + "\n"


@dataclass
class SignControlArgs:
    """Archive the sign-control plays and write their table."""

    archive: str
    """Folder of the archived plays (``<seed>_scale<s>.heldout.jsonl.gz``); the table goes beside it as .md."""
    runs: str
    """The report's archive of the stream runs (``<method>/<seed>.heldout.jsonl.gz``)."""
    root: str | None = None
    """Folder of ``scripts/sign_control.sh``'s plays (``<seed>/scale<s>/``), archived first; None: the archive only."""
    method: str = "ascent"
    """The run whose fast weights were replayed."""
    base: str = "base"
    """The base run of the same seed."""


def main(argv: list[str] | None = None) -> Path:
    args = parse_options(SignControlArgs, argv, prog="python -m lit_ascent.results.sign_control")
    archive = Path(args.archive)
    if args.root:
        archive_controls(Path(args.root), archive)
    rows = sign_rows(load_controls(archive), load_archive(Path(args.runs), HELDOUT_SUFFIX), args.method, args.base)
    out = archive.with_suffix(".md")
    out.write_text(f"Sign control of `{args.method}`'s held-out play: its end-of-stream fast weights at scale +1 "
                   f"and -1 against the `{args.base}` run of the same seed (lit_ascent/results/sign_control.py).\n\n"
                   + sign_markdown(rows))
    print(out.read_text())
    return out


if __name__ == "__main__":
    main()
