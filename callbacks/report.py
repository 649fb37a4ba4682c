"""Human-readable outcome per task and a final summary of the stream."""
from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_info


def summarize(records: list[dict]) -> dict[str, float]:
    """Stream summary from per-task records (verified, turns, invalid, updates)."""
    n = len(records)
    half = records[n // 2:]
    turns = sum(r["turns"] for r in records)
    return {
        "tasks": n,
        "success_rate": sum(r["verified"] for r in records) / max(n, 1),
        "second_half_success_rate": sum(r["verified"] for r in half) / max(len(half), 1),
        "mean_turns": turns / max(n, 1),
        "invalid_rate": sum(r["invalid"] for r in records) / max(turns, 1),
        "updates": sum(r["updates"] for r in records),
    }


class StreamReport(L.Callback):
    """Prints one line per task and the stream summary at the end."""

    def __init__(self, verbose: bool = True):
        """
        Args:
            verbose: Print a line per task (the summary is always printed).
        """
        self.verbose = verbose
        self.records: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if pl_module.last is None:
            return
        episode, stats = pl_module.last
        rec = {**episode.summary(), "updates": stats.get("updates", 0)}
        self.records.append(rec)
        if self.verbose:
            t = episode.timings
            rank_zero_info(
                f"[task {rec['task_index']:4d}] {rec['task_id']}: "
                f"{'SOLVED' if rec['verified'] else 'failed'} in {rec['turns']} turns, "
                f"{rec['invalid']} invalid, {rec['updates']} updates "
                f"(rollout {t.get('rollout_s', 0):.1f}s = model {t.get('model_s', 0):.1f}s + env "
                f"{t.get('env_s', 0):.1f}s, update {stats.get('perf/update_s', 0):.1f}s)"
            )

    def state_dict(self) -> dict:
        return {"records": list(self.records)}

    def load_state_dict(self, state: dict) -> None:
        self.records = list(state["records"])

    def on_fit_start(self, trainer, pl_module) -> None:
        rank_zero_info(f"update budget: {pl_module.budget()}")

    def on_train_end(self, trainer, pl_module) -> None:
        s = summarize(self.records)
        rank_zero_info("stream summary: " + ", ".join(
            f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in s.items())
            + f" | update budget: {pl_module.budget()}")
