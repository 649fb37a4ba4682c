"""Human-readable outcome per task and a final summary of the stream."""
from __future__ import annotations

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from lit_ascent.records import summarize

NOT_KEPT = ("texts", "timings")
"""Record keys the report does not keep: its records go into every stream checkpoint, the turn texts
are long, and the timings differ between a stream and its resumed copy."""


def learning_line(records: list[dict]) -> str:
    """What the updates changed, in one line, from the tasks' records: how many steps from how many
    episodes, the share of each updating episode's loss its steps removed (absorbed fraction), and the
    latest action drift on the probe set (measured before the last task's update)."""
    updating = [r for r in records if r["updates"]]
    if not updating:
        return "learning: no update"
    line = (f"learning: {sum(r['updates'] for r in updating)} optimiser steps from {len(updating)} episodes "
            f"({sum(r['verified'] for r in updating)} verified)")
    absorbed = [a for r in updating if (a := r.get("update", {}).get("update/absorbed_fraction")) is not None]
    if absorbed:
        line += "; each absorbed " + "/".join(f"{a:.0%}" for a in absorbed) + " of its episode's loss"
    last = records[-1]
    if last.get("diagnostics/probe_actions"):
        line += (f"; on {last['diagnostics/probe_actions']:.0f} probe actions before task {last['task_index']}: "
                 f"KL {last['diagnostics/action_kl']:.2g} nats from the initial model, "
                 f"{last['diagnostics/action_changes']:.0f} greedy actions changed")
    return line


class StreamReport(L.Callback):
    """Prints one line per task and the stream summary at the end; keeps the tasks' records (less
    ``NOT_KEPT``) for the summary, so a resumed stream's summary covers every task."""

    def __init__(self, verbose: bool = True):
        """
        Args:
            verbose: Print a line per task (the summary is always printed).
        """
        self.verbose = verbose
        self.records: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        outcome = outputs["outcome"]
        rec = {k: v for k, v in outcome.record.items() if k not in NOT_KEPT}
        self.records.append(rec)
        if self.verbose:
            t, stats = outcome.episode.timings, outcome.stats
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
