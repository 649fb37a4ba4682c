"""Human-readable outcome per task and a final summary of the stream."""
from __future__ import annotations

import lightning as L
import torch
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


def learning_line(records: list[dict]) -> str:
    """What the updates changed, in one line: how many steps from how many episodes, the share of
    each updating episode's loss its steps removed (absorbed fraction), and the latest action drift
    on the probe set (measured before the last task's update)."""
    updating = [r for r in records if r["updates"]]
    if not updating:
        return "learning: no update"
    line = (f"learning: {sum(r['updates'] for r in updating)} optimiser steps from {len(updating)} episodes "
            f"({sum(r['verified'] for r in updating)} verified)")
    absorbed = [r["absorbed"] for r in updating if r.get("absorbed") is not None]
    if absorbed:
        line += "; each absorbed " + "/".join(f"{a:.0%}" for a in absorbed) + " of its episode's loss"
    last = records[-1]
    if last.get("diagnostics/probe_actions"):
        line += (f"; on {last['diagnostics/probe_actions']:.0f} probe actions before task {last['task_index']}: "
                 f"KL {last['diagnostics/action_kl']:.2g} nats from the initial model, "
                 f"{last['diagnostics/action_changes']:.0f} greedy actions changed")
    return line


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
        rec = {**episode.summary(), "updates": stats.get("updates", 0),
               "absorbed": stats.get("update/absorbed_fraction")}
        self.records.append(rec)
        if self.verbose:
            t = episode.timings
            rank_zero_info(
                f"[task {rec['task_index']:4d}] {rec['task_id']}: "
                f"{'SOLVED' if rec['verified'] else 'failed'} in {rec['turns']} turns, "
                f"{rec['invalid']} invalid, {rec['updates']} updates "
                f"(rollout {t.get('rollout_s', 0):.1f}s = model {t.get('model_s', 0):.1f}s + env "
                f"{t.get('env_s', 0):.1f}s, update {stats.get('perf/update_s', 0):.1f}s)"
                + (f"; ended by an environment error: {rec['error']}" if rec["error"] else "")
            )

    def state_dict(self) -> dict:
        return {"records": list(self.records)}

    def load_state_dict(self, state: dict) -> None:
        self.records = list(state["records"])

    def on_fit_start(self, trainer, pl_module) -> None:
        cfg, model = pl_module.llm_cfg, pl_module.policy.model
        rank_zero_info(f"model: {cfg.name_or_path} in {str(model.dtype).removeprefix('torch.')} "
                       f"(model.llm.dtype={cfg.dtype}), {torch.get_num_threads()} threads")
        rank_zero_info(f"update budget: {pl_module.budget()}")

    def on_train_end(self, trainer, pl_module) -> None:
        s = summarize(self.records)
        rank_zero_info("stream summary: " + ", ".join(
            f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in s.items())
            + f" | update budget: {pl_module.budget()}")
        rank_zero_info(learning_line(self.records))
