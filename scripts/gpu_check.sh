#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run: tests/test_cuda.py (the loop, the engines, bf16 and
# resume on the GPU) and `python -m lit_ascent.bench.cuda`. For a machine with no package registry
# (a lent GPU machine): the project's pinned pure-Python packages travel as wheels in .whl/
# (pip download --no-deps transformers==... peft==... jsonargparse==... into .whl) and are put first
# on the path; elsewhere the current environment is used as it is.
#   bash scripts/gpu_check.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/gpu_check}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch, transformers, peft, lightning, jsonargparse as j
print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'peft',
      peft.__version__, 'lightning', lightning.__version__, 'jsonargparse', j.__version__)"; } 2>&1 | tee "$out/gpu.txt"
python3 -m pytest tests/test_cuda.py -m gpu -ra --junitxml="$out/test_cuda.xml" 2>&1 | tee "$out/test_cuda.log"
tests=${PIPESTATUS[0]}
python3 -m lit_ascent.bench.cuda --out "$out/bench_cuda" 2>&1 | tee "$out/bench_cuda.log" | tail -n 30
bench=${PIPESTATUS[0]}
echo "tests rc=$tests bench rc=$bench"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
