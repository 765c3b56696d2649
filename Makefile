# lucebench: `make setup` once, `make test` to test, `.venv/bin/lucebench run` for the main job.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The PyTorch HF baseline needs torch; 2.13.0 is pinned so results name one version.
# On a CUDA machine pip fetches the CUDA build of the same version.
TORCH  ?= torch==2.13.0

.PHONY: setup engines test lint schema clean

setup: $(VENV)/.installed engines

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[hf,dev]"
	touch $@

# Builds the bundled engines for the detected backend (cpu, cuda or hip) into the build cache.
engines: $(VENV)/.installed
	$(BIN)/lucebench build

test: $(VENV)/.installed
	$(BIN)/pytest -q

lint: $(VENV)/.installed
	$(BIN)/ruff check lucebench tests

# Regenerates the committed JSON Schema of lucebench.result/v1 from the pydantic models.
schema: $(VENV)/.installed
	$(BIN)/python -m lucebench.results.export_schema

clean:
	rm -rf $(VENV) build .pytest_cache
