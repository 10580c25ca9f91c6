# ddp_teach: `make lab` runs the course, `make test` checks all of it.
# Everything lives in .venv and .jupyter inside the repo; nothing is
# registered elsewhere (no global kernel spec, no ~/.jupyter settings;
# `make kernel` is the one exception, on purpose).
# The first of python3, python3.13, python3.12, python3.11 that is 3.11-3.13
# (a stock Mac's python3 is 3.9); PYTHON=/path/to/python overrides it.
SUPPORTED_PYTHON := import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))
PYTHON ?= $(firstword $(foreach p,python3 python3.13 python3.12 python3.11,\
	$(shell command -v $(p) >/dev/null 2>&1 && $(p) -c '$(SUPPORTED_PYTHON)' 2>/dev/null && echo $(p))))
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Extra pip arguments for torch, e.g. a CPU-only index on a laptop (README).
TORCH_PIP_ARGS ?=
# `make lab` serves LAB_ROOT and opens on the course's first notebook;
# LAB_ARGS adds JupyterLab options (e.g. LAB_ARGS="--port=8890 --no-browser").
LAB_ROOT ?= notebooks
LAB_ARGS ?=

export JUPYTER_CONFIG_DIR := $(CURDIR)/.jupyter/config
export JUPYTER_DATA_DIR := $(CURDIR)/.jupyter/data
export JUPYTER_RUNTIME_DIR := $(CURDIR)/.jupyter/runtime
export IPYTHONDIR := $(CURDIR)/.jupyter/ipython
export MPLCONFIGDIR := $(CURDIR)/.jupyter/matplotlib
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: setup lab kernel browser test test-mutants test-gpu test-isa test-versions test-colab \
	bench bench-gpu html clean

setup: $(STAMP) | .jupyter

.jupyter:
	mkdir -p $(JUPYTER_CONFIG_DIR) $(JUPYTER_DATA_DIR) $(JUPYTER_RUNTIME_DIR) \
		$(IPYTHONDIR) $(MPLCONFIGDIR)

# Re-installs only when pyproject.toml or constraints.txt change; otherwise a
# no-op. The package declares ranges; constraints.txt fixes every version.
$(STAMP): pyproject.toml constraints.txt
	@test -n "$(PYTHON)" || { echo "make: no Python 3.11-3.13 found (python3," \
		"python3.13, python3.12, python3.11); install one, or pass" \
		"PYTHON=/path/to/python3.12"; exit 1; }
	@$(PYTHON) -c '$(SUPPORTED_PYTHON)' || { echo "make: $(PYTHON) is" \
		"$$($(PYTHON) -V 2>&1); the course needs Python 3.11-3.13: pass" \
		"PYTHON=/path/to/python3.12"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt $(TORCH_PIP_ARGS) torch==2.13.0
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[lab,test]"
	touch $(STAMP)

# Local only, token on; --allow-root only where the user is root (containers).
lab: setup
	$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir=$(LAB_ROOT) \
		--LabApp.default_url=/lab/tree/00_welcome.ipynb \
		$(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# Registers this environment as a Jupyter kernel named "ddp_teach" for the
# user, so a JupyterHub's or VS Code's Jupyter, which cannot reach `make lab`'s
# private server, can run the course: pick the kernel "Python (ddp_teach)".
kernel: setup
	env -u JUPYTER_DATA_DIR -u JUPYTER_CONFIG_DIR -u JUPYTER_RUNTIME_DIR -u IPYTHONDIR \
		$(BIN)/python -m ipykernel install --user --name ddp_teach \
		--display-name "Python (ddp_teach)"

# Chromium and its WebDriver (Debian/Ubuntu packages) for tests/notebooks/test_browser.py.
# Installed with apt-get when missing, as root or with password-less sudo;
# otherwise a message, and that test is skipped.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then \
		:; \
	elif ! command -v apt-get >/dev/null; then \
		echo "make browser: no apt-get here; install Chromium and chromedriver" \
			"yourself, or tests/notebooks/test_browser.py is skipped"; \
	elif [ "$$(id -u)" = 0 ] || sudo -n true 2>/dev/null; then \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		echo "make browser: installing chromium and chromium-driver with apt-get"; \
		$$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends \
			chromium chromium-driver >/dev/null \
		|| echo "make browser: apt-get failed; tests/notebooks/test_browser.py is skipped"; \
	else \
		echo "make browser: chromium is missing and installing it needs root;" \
			"run 'sudo make browser', or tests/notebooks/test_browser.py is skipped"; \
	fi

test: setup browser
	$(BIN)/python -m pytest

# One-edit mutants of the rank-based exercises' references run through their
# checkers; prints the share each checker rejects (tools/exercise_mutants.py).
# Not part of `make test`: each mutant starts worker ranks; many minutes.
test-mutants: setup
	$(BIN)/python tools/exercise_mutants.py --accepted

# The CUDA and nccl paths (tests/gpu) and the notebooks with GPU cells, on a
# machine with GPUs. Without one every test is skipped, with the reason.
test-gpu: setup
	$(BIN)/python -m pytest -m gpu -rs tests/gpu

# The GPUs of this machine against the simulator's prediction for them
# (kernels, a ResNet-50 step, DDP and an all-reduce sweep over nccl):
# benchmarks/gpu_vs_sim.md. Needs CUDA; a few minutes.
bench-gpu: setup
	$(BIN)/python benchmarks/gpu_vs_sim.py

# The numerical tests under each CPU instruction set a learner's machine may
# have: oneDNN's kernels (convolutions, matrix products) and ATen's vectorised
# loops sum in a different order on SSE4.1, AVX2 and AVX-512, so a tolerance
# tuned on one CPU can fail on another. A setting above this CPU's runs as
# this CPU's best.
NUMERICAL_TESTS ?= tests/course tests/sim tests/exercises
test-isa: setup
	for isa in SSE41 AVX2 AVX512_CORE; do \
		echo "== ONEDNN_MAX_CPU_ISA=$$isa"; \
		ONEDNN_MAX_CPU_ISA=$$isa $(BIN)/python -m pytest -q \
			$(NUMERICAL_TESTS) || exit 1; \
	done
	echo "== ATEN_CPU_CAPABILITY=default"
	ATEN_CPU_CAPABILITY=default $(BIN)/python -m pytest -q $(NUMERICAL_TESTS)

# The unit tests and every notebook under the oldest and newest torch and
# Python the course calls known good (ddp_teach/compat.py), in environments
# built once under ~/.cache/ddp_teach/versions (a few GB each from PyPI).
test-versions: setup
	$(BIN)/python tools/check_other_versions.py --notebooks

# The notebooks' install cell, then every notebook, in an environment with
# Colab's kernel-side versions (built once under ~/.cache/ddp_teach; a few
# GB from PyPI; about 10 minutes). COLAB_PYTHON: a Python 3.12, as Colab runs.
COLAB_PYTHON ?= python3.12
test-colab: setup
	$(BIN)/python tools/check_colab_like.py --python $(COLAB_PYTHON) --all

# Each benchmark writes its own section (benchmarks/section.py); results.md
# is all of them together.
bench: setup
	$(BIN)/python benchmarks/launcher_latency.py
	$(BIN)/python benchmarks/timeline_overlap.py
	$(BIN)/python benchmarks/ring_vs_gloo.py
	$(BIN)/python benchmarks/ddp_vs_torch.py
	$(BIN)/python benchmarks/zero_vs_torch.py
	$(BIN)/python benchmarks/sim_fidelity.py
	$(BIN)/python benchmarks/sim_vs_paper.py
	$(BIN)/python benchmarks/sim_vs_published.py
	$(BIN)/python benchmarks/progress_cost.py
	cat benchmarks/launcher_latency.md benchmarks/timeline_overlap.md \
		benchmarks/ring_vs_gloo.md benchmarks/ddp_vs_torch.md \
		benchmarks/zero_vs_torch.md benchmarks/sim_fidelity.md \
		benchmarks/sim_vs_paper.md benchmarks/sim_vs_published.md \
		benchmarks/progress_cost.md \
		> benchmarks/results.md

# Every notebook executed and rendered, with an index: build/html/index.html.
html: setup
	$(BIN)/python tools/build_html.py --out build/html

clean:
	rm -rf $(VENV) .jupyter build *.egg-info
