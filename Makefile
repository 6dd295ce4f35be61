# The two commands a fresh machine needs: `make serve` (and `make bench`) and `make test`.
# Each creates its own virtualenv in .venv and builds the Cython codec into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fastoip-installed
ARGS ?=

.PHONY: venv serve test bench build proto clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py src/fastoip/_codec.pyx src/fastoip/server/grpc/_http2.pyx scripts/native_deps.sh
	sh scripts/native_deps.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench,pandas]'
	touch $(STAMP)

build: venv  ## rebuild the native extensions after editing a .pyx
	$(BIN)/python setup.py build_ext --inplace

serve: venv  ## serve the built-in demo repository (gRPC :8001, HTTP :8000, metrics :8002)
	$(BIN)/fastoip serve $(ARGS)

bench: venv  ## throughput run against a fastoip on the demo repository
	$(BIN)/fastoip bench $(ARGS)

test: venv
	$(BIN)/python -m pytest -q $(ARGS)

proto: venv  ## regenerate src/fastoip/_proto from proto/
	$(BIN)/python scripts/gen_proto.py

clean:
	rm -rf $(VENV) build src/fastoip/_codec.c src/fastoip/_codec*.so src/fastoip/server/grpc/_http2.c \
		src/fastoip/server/grpc/_http2*.so
