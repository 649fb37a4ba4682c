#!/usr/bin/env bash
# The sign control of a stream's held-out gain (docs/results/webshop_efficacy/PLAN.md). The run's
# end-of-stream fast weights, frozen, play its held-out goals again, with the run's own saved config:
#   scale +1  must reproduce the run's held-out outcomes (the same weights, the same play);
#   scale -1  the same change to the model in the opposite direction (model.llm.init_adapter_scale).
# A learned change helps at +1 and not at -1; a perturbation that only flips near-ties moves both alike.
# The stream part is one task of the base method (nothing is updated); only the held-out play counts.
#   scripts/sign_control.sh RUN_DIR OUT_DIR      e.g. runs/webshop_efficacy/ascent/seed0 runs/sign_control/seed0
# Each scale writes OUT_DIR/scale<s>/ (heldout.jsonl, train.log) and OUT_DIR/scale<s>/done when it finished.
set -euo pipefail
cd "$(dirname "$0")/.."
run=${1:?usage: scripts/sign_control.sh RUN_DIR OUT_DIR} out=${2:?usage: scripts/sign_control.sh RUN_DIR OUT_DIR}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
for scale in 1 -1; do
  dir=$out/scale$scale
  [ -e "$dir/done" ] && continue
  mkdir -p "$dir"
  echo "$(date -u +%FT%T) start $dir"
  .venv/bin/python train.py fit --config "$run/config.yaml" --config configs/methods/base.yaml \
    --model.llm.init_adapter "$run/adapter/final" --model.llm.init_adapter_scale "$scale" --data.num_tasks 1 \
    --trainer.logger.init_args.save_dir "$out" --trainer.logger.init_args.name "scale$scale" \
    --trainer.logger.init_args.version "" > "$dir/train.log" 2>&1
  touch "$dir/done"
  echo "$(date -u +%FT%T) end $dir"
done
