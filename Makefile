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

# Builds what the default `lucebench run` needs on the detected backend into the build cache
# ($$LUCEBENCH_CACHE, default ~/.cache/lucebench): the bundled `ar` engine and the pinned llama.cpp
# (llama-bench, llama-server, llama-quantize), plus the megakernel on CUDA. On a 2-core CPU machine the
# llama.cpp build is most of set-up's time (see README).
engines: $(VENV)/.installed
	$(BIN)/lucebench build

test: $(VENV)/.installed
	$(BIN)/pytest -q

lint: $(VENV)/.installed
	$(BIN)/ruff check lucebench tests scripts

# Regenerates the committed JSON Schema of lucebench.result/v1 from the pydantic models.
schema: $(VENV)/.installed
	$(BIN)/python -m lucebench.results.export_schema

clean:
	rm -rf $(VENV) build .pytest_cache
