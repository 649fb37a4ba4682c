"""Which steps SGS kept in a cycles run's first distillation (issue 36): the cycle-0 verified episodes are
played again (greedy; the initial model, so the same episodes as the run's), and the run's draws of
``distil`` are replayed to list each update's kept steps, valid or invalid, with their actions.

    PYTHONPATH=. python scripts/sgs_kept_steps.py runs/resail_cycles/sdpo_resail/seed0

Reads the run's ``config.yaml`` and ``tasks.jsonl`` (in runs/, not the archive); prints one line per kept
step and, over the cycle's updates, the share of kept steps that were invalid against the share of all drawn steps.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from lit_ascent.cycles import build_parser, cycle_rng, deployment_tasks, draw_batch, privileged_texts
from lit_ascent.evaluate import evaluate
from lit_ascent.models import load_policy


def main(run: Path) -> None:
    parser = build_parser()
    cfg = parser.parse_args(["--config", str(run / "config.yaml")])
    init = parser.instantiate(cfg)
    torch.manual_seed(init.seed)
    rows = [json.loads(line) for line in (run / "tasks.jsonl").open()]
    solved = [r["task_id"] for r in rows if r["cycle"] == 0 and r["kind"] == "deployed" and r["verified"]]
    tasks = [t for t in deployment_tasks(init.env, init.num_tasks, init.task_seed) if t.task_id in solved]
    policy = load_policy(init.llm, "cpu")
    episodes = evaluate(policy, init.env, tasks, init.rollout, batch_size=init.cycles.eval_batch_size)
    verified = [e for e in episodes if e.verified]
    print(f"{len(verified)}/{len(tasks)} of the run's cycle-0 verified tasks verified again")
    objective = init.objective
    texts = privileged_texts(policy, objective, verified, init.cycles)
    prepared = [objective.prepare_episode(policy, e, z) for e, z in zip(verified, texts)]
    rng = cycle_rng(init.cycles, 0)
    kept = drawn = kept_invalid = drawn_invalid = 0
    for update in range(init.cycles.updates_per_cycle):
        batch = draw_batch(rng, len(verified), init.cycles.batch_size)
        chosen = objective.select([prepared[j] for j in batch])
        for j, p in zip(batch, chosen):
            drawn, drawn_invalid = drawn + p.num_steps, drawn_invalid + int(p.invalid.sum())
            for k in p.selected.nonzero().flatten().tolist():
                kept, kept_invalid = kept + 1, kept_invalid + int(p.invalid[k])
                e = verified[j]
                print(f"update {update + 1}: {e.task.task_id} step {k + 1}/{p.num_steps} "
                      f"{'INVALID' if p.invalid[k] else 'valid'} s={float(p.scores[k]):.3f} "
                      f"rank {int((p.scores > p.scores[k]).sum()) + 1} in episode: {e.turns[k].action!r}")
    print(f"kept {kept} steps, {kept_invalid} invalid ({kept_invalid / max(kept, 1):.0%}); "
          f"drawn {drawn} steps, {drawn_invalid} invalid ({drawn_invalid / max(drawn, 1):.0%})")
    init.env.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
