# ddp_teach: `make lab` runs the course, `make test` checks all of it.
# Everything lives in .venv and .jupyter inside the repo; nothing is
# registered elsewhere (no global kernel spec, no ~/.jupyter settings).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Extra pip arguments for torch, e.g. a CPU-only index on a laptop (README).
TORCH_PIP_ARGS ?=

export JUPYTER_CONFIG_DIR := $(CURDIR)/.jupyter/config
export JUPYTER_DATA_DIR := $(CURDIR)/.jupyter/data
export JUPYTER_RUNTIME_DIR := $(CURDIR)/.jupyter/runtime
export IPYTHONDIR := $(CURDIR)/.jupyter/ipython
export MPLCONFIGDIR := $(CURDIR)/.jupyter/matplotlib
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: setup lab test bench html clean

setup: $(STAMP) | .jupyter

.jupyter:
	mkdir -p $(JUPYTER_CONFIG_DIR) $(JUPYTER_DATA_DIR) $(JUPYTER_RUNTIME_DIR) \
		$(IPYTHONDIR) $(MPLCONFIGDIR)

# Re-installs only when pyproject.toml changes; otherwise a no-op.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH_PIP_ARGS) torch==2.13.0
	$(BIN)/python -m pip install --quiet -e .
	touch $(STAMP)

# Local only, token on; --allow-root only where the user is root (containers).
lab: setup
	$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir=notebooks \
		$(if $(filter 0,$(shell id -u)),--allow-root)

test: setup
	$(BIN)/python -m pytest

# Each benchmark writes its own section; results.md is the two together.
bench: setup
	$(BIN)/python benchmarks/launcher_latency.py
	$(BIN)/python benchmarks/timeline_overlap.py
	$(BIN)/python benchmarks/ring_vs_gloo.py
	$(BIN)/python benchmarks/ddp_vs_torch.py
	$(BIN)/python benchmarks/zero_vs_torch.py
	cat benchmarks/launcher_latency.md benchmarks/timeline_overlap.md \
		benchmarks/ring_vs_gloo.md benchmarks/ddp_vs_torch.md \
		benchmarks/zero_vs_torch.md > benchmarks/results.md

html: setup
	mkdir -p build/html
	$(BIN)/jupyter nbconvert --to html --execute --output-dir build/html notebooks/*.ipynb

clean:
	rm -rf $(VENV) .jupyter build *.egg-info
