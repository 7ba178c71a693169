# dpsub: the two commands are `make demo` and `make test`.
UV := $(shell command -v uv 2>/dev/null)
ifeq ($(UV),)
UV := python3 -m uv
endif
PYTEST_ARGS ?=

.PHONY: setup demo test test-all lint format bench results table lanes render gpu gpu-stage gpu-tiny clean

# --compile-bytecode: the installed packages' .pyc files are written once, at setup (about 20 s
# the first time, under 1 s after). Without them, where PYTHONDONTWRITEBYTECODE is set (this
# project's machines), every Python process compiled torch's sources again: importing torch
# and dpsub took 5.6 s instead of 2.7 s, paid by every CLI start, test subprocess and worker.
setup:  ## install uv if missing, then the locked environment (.venv)
	@$(UV) --version >/dev/null 2>&1 || python3 -m pip install --quiet uv
	$(UV) sync --frozen --compile-bytecode

demo: setup  ## DP-SGD on scikit-learn's digits (offline), prints test accuracy and epsilon
	$(UV) run --frozen dpsub-train experiment=demo

# Two workers (pytest-xdist), each test file on one worker: the suite is CPU-bound and a
# CI machine has 2 cores. PYTEST_ARGS="-n 0" runs it in one process.
test: setup  ## the test suite (slow tests excluded), ~3 minutes on 2 idle CPU cores
	$(UV) run --frozen pytest -m "not slow" -n 2 --dist loadfile $(PYTEST_ARGS)

test-all: setup
	$(UV) run --frozen pytest -n 2 --dist loadfile $(PYTEST_ARGS)

lint: setup
	$(UV) run --frozen ruff check src tests scripts
	$(UV) run --frozen ruff format --check src tests scripts

format: setup
	$(UV) run --frozen ruff format src tests scripts
	$(UV) run --frozen ruff check --fix src tests scripts

bench: setup  ## step time / memory of every mechanism vs non-private training
	$(UV) run --frozen python scripts/bench.py --models mnist_cnn resnet20

results: setup  ## the CPU runs behind results/README.md (reduced GEP-paper setting, ~25 min)
	bash scripts/run_cpu_results.sh

TABLE ?= gep1-mnist
SETTING ?= paper
table: setup  ## one paper table (conf/paper/): make table TABLE=gep1-mnist SETTING=cpu [ARGS=--tune|--dry-run|--help] [OVERRIDES=train.epochs=3]; runs what is missing (committed runs are reused), then renders
	$(UV) run --frozen python scripts/reproduce.py $(TABLE) --setting $(SETTING) $(ARGS) $(OVERRIDES)
	$(if $(filter -h --help --dry-run,$(ARGS)),,$(UV) run --frozen python scripts/make_table.py $(TABLE) --setting $(SETTING) $(OVERRIDES))

STOP ?= +2h30m
LANES_ARGS ?=
lanes: setup  ## the long campaigns on one lane per core until STOP (conf/lanes/cpu.yaml): make lanes STOP=11:35 OVERRIDES=data.root=/data/cifar10 [LANES_ARGS="--lanes 1 --threads 2 --fit-margin 0.4"]
	$(UV) run --frozen python scripts/lanes.py --stop-at $(STOP) $(LANES_ARGS) $(OVERRIDES)

render: setup  ## re-render a table from its runs only (outputs/tables, else the committed results/tables), keeping the recorded commit and hardware
	$(UV) run --frozen python scripts/make_table.py $(TABLE) --setting $(SETTING) $(OVERRIDES)

# On a GPU machine (no uv, no network): the checkout with .gpu/ carried; $OUT comes back.
GPU_ARGS ?=
gpu:  ## GPU kit: check, smoke suite, bench, table cells (docs/gpu.md); GPU_ARGS="--steps check cells"
	PYTHONPATH=src python3 scripts/gpu_run.py --out "$${OUT:?set OUT to the folder that comes back}" $(GPU_ARGS)

gpu-stage: setup  ## fill .gpu/ (wheels, CIFAR-10 packed losslessly, anchors) from ../shared, print the carry size
	$(UV) run --frozen python scripts/gpu_run.py --stage

gpu-tiny: setup  ## every step of the GPU kit on the CPU at toy sizes
	$(UV) run --frozen python scripts/gpu_run.py --tiny --out outputs/gpu-tiny --max-cells 1 --root outputs/gpu-tiny-root

clean:
	rm -rf outputs/runs outputs/multirun .pytest_cache
