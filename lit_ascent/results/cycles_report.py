"""The iterated-cycles report (``lit_ascent.cycles``; issue 36): per method and cycle, mean ± std over seeds of
deployed (plain) success, PI-conditioned success, the share of steps SGS kept, the drift from the initial model
on action tokens, first-token entropy, repeated actions and the invalid rate; method-vs-method pairs per cycle,
task by task on the same deployment set (McNemar, Newcombe's interval); plots per cycle. "Kept steps invalid":
the share of distilled steps whose action the environment rejected (rows from before it was logged: -).

    python -m lit_ascent.results.cycles_report runs/resail_cycles --out docs/results/resail_cycles \\
        --pairs sdpo_resail:sdpo oel_resail:oel

Runs: ``<root>/<method>/<seed>/`` holding ``cycles.jsonl`` and ``tasks.jsonl`` (``lit_ascent.cycle_log``). A
finished run (its final ``adapter/`` written) is archived into ``<out>/runs/<method>/<seed>.{cycles,tasks}.jsonl.gz`` (and its ``cycles.log``, if any)
and read back from there when ``runs/`` is gone; unfinished runs are left out, named. With
``--include-unfinished``, an unfinished run's finished cycles are reported too, named as such, and archived apart
(``<out>/unfinished/``, dropped when the run finishes), so a stopped sitting's cycles outlive ``runs/``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from lit_ascent.action_words import UNPARSED, leading_words, word_shares
from lit_ascent.options import parse_options
from lit_ascent.records import read_jsonl
from lit_ascent.results.paired import mean_std, method_order, paired_markdown, paired_rows
from lit_ascent.results.report import parse_pair
from lit_ascent.results.run_archive import archive_file

FILES = ("cycles", "tasks")
LOG = "cycles.log"
"""The run's log (``scripts/resail_cycles.sh``): its ``evaluate:`` and ``distil:`` lines, archived with the rows."""
COLUMNS = {  # key in a cycle row -> (header, scale; 100: shown in percent)
    "deployed/success_rate": ("deployed success (%)", 100),
    "probe/pi_success": ("PI-conditioned success (%)", 100),
    "sgs_kept": ("steps SGS kept (%)", 100),
    "resail/selected_invalid_share": ("kept steps invalid (%)", 100),
    "diagnostics/action_kl": ("action KL from the initial model (nats)", 1),
    "diagnostics/first_token_entropy": ("first-token entropy (nats)", 1),
    "diagnostics/repeat_action_rate": ("repeated actions (%)", 100),
    "diagnostics/back_to_back_rate": ("back-to-back repeats (%)", 100),
    "deployed/invalid_rate": ("invalid rate (%)", 100),
}
COSTS = {"perf/collect_s": "deployment + probe (h)", "perf/diagnostics_s": "diagnostics (h)",
         "perf/distil_s": "distillation (h)"}
"""A cycle row's timings (``lit_ascent.cycles``; carried rows hold 0) -> the cost table's header."""
PLOTS = {"deployed": "deployed/success_rate", "pi_conditioned": "probe/pi_success", "action_kl": "diagnostics/action_kl",
         "first_token_entropy": "diagnostics/first_token_entropy"}
CycleRuns = dict[str, dict[str, dict[str, list[dict]]]]  # method -> seed -> {"cycles": rows, "tasks": rows}


def sgs_kept(row: dict) -> float | None:
    """The share of the cycle's distilled steps that SGS kept (mean selected over mean steps per update)."""
    steps = row.get("resail/steps")
    return row["resail/selected_steps"] / steps if steps else None


def cycle_value(row: dict, key: str) -> float | None:
    return sgs_kept(row) if key == "sgs_kept" else row.get(key)


def load_cycle_runs(root: Path, archive: Path, partial: Path | None = None) -> tuple[CycleRuns, list[str]]:
    """Finished runs under ``root`` (archived into ``archive`` first) and those only in ``archive``; the names
    (``method/seed``) of unfinished runs. With ``partial``, unfinished runs are archived there and read too
    (a finished run's copy there is dropped); without it they are left out."""
    runs: CycleRuns = {}
    unfinished = set()
    for cycles in sorted(root.glob("*/*/cycles.jsonl")) if root.is_dir() else []:
        run, method, seed = cycles.parent, cycles.parent.parent.name, cycles.parent.name
        finished = (run / "adapter").is_dir()
        if not finished:
            unfinished.add(f"{method}/{seed}")
        if finished or (partial is not None and cycles.stat().st_size):
            store = archive if finished else partial
            for name in FILES:
                archive_file(run / f"{name}.jsonl", store / method / f"{seed}.{name}.jsonl.gz")
            if (run / LOG).is_file():  # kept for reading, not read back
                archive_file(run / LOG, store / method / f"{seed}.{LOG}.gz")
        if finished and partial is not None:
            for stale in (partial / method).glob(f"{seed}.*"):
                stale.unlink()
    for store in (archive, partial) if partial is not None else (archive,):
        for first in sorted(store.glob(f"*/*.{FILES[0]}.jsonl.gz")) if store.is_dir() else []:
            method, seed = first.parent.name, first.name.removesuffix(f".{FILES[0]}.jsonl.gz")
            if seed in runs.get(method, {}):
                continue  # finished (the archive) wins over a stale unfinished copy
            if store is partial:
                unfinished.add(f"{method}/{seed}")
            runs.setdefault(method, {})[seed] = {name: read_jsonl(first.parent / f"{seed}.{name}.jsonl.gz")
                                                 for name in FILES}
    return runs, sorted(unfinished)


def cycle_table(runs: CycleRuns) -> list[dict]:
    """One row per (method, cycle): mean ± std over the seeds of every ``COLUMNS`` value; ``carried``: how many
    seeds' rows repeat an earlier cycle's (nothing verified since, ``lit_ascent.cycles.fixed_point``)."""
    rows = []
    for method, seeds in runs.items():
        cycles = sorted({r["cycle"] for run in seeds.values() for r in run["cycles"]})
        for c in cycles:
            at = [r for run in seeds.values() for r in run["cycles"] if r["cycle"] == c]
            rows.append({"method": method, "cycle": c, "seeds": len(at), "carried": sum("carried_from" in r for r in at),
                         **{key: mean_std([cycle_value(r, key) for r in at]) for key in COLUMNS}})
    return rows


def format_stat(stat: tuple[float, float, int] | None, scale: float) -> str:
    if stat is None:
        return "-"
    mean, std, _ = stat
    return f"{mean * scale:.1f} ± {std * scale:.1f}" if scale == 100 else f"{mean:.3g} ± {std:.2g}"


def cycle_markdown(rows: list[dict]) -> str:
    head = ["method", "cycle", "seeds", *(h for h, _ in COLUMNS.values())]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [format_stat(r[key], scale) for key, (_, scale) in COLUMNS.items()]
        seeds = f"{r['seeds']} ({r['carried']} carried)" if r.get("carried") else str(r["seeds"])
        lines.append(f"| {r['method']} | {r['cycle']} | {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def cost_rows(runs: CycleRuns) -> list[dict]:
    """Per run, the hours of each phase summed over its rows; ``untimed``: the phases that some played row holds
    no time for (rows written before the phase was timed: the sum is a lower bound)."""
    rows = []
    for method, seeds in runs.items():
        for seed, run in seeds.items():
            played = [r for r in run["cycles"] if "carried_from" not in r]
            untimed = {k for k in ("perf/collect_s", "perf/diagnostics_s") if any(k not in r for r in played)}
            rows.append({"method": method, "seed": seed, "rows": len(run["cycles"]), "untimed": sorted(untimed),
                         **{k: sum(r.get(k, 0.0) for r in played) / 3600 for k in COSTS}})
    return rows


def cost_markdown(rows: list[dict]) -> str:
    head = ["method", "seed", "rows", *COSTS.values(), "total (h)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [("≥ " if k in r["untimed"] else "") + f"{r[k]:.2f}" for k in COSTS]
        total = ("≥ " if r["untimed"] else "") + f"{sum(r[k] for k in COSTS):.2f}"
        lines.append(f"| {r['method']} | {r['seed']} | {r['rows']} | " + " | ".join(cells) + f" | {total} |")
    return "\n".join(lines) + "\n"


def action_word_rows(runs: CycleRuns, words: int = 3) -> tuple[list[str], list[dict]]:
    """What the deployed agent does, per method and cycle: the share of its actions (all seeds' episodes
    pooled) by first word (``action_words``). The columns: the ``words`` commonest first words of every run's
    cycle-0 actions, then "other" (any other word, e.g. text copied from an observation) and "(unparsed)"."""
    def shares(c: int, seeds) -> dict[str, float]:
        return word_shares(t["actions"] for run in seeds for t in tasks_of(run, c, "deployed"))

    columns = leading_words(shares(0, [run for seeds in runs.values() for run in seeds.values()]), words)
    rows = []
    for method, seeds in runs.items():
        for c in sorted({t["cycle"] for run in seeds.values() for t in run["tasks"]}):
            share = shares(c, seeds.values())
            row = {w: share.get(w, 0.0) for w in [*columns, UNPARSED]}
            row["other"] = max(0.0, 1 - sum(row.values()))  # no float dust below 0
            rows.append({"method": method, "cycle": c, "seeds": sum(bool(tasks_of(r, c, "deployed"))
                                                                    for r in seeds.values()), **row})
    return [*columns, "other", UNPARSED], rows


def action_word_markdown(columns: list[str], rows: list[dict]) -> str:
    lines = ["| method | cycle | seeds | " + " | ".join(f"`{w}` (%)" for w in columns) + " |",
             "|" + "---|" * (len(columns) + 3)]
    lines += [f"| {r['method']} | {r['cycle']} | {r['seeds']} | " + " | ".join(f"{100 * r[w]:.1f}" for w in columns)
              + " |" for r in rows]
    return "\n".join(lines) + "\n"


def tasks_of(run: dict[str, list[dict]], cycle: int, kind: str) -> list[dict]:
    return [t for t in run["tasks"] if t["cycle"] == cycle and t["kind"] == kind]


def cycle_pair_rows(runs: CycleRuns, method: str, reference: str, kind: str = "deployed") -> list[dict]:
    """``paired_rows`` of ``method`` against ``reference`` at each cycle both reached (``kind``: deployed |
    probe), per seed and pooled, each row with its ``cycle``."""
    rows = []
    cycles = sorted({t["cycle"] for run in runs[method].values() for t in run["tasks"]})
    for c in cycles:  # seeds that reached cycle c in both methods
        both = {m: {seed: tasks for seed, run in runs[m].items() if (tasks := tasks_of(run, c, kind))}
                for m in (method, reference)}
        rows += [{**r, "seed": f"cycle {c}, {r['seed']}"} for r in paired_rows(both, reference)]
    return rows


def cycle_change_rows(runs: CycleRuns, kind: str = "deployed") -> list[dict]:
    """Each method's last cycle paired with its cycle 0 on the same tasks (``paired_rows``; per seed and pooled):
    whether the cycles raised or lowered success (``kind``: deployed | probe). The last cycle is the furthest any
    seed reached; seeds that have not reached it yet (unfinished runs) are left out of that method's rows."""
    rows = []
    for method, seeds in runs.items():
        last = max(r["cycle"] for run in seeds.values() for r in run["cycles"])
        if last == 0:
            continue  # an unfinished run's first cycle only: nothing to compare yet
        reached = {s: run for s, run in seeds.items() if any(r["cycle"] == last for r in run["cycles"])}
        ends = {f"{method} after {last}": {s: tasks_of(run, last, kind) for s, run in reached.items()},
                f"{method} at 0": {s: tasks_of(run, 0, kind) for s, run in reached.items()}}
        rows += paired_rows(ends, f"{method} at 0")
    return rows


def plot_cycles(rows: list[dict], key: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    header, scale = COLUMNS[key]
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, method in enumerate(dict.fromkeys(r["method"] for r in rows)):
        points = [(r["cycle"], r[key]) for r in rows if r["method"] == method and r[key] is not None]
        if points:
            ax.errorbar([c for c, _ in points], [s[0] * scale for _, s in points], [s[1] * scale for _, s in points],
                        label=method, marker="o", capsize=3, linestyle=("-", "--", ":", "-.")[i % 4])
    ax.set(title=header, xlabel="cycles of distillation", ylabel=header)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_cycles_report(root: Path, out: Path, pairs: list[str] | None = None,
                        include_unfinished: bool = False) -> dict[str, Path]:
    archive = out / "runs"
    runs, unfinished = load_cycle_runs(root, archive, out / "unfinished" if include_unfinished else None)
    if not runs:
        raise FileNotFoundError(f"no finished <method>/<seed>/cycles.jsonl under {root} and none archived in {archive}")
    runs = {m: runs[m] for m in method_order(runs, "")}
    rows = cycle_table(runs)
    text = (f"Cycles runs under `{root}` and archived in `{archive}`; row c: the model after c cycles of "
            "distillation, mean ± sample std over seeds. SGS kept: selected / distilled steps per update. Action KL: "
            "KL(model || initial) on the action tokens of cycle 0's first deployed episodes.\n\n" + cycle_markdown(rows))
    for name in unfinished:
        method, seed = name.split("/")
        done = [r["cycle"] for r in runs.get(method, {}).get(seed, {}).get("cycles", [])]
        text += (f"\nUnfinished, rows of cycles {done[0]}-{done[-1]} included: `{name}`." if done else
                 f"\nUnfinished, left out: `{name}`.")
    for kind, what in (("deployed", "deployed (plain)"), ("probe", "PI-conditioned")):
        change = cycle_change_rows(runs, kind)
        text += (f"\n\nEach method's last cycle against its cycle 0, {what} success, task by task (the cycles' "
                 "effect; 'only method': solved after the cycles only):\n\n"
                 + (paired_markdown(change, "cycle 0") if change else "No run has a row after cycle 0 yet.\n"))
    for method, reference in (parse_pair(p, runs) for p in pairs or ()):
        for kind, what in (("deployed", "deployed (plain)"), ("probe", "PI-conditioned")):
            text += (f"\n\n`{method}` vs `{reference}`, {what} success, task by task on the same tasks; McNemar exact "
                     f"p, difference with Newcombe's 95% interval:\n\n"
                     + paired_markdown(cycle_pair_rows(runs, method, reference, kind), reference))
    text += ("\n\nDeployed actions by first word (the verb), all seeds' episodes pooled: what the agent does after "
             "each cycle.\n\n" + action_word_markdown(*action_word_rows(runs)))
    text += ("\n\nWall hours of each run (one core, beside a second run), from its rows' `perf/` times; carried rows "
             "cost nothing; ≥: some rows were written before that phase was timed.\n\n" + cost_markdown(cost_rows(runs)))
    out.mkdir(parents=True, exist_ok=True)
    files = {"table": out / "cycles.md", "numbers": out / "cycles.json"}
    files["table"].write_text(text)
    files["numbers"].write_text(json.dumps(rows, indent=1))
    for name, key in PLOTS.items():
        files[name] = plot_cycles(rows, key, out / f"{name}.png")
    return files


@dataclass
class CyclesReportOptions:
    """The command line of ``python -m lit_ascent.results.cycles_report``."""

    root: Path = field(metadata={"positional": True})
    """Folder holding <method>/<seed>/cycles.jsonl and tasks.jsonl."""
    out: Path
    """Output folder (e.g. docs/results/resail_cycles)."""
    pairs: list[str] = field(default_factory=list)
    """METHOD:REFERENCE comparisons per cycle, task by task (e.g. sdpo_resail:sdpo)."""
    include_unfinished: bool = False
    """Also report the finished cycles of unfinished runs, named (archived apart, in <out>/unfinished/)."""


def main(argv: list[str] | None = None) -> dict[str, Path]:
    args = parse_options(CyclesReportOptions, argv, prog="python -m lit_ascent.results.cycles_report",
                         description=__doc__)
    files = write_cycles_report(args.root, args.out, args.pairs, args.include_unfinished)
    print(files["table"].read_text())
    return files


if __name__ == "__main__":
    main()
