# Each target installs what it needs first, so a fresh machine needs nothing but Python 3.10+. Everything goes
# into a project-local virtual environment (.venv), never into the python3 first on the PATH; the stamp inside
# it skips the installs until pyproject.toml changes. Another environment: make test VENV=/path/to/venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kernel-dispatch.stamp
# Where the environment has no torch yet, this one goes in before anything else can pull a CUDA build
# (CPU machines get its CPU wheel); an environment that already has a torch keeps it.
TORCH_PIN := torch==2.13.0

.PHONY: install test test-all-backends bench bench-quick train info support-table

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_PIN)
	$(PY) -m pip install -q -e ".[test,cpu-build,hf,cute]"
	@touch $(STAMP)

install: $(STAMP)

## the quick CPU suite (golden everywhere, Triton interpreter on small shapes, TileLang lowering)
test: $(STAMP)
	$(PY) -m pytest -q -n 2 -m "not slow" -p no:cacheprovider

## the whole equivalence matrix on every backend this machine can run
test-all-backends: $(STAMP)
	$(PY) -m pytest -q -n 2 -p no:cacheprovider

train: $(STAMP)
	$(PY) train.py --config configs/tiny.yaml

bench: $(STAMP)
	$(PY) -m kernel_dispatch.bench

bench-quick: $(STAMP)
	$(PY) -m kernel_dispatch.bench --quick

info: $(STAMP)
	$(PY) -m kernel_dispatch.info

support-table: $(STAMP)
	$(PY) -m kernel_dispatch.info --markdown
