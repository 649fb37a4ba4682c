"""The report's held-out table: each run's frozen end-of-stream fast weights on the held-out set
(``callbacks/heldout.py`` writes ``heldout.jsonl``), paired task by task with the initial model, pooled
over seeds."""
from __future__ import annotations

from lit_ascent.action_words import top_word, word_shares
from lit_ascent.records import record_rates
from lit_ascent.results.paired import (COUNTS, Records, Runs, format_cell, format_difference, mean_std, method_order,
                                       paired_counts, paired_stats)


def heldout_end(records: Records) -> tuple[Records, Records, int | None]:
    """A run's held-out records: (the adapted model's at its last evaluation point, the initial model's,
    that point's tasks_seen). A task evaluated twice at one point (a resumed run) keeps its last record."""
    adapted = [r for r in records if r["model"] == "adapted"]
    last = max((r["tasks_seen"] for r in adapted), default=None)
    end = {r["task_id"]: r for r in adapted if r["tasks_seen"] == last}
    initial = {r["task_id"]: r for r in records if r["model"] == "initial"}
    return list(end.values()), list(initial.values()), last


def run_ends(heldout: Runs, method: str, base: str) -> tuple[list[tuple[Records, Records, int | None]], int]:
    """``heldout_end`` of each of the method's runs with a held-out evaluation, and how many of them take their
    initial row from the base run of their seed: a run without its own (``heldout.include_initial: false``) is
    paired with that run's held-out play, which is the initial model's, since the base's fast weights never move."""
    ends, borrowed = [], 0
    for seed, records in sorted(heldout[method].items()):
        adapted, initial, seen = heldout_end(records)
        if not adapted:
            continue
        if not initial and method != base and seed in heldout.get(base, {}):
            initial = heldout_end(heldout[base][seed])[0]
            borrowed += bool(initial)
        ends.append((adapted, initial, seen))
    return ends, borrowed


def heldout_rows(heldout: Runs, base: str = "base") -> list[dict]:
    """One row per method with a held-out evaluation: adapted and initial success (mean, std, n over seeds)
    and, pooled over seeds, the adapted model paired with the initial one task by task (``COUNTS`` with
    only_method = only adapted, only_base = only initial; exact McNemar p; difference and its 95% interval).
    ``initial_from_base``: how many of its runs were paired with their seed's base run (``run_ends``).
    ``verb``: the commonest first word of the base's held-out actions (of every run's without a base; TextCraft:
    craft); ``verb_share`` / ``initial_verb_share``: its share of the adapted / initial model's actions.
    ``score`` / ``initial_score``: the mean score where the environment grades episodes (``record_rates``;
    WebShop's reward), else None."""
    rows = []
    pool = heldout.get(base) or {s: r for seeds in heldout.values() for s, r in seeds.items()}
    verb = top_word(word_shares(r["actions"] for records in pool.values() for r in records if "actions" in r))

    def verb_share(records: Records) -> float | None:
        if not records or verb is None or any("actions" not in r for r in records):
            return None
        return word_shares(r["actions"] for r in records).get(verb, 0.0)

    for method in method_order(heldout, base):
        ends, borrowed = run_ends(heldout, method, base)
        if not ends:
            continue
        counts = dict.fromkeys(COUNTS, 0)
        for adapted, initial, _ in ends:
            for key, n in (paired_counts(adapted, initial) if initial else {}).items():
                counts[key] += n
        row = {"method": method, "seeds": len(ends), "tasks": sorted({len(a) for a, _, _ in ends}),
               "tasks_seen": sorted({t for _, _, t in ends}),
               "success": mean_std([record_rates(a)["success_rate"] for a, _, _ in ends]),
               "initial_success": mean_std([record_rates(i)["success_rate"] if i else None for _, i, _ in ends]),
               "initial_from_base": borrowed, "verb": verb,
               "verb_share": mean_std([verb_share(a) for a, _, _ in ends]),
               "initial_verb_share": mean_std([verb_share(i) for _, i, _ in ends]),
               "score": mean_std([record_rates(a).get("mean_score") for a, _, _ in ends]),
               "initial_score": mean_std([record_rates(i).get("mean_score") if i else None for _, i, _ in ends]),
               **counts}
        if sum(counts.values()):
            row.update(paired_stats(counts))
        rows.append(row)
    return rows


def heldout_markdown(rows: list[dict]) -> str:
    """The held-out rows as a markdown table ('-' where a run has no initial-model evaluation); the mean score
    column only where a row has one."""
    scored = any(r.get("score") is not None for r in rows)
    head = ["method", "seeds", "tasks", "after stream tasks", "adapted success (%)", "initial success (%)",
            "initial from base", "both solved", "only adapted", "only initial", "neither", "McNemar exact p",
            "difference (pp, 95% CI)", f"`{rows[0]['verb'] if rows else None}` actions, adapted / initial (%)",
            *(["score (mean reward x 100), adapted / initial"] if scored else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        paired = [*(str(r[k]) for k in COUNTS), f"{r['p']:.3g}", format_difference(r)] if "p" in r else ["-"] * 6
        cells = [r["method"], str(r["seeds"]), "/".join(map(str, r["tasks"])), "/".join(map(str, r["tasks_seen"])),
                 format_cell(r["success"], 100.0), format_cell(r["initial_success"], 100.0),
                 str(r["initial_from_base"]), *paired,
                 f"{format_cell(r['verb_share'], 100.0)} / {format_cell(r['initial_verb_share'], 100.0)}",
                 *([f"{format_cell(r['score'], 100.0)} / {format_cell(r['initial_score'], 100.0)}"] if scored else [])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


HELDOUT_INTRO = (
    "\nHeld-out evaluation (frozen, end of stream): the fast weights after the stream, frozen, on a fixed task set "
    "disjoint from the stream (the same tasks for every seed), weights in float32; 'initial': the initial model "
    "(adapter off) on the same tasks in the same run or, for a run without that row (`heldout.include_initial: "
    "false`; 'initial from base' counts them), the base run of its seed on the same tasks, whose fast weights never "
    "move. Success: mean ± sample std over seeds. Paired columns: pooled over seeds, tasks matched by id within each "
    "run; p: exact McNemar test on the tasks only one of the two solved; "
    "difference: adapted - initial success with Newcombe's 95% interval (method 10). The seeds share the tasks and the "
    "initial model, so pooled pairs are not independent across seeds: the pooled p and interval lean optimistic.\n\n")
