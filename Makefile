# The two commands a fresh machine needs: `make serve` (and `make bench`) and `make test`.
# Each creates its own virtualenv in .venv and builds the Cython codec into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fastoip-installed
ARGS ?=

.PHONY: venv serve test bench build proto clean check debug

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py src/fastoip/_codec.pyx
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench,pandas]'
	touch $(STAMP)

build: venv  ## rebuild the codec after editing _codec.pyx
	$(BIN)/python setup.py build_ext --inplace

serve: venv  ## serve the built-in demo repository (gRPC :8001, HTTP :8000, metrics :8002)
	$(BIN)/fastoip serve $(ARGS)

bench: venv  ## throughput run against a fastoip on the demo repository
	$(BIN)/fastoip bench $(ARGS)

test: venv
	$(BIN)/python -m pytest -q $(ARGS)

check: venv  ## the guard-rails CI runs before the tests: ruff, mypy (config in pyproject.toml), generated code current
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python scripts/gen_proto.py --check

# The bounds-checked codec (setup.py: FASTOIP_DEBUG=1) is built from a copy of the tree, so neither the release
# extension nor its generated _codec.c is touched, and the codec tests run against it through PYTHONPATH.
DEBUG_DIR := build/debug
debug: venv  ## build the bounds-checked codec into build/debug and run the codec (fuzz) tests against it
	$(BIN)/python -m pip install --quiet "Cython>=3.1,<4" "setuptools>=77"  # [build-system] requires, for setup.py
	rm -rf $(DEBUG_DIR) && mkdir -p $(DEBUG_DIR)
	cp -r setup.py pyproject.toml README.md src $(DEBUG_DIR)/
	rm -f $(DEBUG_DIR)/src/fastoip/_codec*.so $(DEBUG_DIR)/src/fastoip/_codec.c
	cd $(DEBUG_DIR) && FASTOIP_DEBUG=1 $(abspath $(BIN))/python setup.py --quiet build_ext --inplace
	PYTHONPATH=$(DEBUG_DIR)/src $(BIN)/python -c "import sys, fastoip._codec as c; \
		sys.exit(None if '$(DEBUG_DIR)/' in c.__file__ else 'not the debug codec: ' + c.__file__)"
	PYTHONPATH=$(DEBUG_DIR)/src $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_codec_fuzz.py tests/test_codec.py $(ARGS)

proto: venv  ## regenerate src/fastoip/_proto from proto/
	$(BIN)/python scripts/gen_proto.py

clean:
	rm -rf $(VENV) build src/fastoip/_codec.c src/fastoip/_codec*.so
