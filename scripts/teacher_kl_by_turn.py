"""Where the hindsight teacher's signal sits in a stream's verified episodes (issue 29): each verified episode
of a recorded stream is replayed (``model.playback``) and, for every turn, the forward KL(teacher || initial
model) summed over the turn's tokens is printed with the positions where it is largest (the agent's own token
with its probability without / with PI, and the teacher's choice). With zero fast weights, as a stream
starts, this is what ASCENT's first update distils. Valid and invalid turns are summed apart.

    PYTHONPATH=. python scripts/teacher_kl_by_turn.py docs/results/efficacy/runs/base/seed0.jsonl.gz 20
    ... --no-filter    the teacher's PI keeps the invalid turns (configs/ablations/no_filter.yaml)

The stream must be the TextCraft reference config's (configs/textcraft/ascent.yaml: depth-2 eval goals, PI
content reasoning_actions).
"""
from __future__ import annotations

import argparse
import gzip
import tempfile
from pathlib import Path

import torch

from lit_ascent.envs.textcraft import TextCraftEnv
from lit_ascent.models import ModelConfig, load_policy
from lit_ascent.objectives import Distillation
from lit_ascent.objectives.divergences import forward_kl
from lit_ascent.playback import Playback
from lit_ascent.privileged import teacher_sequence


def read_prefix(log: str, num_tasks: int) -> Playback:
    """The first ``num_tasks`` records of ``log`` as a ``Playback``."""
    opener = gzip.open if log.endswith(".gz") else open
    with opener(log, "rt") as f, tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as tmp:
        tmp.writelines(line for _, line in zip(range(num_tasks), f))
    playback = Playback(tmp.name)
    Path(tmp.name).unlink()
    return playback


def turn_kl(tok, ids: list[int], turn, s_logp: torch.Tensor, t_logp: torch.Tensor, top: int) -> tuple[float, str]:
    """(KL(teacher || initial) summed over ``turn``'s tokens, its ``top`` largest positions as text); the
    log-probs are aligned (``t_logp[p]`` and ``s_logp[p]`` predict ``ids[p + 1]``)."""
    pos = torch.arange(turn.span[0] - 1, turn.span[1] - 1)
    t, s = t_logp[pos], s_logp[pos]
    kl = forward_kl(s, t)  # the loss's own divergence (log-probs are logits to it)
    parts = []
    for i in kl.topk(min(top, len(pos))).indices.tolist():
        p, own = int(pos[i]), ids[int(pos[i]) + 1]
        parts.append(f"{tok.decode(ids[turn.span[0]:p + 1])[-24:]!r} -> own {tok.decode([own])!r} "
                     f"{s[i, own].exp().item():.2f}/{t[i, own].exp().item():.2f}, teacher's "
                     f"{tok.decode([int(t[i].argmax())])!r} {t[i].max().exp().item():.2f}")
    return float(kl.sum()), "; ".join(parts)


def main(log: str, num_tasks: int, pi_valid_only: bool = True, top: int = 2) -> None:
    playback = read_prefix(log, num_tasks)
    env = TextCraftEnv(depths=[2], split="eval")
    tasks = {t.task_id: t for t in env.tasks()}
    policy = load_policy(ModelConfig(dtype="float32", warm_start_adapter="adapters/textcraft-ref"), "cpu")
    tok, objective = policy.tokenizer, Distillation()
    sums = {True: [0, 0, 0.0], False: [0, 0, 0.0]}  # valid -> [turns, tokens, summed KL]
    for task_id in (k for k, r in playback.records.items() if r["verified"]):
        ep = playback.episode(tok, env, tasks[task_id])
        ep.pi_valid_only = pi_valid_only  # callbacks.InvalidTurnFilter, on in the reference config
        t_ids, offset = teacher_sequence(tok, ep, objective.privileged_text(ep))
        with torch.no_grad(), policy.teacher():  # zero fast weights: the student is the initial model
            s_logp = policy.logits(torch.tensor(ep.token_ids)).float().log_softmax(-1)
            t_logp = policy.logits(torch.tensor(t_ids)).float().log_softmax(-1)[offset:]
        print(f"{task_id}: {len(ep.turns)} turns")
        for turn in ep.turns:
            kl, where = turn_kl(tok, ep.token_ids, turn, s_logp, t_logp, top)
            sums[turn.valid][0] += 1
            sums[turn.valid][1] += turn.span[1] - turn.span[0]
            sums[turn.valid][2] += kl
            print(f"  {'valid  ' if turn.valid else 'INVALID'} {turn.action!r}: KL {kl:.2f} nats; {where}")
    for valid, (n, tokens, kl) in sums.items():
        if n:
            print(f"{'valid' if valid else 'invalid'} turns: {n} ({tokens} tokens), KL(teacher || initial) "
                  f"{kl:.1f} nats in all, {kl / n:.2f} per turn, {kl / tokens:.4f} per token")
    env.close()


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("log", help="the stream's record (JSONL, gzip or not, with turn texts)")
    cli.add_argument("num_tasks", type=int, help="how many of its first tasks to read")
    cli.add_argument("--no-filter", action="store_true", help="keep invalid turns in the teacher's PI")
    cli.add_argument("--top", type=int, default=2, help="largest-KL positions printed per turn")
    args = cli.parse_args()
    main(args.log, args.num_tasks, not args.no_filter, args.top)
