"""Turn comparison run folders into a markdown table and plots.

    python -m lit_ascent.results.report runs/compare --out docs/results/textcraft_smollm2

Reads ``<root>/<method>/<seed>/experience.jsonl`` (one ExperienceLog record per
task; the layout ``python -m lit_ascent.results.compare`` writes) and produces
``results.md`` (mean +- std over seeds, then each method paired with the base
task by task: both solved, only one, the exact McNemar p; then what the updates
did: count, loss, drift, first-token entropy; and, for runs with a held-out
evaluation (``heldout.jsonl``, ``callbacks/heldout.py``), the frozen fast weights
on the held-out set paired with the initial model), ``results.json``
(every per-run number), ``per_task.md`` (which run solved which task, in how
many turns) and ``running_success.png``, ``first_token_entropy.png``,
``drift_kl.png``. The table computations are pure functions over the records.
Finished runs are archived in ``<out>/runs`` and read back from there, so the
report of a matrix spread over machines keeps every seed (see ``run_archive``).
A run shorter than the longest run of its seed (a stream still in progress) is
listed under the table and left out of it; ``--common-prefix`` instead cuts every
run to the tasks all runs of its seed have finished.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from lit_ascent.options import parse_options
from lit_ascent.records import summarize
from lit_ascent.results.heldout_table import HELDOUT_INTRO, heldout_end, heldout_markdown, heldout_rows
from lit_ascent.results.paired import (Records, Runs, format_cell, mean_std, method_order, paired_markdown, paired_rows,
                                       task_matrix)
from lit_ascent.results.run_archive import (HELDOUT_NAME, HELDOUT_SUFFIX, archive_finished, load_archive, merge_previous,
                                    merge_runs, read_records)
from lit_ascent.results.memory_stats import memory_markdown, memory_rows
from lit_ascent.results.update_stats import DRIFT, ENTROPY, update_markdown, update_rows

COLUMNS = {  # key -> (header, scale: 100 = shown as percent)
    "success": ("success (%)", 100.0),
    "second_half_success": ("2nd-half success (%)", 100.0),
    "mean_turns": ("mean turns", 1.0),
    "invalid_rate": ("invalid rate (%)", 100.0),
    "fewer_turns_share": ("fewer turns than base (%)", 100.0),
    "mean_score": ("score (mean reward x 100)", 100.0),  # graded environments only (WebShop)
}
OPTIONAL_COLUMNS = {"mean_score"}
"""Columns left out of the markdown table when no row has a value (an environment that only verifies)."""
DIAGNOSTICS = {  # plot name -> (JSONL key, title, y label)
    "first_token_entropy": (ENTROPY, "Entropy of the first response token", "entropy (nats)"),
    "drift_kl": (DRIFT, "Drift KL(student || initial) at the first response token", "KL (nats)"),
}


def load_runs(root: Path, filename: str = "experience.jsonl") -> Runs:
    """All runs under ``root``: ``root/<method>/<seed>/<filename>``."""
    runs: Runs = {}
    for path in sorted(Path(root).glob(f"*/*/{filename}")):
        runs.setdefault(path.parent.parent.name, {})[path.parent.name] = read_records(path)
    return runs


def run_lengths(runs: Runs, pick) -> dict[str, int]:
    """{seed: pick(record counts of that seed's runs)}, e.g. pick=max for the longest run."""
    lengths: dict[str, list[int]] = {}
    for seeds in runs.values():
        for seed, records in seeds.items():
            lengths.setdefault(seed, []).append(len(records))
    return {seed: pick(ns) for seed, ns in lengths.items()}


def split_unfinished(runs: Runs) -> tuple[Runs, dict[str, tuple[int, int]]]:
    """Keep, per seed folder, only the runs as long as the longest one; the rest are unfinished.

    All methods of a seed share one stream, so a shorter run is one still in
    progress (or stopped): its numbers cover other tasks and stay out of the
    table. Returns (complete runs, {"method/seed": (records, records of the longest)}).
    """
    longest = run_lengths(runs, max)
    complete: Runs = {}
    unfinished = {}
    for method, seeds in runs.items():
        for seed, records in seeds.items():
            if len(records) < longest[seed]:
                unfinished[f"{method}/{seed}"] = (len(records), longest[seed])
            else:
                complete.setdefault(method, {})[seed] = records
    return complete, unfinished


def common_prefix(runs: Runs) -> tuple[Runs, dict[str, int]]:
    """Every run cut to the shortest run of its seed: all methods compared on the same first tasks.

    For a look at a matrix while streams are still running. Returns (cut runs, {seed: tasks kept}).
    """
    shortest = run_lengths(runs, min)
    cut = {m: {seed: records[:shortest[seed]] for seed, records in seeds.items()} for m, seeds in runs.items()}
    return cut, shortest


def fewer_turns_share(records: Records, base_records: Records) -> float | None:
    """On tasks solved by both runs, the share where ``records`` used fewer turns than the base.

    Tasks are matched by ``task_id``; None when no task was solved by both.
    """
    base_turns = {r["task_id"]: r["turns"] for r in base_records if r["verified"]}
    both = [(r["turns"], base_turns[r["task_id"]]) for r in records
            if r["verified"] and r["task_id"] in base_turns]
    if not both:
        return None
    return sum(mine < theirs for mine, theirs in both) / len(both)


def run_metrics(records: Records, base_records: Records | None = None) -> dict[str, float | None]:
    """One run's row: success over the stream and its second half, mean turns, invalid rate
    (invalid actions / turns), the fewer-turns share against the base run of the same seed, and the mean
    score where the environment grades episodes (``record_rates``; None elsewhere)."""
    s = summarize(records)
    return {
        "tasks": s["tasks"],
        "success": s["success_rate"],
        "second_half_success": s["second_half_success_rate"],
        "mean_turns": s["mean_turns"],
        "invalid_rate": s["invalid_rate"],
        "fewer_turns_share": None if base_records is None else fewer_turns_share(records, base_records),
        "mean_score": s.get("mean_score"),
    }


def per_seed_metrics(runs: Runs, base: str = "base") -> dict[str, dict[str, dict]]:
    """method -> seed -> run_metrics; the base run of the same seed folder is the fewer-turns reference."""
    return {method: {seed: run_metrics(records, runs.get(base, {}).get(seed) if method != base else None)
                     for seed, records in seeds.items()} for method, seeds in runs.items()}


def summary_table(per_seed: dict[str, dict[str, dict]], base: str = "base") -> dict[str, dict]:
    """method -> {"per_seed": {seed: metrics}, "summary": {key: (mean, std, n) | None}}, base first."""
    table = {}
    for method in method_order(per_seed, base):
        seeds = dict(sorted(per_seed[method].items()))
        table[method] = {"per_seed": seeds, "summary": {k: mean_std([m[k] for m in seeds.values()]) for k in COLUMNS}}
    return table


def comparison_table(runs: Runs, base: str = "base") -> dict[str, dict]:
    """The table of ``runs`` (the base row gets None for fewer_turns_share)."""
    return summary_table(per_seed_metrics(runs, base), base)


def markdown_table(table: dict[str, dict]) -> str:
    """The comparison as a markdown table, one row per method, mean ± std over seeds (``OPTIONAL_COLUMNS``
    only where a row has a value)."""
    columns = {k: c for k, c in COLUMNS.items() if k not in OPTIONAL_COLUMNS
               or any(entry["summary"][k] is not None for entry in table.values())}
    head = ["method", "seeds", "tasks", *(h for h, _ in columns.values())]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, entry in table.items():
        tasks = sorted({m["tasks"] for m in entry["per_seed"].values()})
        cells = [method, str(len(entry["per_seed"])), "/".join(map(str, tasks))]
        cells += [format_cell(entry["summary"][k], scale) for k, (_, scale) in columns.items()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def running_success(records: Records) -> list[float]:
    """Success rate over the stream so far, after each task."""
    out, solved = [], 0
    for i, r in enumerate(records):
        solved += bool(r["verified"])
        out.append(solved / (i + 1))
    return out


def per_task_mean(series: list[dict[int, float]]) -> tuple[list[int], list[float]]:
    """Mean over runs of {task_index: value}, at every index any run has."""
    indices = sorted(set().union(*series)) if series else []
    means = [statistics.fmean(s[i] for s in series if i in s) for i in indices]
    return indices, means


def method_curves(runs: Runs, key: str | None) -> dict[str, tuple[list[int], list[float], int]]:
    """Per method, the seed-averaged curve of running success (key None) or of a diagnostic key,
    and how many runs it averages (methods can differ mid-matrix; the plot legend says so)."""
    curves = {}
    for method, seeds in runs.items():
        series = []
        for records in seeds.values():
            if key is None:
                series.append({r["task_index"]: v for r, v in zip(records, running_success(records))})
            else:
                series.append({r["task_index"]: r[key] for r in records
                               if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])})
        series = [s for s in series if s]
        if series:
            curves[method] = (*per_task_mean(series), len(series))
    return curves


def plot_curves(curves: dict, title: str, ylabel: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (method, (x, y, n)) in enumerate(curves.items()):  # line styles keep identical curves apart
        ax.plot(x, y, label=f"{method} ({n} seed{'s' if n != 1 else ''})",
                linestyle=("-", "--", ":", "-.")[i % 4], linewidth=2.2 - 0.2 * (i % 6),
                marker="." if len(x) < 30 else None)
    ax.set(title=title, xlabel="task index in the stream", ylabel=ylabel)
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def parse_pair(pair: str, methods) -> tuple[str, str]:
    """``"method:reference"`` -> (method, reference), both methods of the report."""
    method, sep, reference = pair.partition(":")
    missing = [m for m in (method, reference) if m not in methods]
    if not sep or not method or not reference or missing:
        raise ValueError(f"--pairs {pair!r}: expected METHOD:REFERENCE, two of the report's methods "
                         f"{sorted(methods)}" + (f"; not among them: {missing}" if sep and missing else ""))
    return method, reference


def pair_markdown(runs: Runs, heldout: Runs, method: str, reference: str) -> str:
    """``method`` paired with another method ``reference`` task by task on the stream (same seed) and, where both
    have a held-out evaluation, their end-of-stream held-out agents on the same tasks (``paired_rows``)."""
    both = {method: runs[method], reference: runs[reference]}
    text = (f"\n`{method}` paired with `{reference}` on the stream (same seed, same tasks; p and interval as "
            f"above):\n\n" + paired_markdown(paired_rows(both, reference), reference))
    ends = {m: {seed: heldout_end(records)[0] for seed, records in heldout.get(m, {}).items() if seed in runs[m]}
            for m in both}
    if ends[method] and ends[reference]:
        text += ("\nTheir end-of-stream held-out agents, frozen, on the same held-out tasks:\n\n"
                 + paired_markdown(paired_rows(ends, reference), reference))
    return text


def write_report(root: Path, out: Path, base: str = "base", prefix: bool = False,
                 previous: Path | None = None, pairs: list[str] | None = None) -> dict[str, Path]:
    """Read the runs under ``root`` and those archived in ``out/runs``; write the table, the numbers and the plots.

    Finished runs under ``root`` are archived first (``run_archive``). ``prefix``:
    compare every run on its seed's common prefix (runs in progress included)
    instead of leaving unfinished runs out. ``previous``: an earlier report's
    results.json whose per-seed figures fill in runs that have no log here. ``pairs``:
    ``"method:reference"`` comparisons besides the base (``pair_markdown``), e.g. whether
    a memory and ASCENT add up (``ascent_procedural:procedural``).
    """
    archive = out / "runs"
    archive_finished(root, archive)
    runs = merge_runs(load_archive(archive), load_runs(root))
    if not runs:
        raise FileNotFoundError(f"no <method>/<seed>/experience.jsonl under {root} and no archived run in {archive}")
    out.mkdir(parents=True, exist_ok=True)
    if prefix:
        runs, kept = common_prefix(runs)
        unfinished = {}
    else:
        runs, unfinished = split_unfinished(runs)
    runs = {m: runs[m] for m in method_order(runs, base)}
    pairs = [parse_pair(pair, runs) for pair in pairs or ()]
    per_seed = per_seed_metrics(runs, base)
    taken = merge_previous(per_seed, json.loads(previous.read_text())) if previous else {}
    table = summary_table(per_seed, base)
    files = {"table": out / "results.md", "numbers": out / "results.json"}
    intro = (f"Runs under `{root}` and archived in `{archive}`: mean ± sample std over seeds. "
             "Invalid rate = invalid actions / turns. "
             f"'Fewer turns than base': on tasks solved by the method and by `{base}` on the same seed, "
             "the share where the method needed fewer turns.\n\n")
    if prefix:
        intro += ("Common prefix (some streams still running): every run cut to the first "
                  + ", ".join(f"{n} tasks of {seed}" for seed, n in sorted(kept.items())) + ".\n\n")
    if taken:
        intro += (f"Per-seed figures carried over from `{previous}` (their episode logs were not kept): "
                  + ", ".join(f"{m} {'/'.join(seeds)}" for m, seeds in taken.items())
                  + ". They count in the mean ± std above, not in the paired and update tables, "
                  "the per-task matrix or the plots.\n\n")
    left_out = "".join(f"\nUnfinished, left out: `{run}` ({n} of {total} tasks)." for run, (n, total) in
                       sorted(unfinished.items()))
    paired = ""
    if base in runs and len(runs) > 1:
        paired = (f"\nPaired with `{base}` task by task (same seed, same tasks); p: exact McNemar test on the "
                  f"tasks only one of the two solved; difference: method - `{base}` success with Newcombe's 95% "
                  "interval for paired proportions (method 10).\n\n" + paired_markdown(paired_rows(runs, base), base))
    heldout = merge_runs(load_archive(archive, HELDOUT_SUFFIX), load_runs(root, HELDOUT_NAME))
    rows = heldout_rows({m: {s: r for s, r in seeds.items() if s in runs.get(m, {})} for m, seeds in heldout.items()},
                        base)
    if rows:
        paired += HELDOUT_INTRO + heldout_markdown(rows)
        files["heldout"] = out / "heldout.json"
        files["heldout"].write_text(json.dumps(rows, indent=1))
    for method, reference in pairs:
        paired += pair_markdown(runs, heldout, method, reference)
    updates = ("\nUpdates per run: loss of the objective per updating task, drift KL(student || initial) and "
               "entropy at the first response token over the stream (nats).\n\n" + update_markdown(update_rows(runs)))
    if memory := memory_rows(runs):
        updates += ("\nIn-context memory per run (`lit_ascent.memory`): tokens of the block each stream task was shown "
                    "(a task with an empty memory counts 0), the entries shown and those the token cap cut; on the tasks "
                    "shown a block, the share of the agent's actions that repeat one the block quotes, verbatim, and one it "
                    "says was rejected (a playbook's warnings); and "
                    "the success rate on the tasks shown a block and on the others.\n\n"
                    + memory_markdown(memory))
    files["table"].write_text(intro + markdown_table(table) + left_out + ("\n" if left_out else "") + paired + updates)
    seeds = sorted({seed for by_seed in runs.values() for seed in by_seed})
    files["per_task"] = out / "per_task.md"
    files["per_task"].write_text("Turns to success per task ('-': not solved), stream order.\n"
                                 + "".join(f"\n## {seed}\n\n{task_matrix(runs, seed)}" for seed in seeds))
    files["numbers"].write_text(json.dumps(table, indent=1))
    files["running_success"] = plot_curves(method_curves(runs, None), "Running success over the stream",
                                           "success so far", out / "running_success.png")
    for name, (key, title, ylabel) in DIAGNOSTICS.items():
        files[name] = plot_curves(method_curves(runs, key), title, ylabel, out / f"{name}.png")
    return files


@dataclass
class ReportOptions:
    """The command line of ``python -m lit_ascent.results.report``."""

    root: Path = field(metadata={"positional": True})
    """Folder holding <method>/<seed>/experience.jsonl."""
    out: Path
    """Output folder (e.g. docs/results/<name>)."""
    base: str = "base"
    """Method folder used as the base-model reference."""
    common_prefix: bool = False
    """Compare all runs on the tasks every run of the seed has finished (streams in progress)."""
    previous: Path | None = None
    """An earlier report's results.json: per-seed figures for runs without a log."""
    pairs: list[str] = field(default_factory=list)
    """METHOD:REFERENCE comparisons besides the base, paired task by task (e.g. ascent_procedural:procedural)."""


def main(argv: list[str] | None = None) -> dict[str, Path]:
    args = parse_options(ReportOptions, argv, prog="python -m lit_ascent.results.report", description=__doc__)
    files = write_report(args.root, args.out, args.base, args.common_prefix, args.previous, args.pairs)
    print(files["table"].read_text())
    for name, path in files.items():
        print(f"{name}: {path}")
    return files


if __name__ == "__main__":
    main()
