#!/usr/bin/env bash
# The efficacy study's proxy cells (docs/results/efficacy/PLAN.md, step 1): each cell replays the
# TextCraft base stream's first 20 tasks (model.playback.log) with one update setting, then plays the
# 64 held-out goals with its frozen fast weights. Cells come from a queue file, one per line:
#   base                      the base (no update): the initial model's held-out row
#   <method> <lr> <steps> <k>  e.g. "ascent 1e-3 2 4" (method: an overlay in configs/methods, else configs/ablations
#                              or configs/resail, e.g. reverse_kl, online_resail; ascent: none)
#   <method> <lr> <steps> 0 own   the cell plays its own 20-task stream instead of the recorded one
#                              (REINFORCE, REINFORCE++: their update uses every episode of their own policy)
# Workers take lines off the queue's top (a copy: cp docs/results/efficacy/queue.txt /tmp/q); several may share
# one queue, one per core: scripts/efficacy_proxy.sh /tmp/q & scripts/efficacy_proxy.sh /tmp/q &
# Blank lines and lines starting with # are skipped.
# Each cell writes runs/efficacy_proxy/<cell>/ (and <cell>/done when it finished); then
#   python -m lit_ascent.results.sweep --root runs/efficacy_proxy   archives the finished cells and writes the table.
set -uo pipefail
cd "$(dirname "$0")/.."
queue=${1:?usage: scripts/efficacy_proxy.sh QUEUE [PLAYBACK_LOG]}
log=${2:-runs/efficacy/base/seed0/experience.jsonl}
if [ ! -f "$log" ]; then  # the archived base stream (seed 0, 40 tasks, with turn texts)
  mkdir -p "$(dirname "$log")" && zcat docs/results/efficacy/runs/base/seed0.jsonl.gz > "$log"
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
while true; do
  while ! mkdir "$queue.lock" 2>/dev/null; do sleep 1; done
  if [ ! -s "$queue" ]; then rmdir "$queue.lock"; exit 0; fi
  line=$(head -n1 "$queue"); sed -i 1d "$queue"
  rmdir "$queue.lock"
  case "$line" in ''|'#'*) continue ;; esac
  read -r method lr steps k source <<<"$line"
  episodes=(--model.playback.log "$log")
  [ "${source:-}" = own ] && episodes=()
  if [ "$method" = base ]; then
    cell=base; extra=(--config configs/methods/base.yaml)
  else
    cell=${method}_lr${lr}_s${steps}_k${k}
    extra=(--model.optim.lr "$lr" --model.optim.updates_per_task "$steps" --model.replay.k "$k")
    if [ "$method" != ascent ]; then  # an overlay of configs/methods, else configs/ablations or configs/resail
      overlay=$(ls configs/{methods,ablations,resail}/"$method".yaml 2>/dev/null | head -n1)
      [ -n "$overlay" ] || { echo "$(date -u +%FT%T) skip $line: no configs/*/$method.yaml"; continue; }
      extra=(--config "$overlay" "${extra[@]}")
    fi
  fi
  out=runs/efficacy_proxy/$cell
  [ -e "$out/done" ] && continue
  mkdir -p "$out"
  echo "$(date -u +%FT%T) start $cell"
  .venv/bin/python train.py fit --config configs/textcraft/ascent.yaml --config configs/heldout/textcraft.yaml \
    --heldout.include_initial false "${extra[@]}" --seed_everything 0 --data.seed 0 --data.num_tasks 20 \
    "${episodes[@]}" --trainer.default_root_dir "$out" > "$out/train.log" 2>&1
  rc=$?
  echo "$(date -u +%FT%T) end $cell rc=$rc"
  [ $rc -eq 0 ] && touch "$out/done"
done
