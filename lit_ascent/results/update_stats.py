"""What each run's updates did: how many, how large a loss, how far the student drifted.

The diagnostics that explain a success table (a method that barely moves the
student cannot change its success), read from the experience records as pure
functions; ``python -m lit_ascent.results.report`` appends the table to ``results.md``.
"""
from __future__ import annotations

import statistics

from lit_ascent.results.paired import Records, Runs, format_number

LOSS_KEYS = ("loss/total", "loss/divergence", "loss/nll")  # the objective's loss: first key a record has
ENTROPY, DRIFT = "diagnostics/first_token_entropy", "diagnostics/drift_kl"
ACTION_KL, ACTION_CHANGES = "diagnostics/action_kl", "diagnostics/action_changes"
REPEAT_RATE, LONGEST_RUN = "diagnostics/repeat_action_rate", "diagnostics/longest_action_run"
ABSORBED = "update/absorbed_fraction"


def objective_loss(loss: dict) -> float | None:
    """The loss the update minimised: ``loss/total`` when logged, else the divergence, else the NLL."""
    return next((loss[k] for k in LOSS_KEYS if k in loss), None)


def _values(records: Records, key: str) -> list[float]:
    return [r[key] for r in records if r.get(key) is not None]


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def update_stats(records: Records) -> dict:
    """One run: update count, loss per updating task (min, max), mean seconds per updating task,
    the largest drift KL and the median and largest first-token entropy over the stream; the mean
    absorbed fraction per updating task, the largest action drift (KL, changed probe actions), and
    the mean repeated-action rate and the longest run of one action (None when not logged)."""
    updating = [r for r in records if r.get("updates", 0) > 0]
    losses = [v for v in (objective_loss(r.get("loss", {})) for r in updating) if v is not None]
    seconds = [r["timings"]["update_s"] for r in updating if "update_s" in r.get("timings", {})]
    entropy, drift = _values(records, ENTROPY), _values(records, DRIFT)
    absorbed = [r["update"][ABSORBED] for r in updating if ABSORBED in r.get("update", {})]
    return {
        "updates": sum(r.get("updates", 0) for r in records),
        "loss_min": min(losses, default=None),
        "loss_max": max(losses, default=None),
        "update_s": _mean(seconds),
        "drift_max": max(drift, default=None),
        "entropy_median": statistics.median(entropy) if entropy else None,
        "entropy_max": max(entropy, default=None),
        "absorbed_mean": _mean(absorbed),
        "action_kl_max": max(_values(records, ACTION_KL), default=None),
        "action_changes_max": max(_values(records, ACTION_CHANGES), default=None),
        "repeat_rate_mean": _mean(_values(records, REPEAT_RATE)),
        "longest_run_max": max(_values(records, LONGEST_RUN), default=None),
    }


def update_rows(runs: Runs) -> list[dict]:
    """One row per (method, seed) in the order of ``runs``."""
    return [{"method": method, "seed": seed, **update_stats(records)}
            for method, seeds in runs.items() for seed, records in sorted(seeds.items())]



def update_markdown(rows: list[dict]) -> str:
    """The update rows as a markdown table."""
    head = ["method", "seed", "updates", "loss per update (min-max)", "s per update", "max drift KL",
            "first-token entropy (median / max)", "absorbed per update (mean)",
            "max action KL / changed probe actions", "repeated actions (mean rate / longest run)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        loss = "-" if r["loss_min"] is None else f"{format_number(r['loss_min'])}-{format_number(r['loss_max'])}"
        lines.append(f"| {r['method']} | {r['seed']} | {r['updates']} | {loss} | {format_number(r['update_s'], '.1f')} "
                     f"| {format_number(r['drift_max'])} | {format_number(r['entropy_median'])} / {format_number(r['entropy_max'])} "
                     f"| {format_number(r.get('absorbed_mean'), '.0%')} | {format_number(r.get('action_kl_max'))} / "
                     f"{format_number(r.get('action_changes_max'), '.0f')} | {format_number(r.get('repeat_rate_mean'), '.0%')} / "
                     f"{format_number(r.get('longest_run_max'), '.0f')} |")
    return "\n".join(lines) + "\n"
