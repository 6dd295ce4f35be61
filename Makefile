# The two commands a fresh machine needs: `make serve` (and `make bench`) and `make test`.
# `make serve` / `make bench` install fastoip with its runtime dependencies only, into .venv-serve, with pip's
# progress shown; `make test` (and check, debug) install the whole developer toolchain into .venv.
# Each builds the Cython extensions into its venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fastoip-installed
CODEC_SOURCES := src/fastoip/_codec.pyx src/fastoip/_codec.pxd src/fastoip/_codec.h $(wildcard src/fastoip/wire/codec/*.pxi)
SHMGUARD_SOURCES := src/fastoip/_shmguard.pyx src/fastoip/_shmguard.pxd src/fastoip/_shmguard.h
HTTP2_SOURCES := $(wildcard src/fastoip/server/grpc/_http2.pyx src/fastoip/server/grpc/*.pxd)
RING_SOURCES := src/fastoip/pyworker/_ring.pyx
# the per-call path's .py modules that setup.py compiles with mypyc (its COMPILED_PY list, one path a line): an
# edit to one rebuilds them (the compiled module shadows the .py; tests/conftest.py refuses a stale one)
COMPILED_PY_SOURCES := $(shell sed -n 's/^    "\(src\/fastoip\/.*\.py\)",$$/\1/p' setup.py)
ARGS ?=
# make test's parallel workers: most end-to-end time is waiting on server processes, so more workers than cores
TEST_WORKERS ?= 6

.PHONY: browser dist venv serve-venv serve test test-unit test-e2e test-compat test-kserve test-triton-openai bench build proto clean check debug test-pure gpu-check triton-qa triton-qa-compare

SERVE_VENV ?= .venv-serve
SERVE_STAMP := $(SERVE_VENV)/.fastoip-installed

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py $(CODEC_SOURCES) $(SHMGUARD_SOURCES) $(HTTP2_SOURCES) $(RING_SOURCES) $(COMPILED_PY_SOURCES) scripts/native_deps.sh scripts/browser_deps.sh scripts/swagger_ui.py
	sh scripts/native_deps.sh
	sh scripts/browser_deps.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench,pandas]'
	touch $(STAMP)

dist: venv  ## dist/: the sdist and a manylinux wheel with libnghttp2 inside (the native gRPC frontend needs nothing on the target)
	sh scripts/native_deps.sh
	PY=$(BIN)/python sh scripts/dist.sh

browser:  ## Debian's headless Chromium and ChromeDriver for the /v2/docs browser test (make venv does this too)
	sh scripts/browser_deps.sh

build: venv  ## rebuild the native extensions after editing a .pyx or a compiled .py (pip builds them in isolation: Cython is not in .venv)
	$(BIN)/python -c 'import Cython' 2>/dev/null || $(BIN)/python -m pip install --quiet 'Cython>=3.1,<4'
	$(BIN)/python setup.py build_ext --inplace

serve-venv: $(SERVE_STAMP)

# No --quiet and no pip self-upgrade: a user sees each package arrive, and waits for nothing else.
$(SERVE_STAMP): pyproject.toml setup.py $(CODEC_SOURCES) $(SHMGUARD_SOURCES) $(HTTP2_SOURCES) $(RING_SOURCES) $(COMPILED_PY_SOURCES) scripts/native_deps.sh
	@echo "fastoip: [1/3] native gRPC frontend prerequisites (libnghttp2 headers)"
	@sh scripts/native_deps.sh
	@echo "fastoip: [2/3] runtime virtualenv $(SERVE_VENV) (no test or lint tools: make test has those)"
	@test -x $(SERVE_VENV)/bin/python || $(PYTHON) -m venv $(SERVE_VENV)
	@echo "fastoip: [3/3] pip install -e '.[client]' (downloads the runtime dependencies and tritonclient, then compiles the extensions: a few minutes)"
	$(SERVE_VENV)/bin/python -m pip install --disable-pip-version-check --progress-bar on -e '.[client]'
	@$(SERVE_VENV)/bin/fastoip --version
	@touch $@

serve: $(SERVE_STAMP)  ## serve the built-in demo repository (gRPC :8001, HTTP :8000, metrics :8002)
	$(SERVE_VENV)/bin/fastoip serve $(ARGS)

bench: $(SERVE_STAMP)  ## throughput sweep of a private fastoip on the demo repository (ARGS=... for perf_analyzer-style flags)
	$(SERVE_VENV)/bin/fastoip bench $(if $(ARGS),$(ARGS),--local-server)

test: venv
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(ARGS)

test-unit: venv  ## the tests without sockets or processes (tests/unit)
	$(BIN)/python -m pytest -q tests/unit $(ARGS)

test-e2e: venv  ## the end-to-end tests against real server processes (tests/e2e)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests/e2e $(ARGS)

# test-compat: the tritonclient-facing tests again, in a second venv with the OLDEST tritonclient fastoip supports.
# 2.41.0 is the oldest release pip installs beside protobuf 6 and grpcio >= 1.81 (what fastoip needs): 2.41.1-2.66
# pin protobuf < 5 or < 6, 2.67-2.71 pin grpcio < 1.68, and <= 2.40 pin protobuf < 4. Deselected, as bugs or API
# changes of that client, not of the server: BF16 (2.41 takes BF16 data as float32, the tests pass ml_dtypes'
# bfloat16 as >= 2.67 does) and the compressed-request cases of test_compression (2.41's http.aio forgot to import
# gzip/zlib: NameError). test_proto.py is not run: it compares the generated protos with tritonclient 2.73's.
COMPAT_VENV ?= .venv-compat
TRITONCLIENT_OLDEST ?= 2.41.0
COMPAT_STAMP := $(COMPAT_VENV)/.fastoip-tritonclient-$(TRITONCLIENT_OLDEST)
COMPAT_TESTS := tests/e2e/test_grpc.py tests/e2e/test_http_tritonclient.py tests/e2e/test_drop_in.py tests/e2e/test_http_drop_in.py
COMPAT_DESELECT := -k 'not BF16' $(foreach case,gzip-gzip deflate-deflate gzip-None,\
	--deselect 'tests/e2e/test_http_tritonclient.py::test_compression[$(case)]')

$(COMPAT_STAMP): pyproject.toml setup.py $(CODEC_SOURCES) $(SHMGUARD_SOURCES)
	test -x $(COMPAT_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(COMPAT_VENV)/bin/python -m pip install --quiet -e . 'tritonclient[grpc,http]==$(TRITONCLIENT_OLDEST)' \
		'pytest>=8' 'pytest-timeout>=2.3'
	rm -f $(COMPAT_VENV)/.fastoip-tritonclient-*
	touch $@

test-compat: $(COMPAT_STAMP)  ## the tritonclient tests with the oldest supported tritonclient
	$(COMPAT_VENV)/bin/python -m pytest -q -p no:cacheprovider $(COMPAT_TESTS) $(COMPAT_DESELECT) $(ARGS)

# test-kserve: KServe's own SDK clients (tests/isolated/test_kserve_clients.py) against a real fastoip, in a venv of
# their own: kserve 0.21 cannot be installed beside mlserver 1.7 (starlette pins), and mlserver is in the test extra.
KSERVE_VENV ?= .venv-kserve
KSERVE_VERSION ?= 0.21.0
KSERVE_STAMP := $(KSERVE_VENV)/.fastoip-kserve-$(KSERVE_VERSION)

$(KSERVE_STAMP): pyproject.toml setup.py $(CODEC_SOURCES) $(SHMGUARD_SOURCES)
	test -x $(KSERVE_VENV)/bin/python || $(PYTHON) -m venv $(KSERVE_VENV)
	$(KSERVE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(KSERVE_VENV)/bin/python -m pip install --quiet -e . 'kserve==$(KSERVE_VERSION)' 'pytest>=8' 'pytest-timeout>=2.3'
	rm -f $(KSERVE_VENV)/.fastoip-kserve-*
	touch $@

test-kserve: $(KSERVE_STAMP)  ## KServe's SDK clients (REST V1/V2, gRPC) against fastoip, beside no mlserver
	FASTOIP_TEST_ISOLATED=1 $(KSERVE_VENV)/bin/python -m pytest -q -p no:cacheprovider -rs \
		tests/isolated/test_kserve_clients.py $(ARGS)

# test-triton-openai: Triton's own OpenAI-frontend tests against fastoip, through a launcher shim; Triton's files are
# read from TRITON_SERVER (a checkout or a bare git directory; empty: a shallow clone of TRITON_SERVER_REF) at run time.
TRITON_SERVER ?=
test-triton-openai: venv  ## Triton's python/openai tests (model management, restricted APIs, client) against fastoip
	$(BIN)/python scripts/triton_openai_tests.py $(TRITON_SERVER) $(ARGS)

# make check needs the developer tools and the dependencies' type information, not a build of the sources it
# reads: an edit to a compiled module rebuilds them for the tests (venv, about a minute), not for the lint.
TOOLS_STAMP := $(VENV)/.fastoip-tools

$(TOOLS_STAMP): pyproject.toml
	$(MAKE) venv
	touch $@

check: $(TOOLS_STAMP)  ## the guard-rails CI runs before the tests: ruff, mypy (config in pyproject.toml), generated code current
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python scripts/gen_proto.py --check
	$(BIN)/python scripts/import_graph.py

# The bounds-checked build (setup.py: FASTOIP_DEBUG=1: Cython's boundscheck/initializedcheck, -O0 -g) of every
# native extension (codec, HTTP/2 session, shared-memory guard) is made from a copy of the tree, so neither the
# release extensions nor their generated .c files are touched; the tests that drive them in memory (codec,
# fuzz, the HTTP/2 session cut at every byte, the native calls) run against it through PYTHONPATH.  The per-call
# path's modules are not compiled there (FASTOIP_PURE_PYTHON=1): those tests also run the interpreted .py code.
DEBUG_DIR := build/debug
DEBUG_TESTS := tests/unit/test_codec_fuzz.py tests/unit/test_codec.py tests/unit/test_http2_session.py tests/unit/test_native_calls.py
debug: venv  ## build the bounds-checked extensions into build/debug and run the in-memory native tests on them
	$(BIN)/python -m pip install --quiet "Cython>=3.1,<4" "setuptools>=77"  # [build-system] requires, for setup.py
	rm -rf $(DEBUG_DIR) && mkdir -p $(DEBUG_DIR)
	cp -r setup.py pyproject.toml README.md src $(DEBUG_DIR)/
	find $(DEBUG_DIR)/src -name '*.so' -delete
	rm -f $(DEBUG_DIR)/src/fastoip/_codec.c $(DEBUG_DIR)/src/fastoip/_shmguard.c $(DEBUG_DIR)/src/fastoip/server/grpc/_http2.c \
		$(DEBUG_DIR)/src/fastoip/pyworker/_ring.c
	cd $(DEBUG_DIR) && FASTOIP_DEBUG=1 FASTOIP_PURE_PYTHON=1 $(abspath $(BIN))/python setup.py --quiet build_ext --inplace
	PYTHONPATH=$(DEBUG_DIR)/src $(BIN)/python -c "import sys, importlib, importlib.util; \
		names = ['fastoip._codec', 'fastoip._shmguard']; \
		names += ['fastoip.server.grpc._http2'] if importlib.util.find_spec('fastoip.server.grpc._http2') else []; \
		wrong = [m.__file__ for m in map(importlib.import_module, names) if '$(DEBUG_DIR)/' not in m.__file__]; \
		sys.exit('not the debug build: ' + ', '.join(wrong) if wrong else None)"
	PYTHONPATH=$(DEBUG_DIR)/src $(BIN)/python -m pytest -q -p no:cacheprovider $(DEBUG_TESTS) $(ARGS)

# test-pure: the compiled modules' interpreted twins tested too (DESIGN.md principle 13, issue 36 item 6): `make
# test` runs the per-call path compiled by mypyc; this builds a copy with only the Cython extensions
# (FASTOIP_PURE_PYTHON=1) into build/pure and runs the Python-model tests and the codec's against it, so a
# construct that works in one build and not the other (mypyc's closures of generators did) is caught either way.
PURE_DIR := build/pure
PURE_TESTS := tests/e2e/test_triton_python_backend.py tests/e2e/test_python_models.py tests/e2e/test_bls_cycles.py \
	$(wildcard tests/e2e/test_pyworker_*.py) $(wildcard tests/unit/test_pyworker_*.py) \
	tests/unit/test_codec.py tests/unit/test_codec_fuzz.py
test-pure: venv  ## build the interpreted twin (no mypyc) into build/pure and run the Python-model and codec tests on it
	$(BIN)/python -m pip install --quiet "Cython>=3.1,<4" "setuptools>=77"  # [build-system] requires, for setup.py
	rm -rf $(PURE_DIR) && mkdir -p $(PURE_DIR)
	cp -r setup.py pyproject.toml README.md src $(PURE_DIR)/
	find $(PURE_DIR)/src -name '*.so' -delete
	rm -f $(PURE_DIR)/src/fastoip/_codec.c $(PURE_DIR)/src/fastoip/_shmguard.c $(PURE_DIR)/src/fastoip/server/grpc/_http2.c \
		$(PURE_DIR)/src/fastoip/pyworker/_ring.c
	cd $(PURE_DIR) && FASTOIP_PURE_PYTHON=1 $(abspath $(BIN))/python setup.py --quiet build_ext --inplace
	PYTHONPATH=$(PURE_DIR)/src $(BIN)/python -c "import sys, importlib; \
		names = ['fastoip.pyworker.worker', 'fastoip.backends.python.hosting.worker_process', 'fastoip.core.core']; \
		wrong = [m.__file__ for m in map(importlib.import_module, names) if not m.__file__.endswith('.py') \
			or '$(PURE_DIR)/' not in m.__file__]; \
		sys.exit('not the interpreted build: ' + ', '.join(wrong) if wrong else None)"
	PYTHONPATH=$(PURE_DIR)/src $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile \
		$(PURE_TESTS) $(ARGS)

proto: venv  ## regenerate src/fastoip/_proto from proto/
	$(BIN)/python scripts/gen_proto.py

clean:
	rm -rf $(VENV) $(COMPAT_VENV) $(KSERVE_VENV) $(SERVE_VENV) build src/fastoip/_codec.c src/fastoip/_codec*.so src/fastoip/_shmguard.c \
		src/fastoip/_shmguard*.so src/fastoip/server/grpc/_http2.c src/fastoip/server/grpc/_http2*.so \
		src/fastoip/pyworker/_ring.c src/fastoip/pyworker/_ring*.so \
		src/fastoip/_percall__mypyc*.so $(COMPILED_PY_SOURCES:.py=.*.so)

# Triton's own Python-backend QA (qa/L0_backend_python's CPU sub-suites), unchanged, against fastoip (issue 41).
# SNAPSHOT: triton-inference-server/server (a tree with qa/ or a bare git dir); PYTHON_BACKEND: python_backend, for the
# sub-suites that copy its examples. Not part of `make test`: it needs the snapshot and Triton's fixed ports 8000-8002.
triton-qa: venv  ## Triton's qa/L0_backend_python: make triton-qa SNAPSHOT=<server> [PYTHON_BACKEND=<dir>] [SERVER=triton]
	@test -n "$(SNAPSHOT)" || { echo "usage: make triton-qa SNAPSHOT=<triton server tree or bare git dir>"; exit 2; }
	PYTHONPATH=$(CURDIR)/src $(BIN)/python scripts/triton_qa.py --snapshot $(SNAPSHOT) \
		$(if $(PYTHON_BACKEND),--python-backend $(PYTHON_BACKEND)) $(if $(SERVER),--server $(SERVER)) $(ARGS)

# Compare two runs' per-case results (their --json files): make triton-qa-compare FASTOIP=a.json TRITON=b.json
triton-qa-compare:
	$(BIN)/python scripts/triton_qa.py --compare $(FASTOIP) $(TRITON)

# The GPU path (issue 26): fetch what the GPU machine lacks into .gpu/ (split to the device tool's per-command
# limit; prints the device commands), then run the check here: without a GPU it says "no GPU" and what it would run;
# the many-cores step (issue 42) runs as a dry run on a machine of fewer than 16 CPUs.
gpu-check: $(STAMP)  ## prepare the GPU run's files and dry-run it on CPU (scripts/gpu_check.sh says how to run it on a GPU)
	PY=$(BIN)/python bash scripts/gpu_check.sh prepare
	rm -rf /tmp/fastoip-gpu && for n in $$(seq 1 $$(cat .gpu/BATCHES)); do bash scripts/gpu_check.sh stage $$n; done
	PY=$(BIN)/python bash scripts/gpu_check.sh run
	PY=$(BIN)/python bash scripts/gpu_check.sh bench
	PY=$(BIN)/python bash scripts/gpu_check.sh cores
	PY=$(BIN)/python bash scripts/gpu_check.sh dry-run
