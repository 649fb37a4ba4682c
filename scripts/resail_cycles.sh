#!/usr/bin/env bash
# The ReSAIL cycles matrix on the TextCraft reference base, CPU schedule (issue 36; configs/resail/reference/cpu.yaml;
# docs/results/resail_cycles/PLAN.md).
# Each argument is one run, METHOD:SEED (methods: sdpo sdpo_resail oel oel_resail), played in turn; two
# workers, one per core, take the two cores:
#   scripts/resail_cycles.sh sdpo:0 sdpo:1 & scripts/resail_cycles.sh sdpo_resail:0 sdpo_resail:1 &
# A run writes runs/resail_cycles/<method>/seed<N>/ and resumes there after its last finished cycle when started
# again (a finished run only rewrites its adapter). Then:
#   python -m lit_ascent.results.cycles_report runs/resail_cycles --out docs/results/resail_cycles \
#       --pairs sdpo_resail:sdpo oel_resail:oel
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
python=${PYTHON:-.venv/bin/python}
for run in "$@"; do
  method=${run%%:*}; seed=${run##*:}
  overlay=()
  if [ "$method" != sdpo ]; then overlay=(--config "configs/resail/$method.yaml"); fi
  out=runs/resail_cycles/$method/seed$seed
  mkdir -p "$out"
  echo "$(date -u +%FT%TZ) $method seed $seed -> $out" | tee -a "$out/cycles.log"
  "$python" -m lit_ascent.cycles --config configs/resail/sdpo.yaml --config configs/resail/reference/textcraft.yaml \
    --config configs/resail/reference/cpu.yaml \
    "${overlay[@]}" --seed "$seed" --task_seed "$seed" --cycles.seed "$seed" --log_dir "$out" --resume true \
    >> "$out/cycles.log" 2>&1 || {
    rc=$?; failed=1
    echo "$(date -u +%FT%TZ) $method seed $seed: exited with $rc (137: killed, e.g. out of memory, see dmesg);" \
      "rerun to resume after its last finished cycle" | tee -a "$out/cycles.log"; }
done
exit "${failed:-0}"
