# Each target installs what it needs first, so a fresh machine needs nothing but Python 3.10+.
PY ?= python3
PIP ?= $(PY) -m pip
STAMP := .devcache/installed.stamp
# CPU machines: pin the CPU build of torch before anything can pull a CUDA build.
TORCH_PIN := $(shell $(PY) -c "import torch" 2>/dev/null && echo || echo "torch==2.13.0")

.PHONY: install test test-all-backends bench bench-quick train info support-table

$(STAMP): pyproject.toml
	@mkdir -p .devcache
	$(if $(TORCH_PIN),$(PIP) install -q $(TORCH_PIN),)
	$(PIP) install -q -e ".[test,cpu-build]"
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
