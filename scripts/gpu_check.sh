#!/usr/bin/env bash
# The GPU path (issue 26) in one prepared run: `make gpu-check`.
#
#   scripts/gpu_check.sh prepare   here (network): the wheels the GPU machine lacks, for cp312 manylinux, and
#                                  libnghttp2's Debian packages, into .gpu/; files over PIECE_MIB split into
#                                  pieces; everything packed into .gpu/batch<N>/ folders of at most BATCH_MIB
#                                  each (the device tool carries at most 64 MiB a command); prints the plan
#   scripts/gpu_check.sh cores-bundle  here: only the cores step's archive (part of `prepare`)
#   scripts/gpu_check.sh plan      the device commands, one per batch, in order, and each step's expected time
#   scripts/gpu_check.sh stage N   there: copy batch N into $STAGE (it stays while the machine is held)
#   scripts/gpu_check.sh probe     there, in the first command: the GPU, Python and the packages relied on
#   scripts/gpu_check.sh run       there, after the last stage: reassemble and check the pieces, install into
#                                  /tmp/site, build the extensions (native gRPC frontend on the carried
#                                  libnghttp2 headers), run the GPU tests; $OUT/summary.md, build.log, tests.log
#   scripts/gpu_check.sh bench     there, the next command: benchmarks/gpu_bench.py (CUDA EP vs CPU EP, pinned vs
#                                  pageable, CUDA vs system shm vs bytes); the whole $OUT/summary.md and
#                                  gpu_bench.json (or .gpu/out/ without $OUT)
#   scripts/gpu_check.sh cores     there, after `run` (the native frontend built): benchmarks/cores.py on the
#                                  machine's 16 CPUs: native `simple` c=256 with h2load on 8 threads against
#                                  fastoip (one process) and the C++ grpc++ server with 1 and 8 completion-queue
#                                  threads, and the batched MLP c=256 on the CPU EP; cores.md/.json into $OUT.
#                                  The C++ server and h2load travel built (cores-bundle.tar.xz, made by `prepare`
#                                  with their libraries). On a machine of fewer than 16 CPUs it runs --dry-run
#                                  (c=16, 2 h2load threads, 2 s a point): the dry run of the step here.
#   scripts/gpu_check.sh dry-run   here: benchmarks/gpu_bench.py --dry-run (CPU EP, short; GPU parts listed)
#
# Without a GPU (no nvidia-smi, or it lists none), `run` and `bench` stop cleanly: "no GPU" and what they would
# have run, exit 0. `make gpu-check` is `prepare`, every `stage`, `run`, `bench`, `cores`, `dry-run` on this machine.
# The exact sequence of device commands, their carry lists and the device-time budget: benchmarks/RESULTS.md
# (2026-11-27, "The GPU check, completed") and `plan`.
set -euo pipefail
cd "$(dirname "$0")/.."

GPU_DIR=.gpu
STAGE=${STAGE:-/tmp/fastoip-gpu}
PIECE_MIB=${PIECE_MIB:-50}
BATCH_MIB=${BATCH_MIB:-54}
PY=${PY:-python3}
# What the GPU image lacks (its package list: the device tool's KINDS.md): ONNX Runtime's CUDA build, fastoip's
# HTTP stack, and tritonclient with what its grpc/http clients import. Exact versions: one of each travels.
WHEELS=(
    onnxruntime-gpu==1.31.1
    "tritonclient==2.73.0" python-rapidjson geventhttpclient gevent greenlet zope.event zope.interface brotli
    uvicorn httptools orjson
    # model-settings.json's schema (the first GPU run, 2026-11-27, found the image without pydantic)
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection typing-extensions
    # the image has grpcio and protobuf, of versions nobody has read: the ones fastoip is tested with travel
    grpcio==1.85.3 protobuf==6.33.6
)
DEBS=(libnghttp2-dev libnghttp2-14)
# The many-cores step's native programs, built here: the peers lab's C++ grpc++ server and h2load, with every
# library they load except glibc's own (the GPU image has a newer glibc; Debian's libraries run on it).
PEERS_DIR=${FASTOIP_PEERS_DIR:-$PWD/../shared/peers}
CORES_BUNDLE=cores-bundle.tar.xz
#: What the step's commands are given, in seconds (the plan below adds them up).
CORES_TIMEOUT=300

say() { echo "gpu-check: $*"; }

# -- device time: the session has DEVICE_BUDGET_S in all, counted from the first command (`probe` notes when it
# began; the machine's start before it is in MACHINE_START_S).  Each step notes its start and end in
# $STAGE/progress and in the summary, so a run cut short says where it stopped; a step that cannot finish in
# what is left is skipped, saying so.
DEVICE_BUDGET_S=${DEVICE_BUDGET_S:-900}
MACHINE_START_S=${MACHINE_START_S:-120}

elapsed_s() {
    local began
    began=$(cat "$STAGE/began_at" 2>/dev/null || date +%s)
    echo $(( $(date +%s) - began + MACHINE_START_S ))
}

step_begin() {
    # step_begin NAME EXPECTED_S: 1 (skip it) when less than EXPECTED_S of device time is left
    local name=$1 expected=$2 left
    mkdir -p "$STAGE"
    left=$(( DEVICE_BUDGET_S - $(elapsed_s) ))
    echo "$(date -u +%H:%M:%S) $name: begun ($left s of device time left, expects $expected s)" >> "$STAGE/progress"
    if [ "$left" -lt "$expected" ]; then
        say "$name: skipped: $left s of device time left, it needs about $expected s"
        echo "- $name: SKIPPED ($left s of device time left, needs about $expected s)" >> "$STAGE/summary.md"
        return 1
    fi
    return 0
}

step_end() {
    echo "$(date -u +%H:%M:%S) $1: done (exit ${2:-0}, $(elapsed_s) s of device time used)" >> "$STAGE/progress"
}

prepare() {
    mkdir -p "$GPU_DIR/wheels" "$GPU_DIR/debs"
    local platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
                     --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_34_x86_64)
    for wheel in "${WHEELS[@]}"; do
        say "fetching $wheel (cp312 manylinux)"
        "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            "${platforms[@]}" -d "$GPU_DIR/wheels" "$wheel" \
            || "$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
                --implementation py --abi none --platform any -d "$GPU_DIR/wheels" "$wheel"
    done
    if command -v apt-get >/dev/null; then
        (cd "$GPU_DIR/debs" && for deb in "${DEBS[@]}"; do ls "$deb"_*.deb >/dev/null 2>&1 || apt-get download -q "$deb"; done) \
            || say "apt-get download failed: the GPU run will fall back to the grpcio frontend"
    fi
    bundle_cores || say "the cores bundle could not be built: the cores step will measure fastoip alone"
    pack
    plan
}

bundle_cores() {
    # the C++ server (peers' grpc_cpp, its one completion queue polled by up to 64 threads instead of 4: the
    # source is copied and that one bound widened, the peers lab itself is left as it is) and h2load, with
    # their libraries, in one archive
    local build=$GPU_DIR/cores-build bundle=$GPU_DIR/cores-build/bundle
    rm -rf "$build" && mkdir -p "$bundle/bin" "$bundle/lib" "$GPU_DIR/cores"
    cp "$PEERS_DIR/peers/grpc_cpp/server.cc" "$PEERS_DIR/peers/grpc_cpp/grpc_service_min.proto" \
        "$PEERS_DIR/peers/grpc_cpp/Makefile" "$build/"
    sed -i 's/threads > 4) usage/threads > 64) usage/' "$build/server.cc"
    grep -q 'threads > 64) usage' "$build/server.cc" || { say "the C++ server's thread bound was not found"; return 1; }
    make -s -C "$build" OUT="$PWD/$build/out" CXXFLAGS="-O2 -std=c++17 -Wall -Wno-unused-parameter" \
        > "$build/build.log" 2>&1 || { say "building the C++ server failed: $build/build.log"; return 1; }
    cp "$build/out/grpc_cpp_server" "$(command -v h2load)" "$bundle/bin/"
    strip "$bundle/bin/grpc_cpp_server" 2>/dev/null || true
    ldd "$bundle/bin/grpc_cpp_server" "$bundle/bin/h2load" | awk '/=> \//{print $3}' | sort -u \
        | grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux-x86-64)\.so' \
        | xargs -r cp -L -t "$bundle/lib/"
    tar -C "$bundle" -cJf "$GPU_DIR/cores/$CORES_BUNDLE" .
    say "cores bundle: $(du -h "$GPU_DIR/cores/$CORES_BUNDLE" | cut -f1) ($(ls "$bundle/lib" | wc -l) libraries)"
}

pack() {
    # pieces of at most PIECE_MIB, then first-fit into batches of at most BATCH_MIB
    rm -rf "$GPU_DIR"/batch* "$GPU_DIR/pieces" && mkdir -p "$GPU_DIR/pieces"
    (cd "$GPU_DIR" && sha256sum wheels/* debs/* cores/* > SHA256SUMS 2>/dev/null || true)
    for file in "$GPU_DIR"/wheels/* "$GPU_DIR"/debs/* "$GPU_DIR"/cores/*; do
        [ -f "$file" ] || continue
        if [ "$(stat -c %s "$file")" -gt $((PIECE_MIB * 1024 * 1024)) ]; then
            split -b "${PIECE_MIB}m" -d -a 2 "$file" "$GPU_DIR/pieces/$(basename "$file").part"
        else
            cp "$file" "$GPU_DIR/pieces/"
        fi
    done
    # first fit, largest first: the fewest commands
    "$PY" - "$GPU_DIR" "$BATCH_MIB" <<'PACK'
import os, shutil, sys
root, limit = sys.argv[1], int(sys.argv[2]) * 1024 * 1024
pieces = sorted(((os.path.getsize(os.path.join(root, "pieces", n)), n) for n in os.listdir(os.path.join(root, "pieces"))),
                reverse=True)
batches: list[list] = []
for size, name in pieces:
    home = next((b for b in batches if b[0] + size <= limit), None)
    if home is None:
        home = [0, []]
        batches.append(home)
    home[0] += size
    home[1].append(name)
for index, (_, names) in enumerate(batches, 1):
    os.makedirs(os.path.join(root, f"batch{index}"))
    for name in names:
        shutil.move(os.path.join(root, "pieces", name), os.path.join(root, f"batch{index}", name))
shutil.copy(os.path.join(root, "SHA256SUMS"), os.path.join(root, f"batch{len(batches)}"))
open(os.path.join(root, "BATCHES"), "w").write(f"{len(batches)}\n")
PACK
    rmdir "$GPU_DIR/pieces"
}

plan() {
    local batches calls
    batches=$(cat "$GPU_DIR/BATCHES")
    calls=$((batches + 1))
    say "$((calls + 1)) device commands, in order, to the same held machine: issue each as soon as the last returns"
    say "(the machine goes back after 30 s idle, and with it everything staged); timeout_s as given"
    # what travels besides the batch: the tracked and untracked-not-ignored files of this checkout
    local tree
    tree=$(git ls-files -z -co --exclude-standard 2>/dev/null | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1)
    tree=${tree:-0}
    for n in $(seq 1 "$batches"); do
        local cmd="bash scripts/gpu_check.sh stage $n" timeout=120 size
        size=$(du -sb "$GPU_DIR/batch$n" | cut -f1)
        [ "$n" = 1 ] && cmd="bash scripts/gpu_check.sh probe; $cmd"
        [ "$n" = "$batches" ] && cmd="$cmd && bash scripts/gpu_check.sh run" && timeout=420
        echo "  [$n/$((calls + 1))] carry=[\"$GPU_DIR/batch$n\"] ($size bytes + tree $tree) timeout_s=$timeout  command: $cmd"
        if [ $((size + tree)) -gt $((60 * 1024 * 1024)) ]; then
            say "WARNING: call $n would carry more than 60 MiB: rerun with a smaller BATCH_MIB (pack)"
        fi
    done
    echo "  [$calls/$((calls + 1))] carry=[] timeout_s=480  command: bash scripts/gpu_check.sh bench"
    echo "  [$((calls + 1))/$((calls + 1))] carry=[] timeout_s=$((CORES_TIMEOUT + 30))  command: bash scripts/gpu_check.sh cores"
    cat <<EOF
gpu-check: expected device time ($DEVICE_BUDGET_S s in all; every command to the same held machine):
  machine start                     60-120 s (before the first command; counted)
  probe, stage 1 .. stage $batches           about 10-15 s each (one batch's transfer): $((batches * 12)) s
  run (with the last stage)         about 90 s: install 10 s, build 25 s, GPU tests 40-60 s (timeout 240)
                                    (2026-11-27: probe, 5 stages and run took 104 s of device time in all)
  bench                             about 240-300 s (at most 420, less when the time left is short)
  cores                             about 120-150 s (4 points of 10 s on 16 CPUs; at most $CORES_TIMEOUT)
  idle between commands             about 5 s each
  total                             about $(( 120 + batches * 12 + 90 + 300 + 150 + (batches + 2) * 5 )) s of $DEVICE_BUDGET_S
A step that starts with less device time left than it needs is skipped and says so in summary.md; every step
notes its start and end in \$STAGE/progress (published with each command's files), so a run cut short says where.
If the device time runs short, run \`cores\` before \`bench\`: it is the only place the many-core figures come from.
EOF
}

stage() {
    mkdir -p "$STAGE"
    cp "$GPU_DIR/batch$1"/* "$STAGE/"
    say "batch $1 staged in $STAGE ($(du -sh "$STAGE" | cut -f1) so far)"
}

would_run() {
    cat <<EOF
gpu-check: would run, on the GPU machine:
  1. (done) reassemble the split wheels in $STAGE and check them against SHA256SUMS
  2. pip install --no-index --no-deps --target /tmp/site $STAGE/*.whl (onnxruntime-gpu 1.31.1, tritonclient,
     grpcio, protobuf, uvicorn, ...); tritonclient's CUDA shm utilities use the image's cuda-bindings
  3. unpack libnghttp2-dev/-14 into /tmp/nghttp2; setup.py build_ext --inplace -j 8 (native gRPC frontend on them)
  4. pytest tests/e2e/test_cuda.py tests/e2e/test_cuda_plumbing.py, test_metrics.py -k gpu (CUDA EP + IO binding,
     pinned batch buffers, CUDA shared memory from tritonclient over gRPC and HTTP, nv_gpu_* metrics)
  5. benchmarks/gpu_bench.py (about 4-5 min): mlp and resnet50 (a ResNet-50-shaped CNN built there, 102 MB)
     on the CUDA EP and the CPU EP at c=1,16,64 (infer/s, p99, avg batch); each beside its CUDA-graph twin
     at c=1 (enable_cuda_graph); host-to-device copy of a batch from pinned vs pageable memory (CUDA events,
     CuPy); identity_602k and identity_16m with --shared-memory cuda / system / none at c=1,16 (CUDA inputs
     now bound on the GPU)
  6. write summary.md (GPU, versions, test counts, bench tables), gpu_bench.json, logs into \$OUT
  7. (the next command) cores: benchmarks/cores.py on the 16 CPUs, fastoip vs the C++ grpc++ server
EOF
}

dry_run() {
    # here, without a GPU: the benchmark driver end to end on the CPU EP (short windows), GPU parts listed
    local out=${OUT:-$GPU_DIR/out}
    mkdir -p "$out"
    "$PY" benchmarks/gpu_bench.py --out /tmp/fastoip-gpu-bench-dry --dry-run --window-ms 300 --trials 2
    cp /tmp/fastoip-gpu-bench-dry/gpu_bench.md /tmp/fastoip-gpu-bench-dry/gpu_bench.json "$out/"
}

reassemble() {
    # the split wheels whole again, every file checked against the checksums taken before the split
    (cd "$STAGE" && for first in *.part00; do
        [ -e "$first" ] || continue
        cat "${first%.part00}".part?? > "${first%.part00}" && rm "${first%.part00}".part??
    done)
    (cd "$STAGE" && sed 's#  \(wheels\|debs\|cores\)/#  #' SHA256SUMS | sha256sum -c --quiet)
    say "reassembled and checked: $(ls "$STAGE" | grep -c '\.whl$') wheels, $(ls "$STAGE" | grep -c '\.deb$') debs"
}

has_gpu() {
    command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q "^GPU "
}

probe() {
    # what the image has, read in the first command (costs a second): the GPU, Python, the packages relied on
    mkdir -p "$STAGE" && [ -f "$STAGE/began_at" ] || date +%s > "$STAGE/began_at"
    [ -f "$STAGE/progress" ] && { say "progress of an earlier command on this machine:"; cat "$STAGE/progress"; }
    nvidia-smi -L 2>&1 || true
    "$PY" - <<'PROBE' 2>&1 || true
import importlib, sys
import os, sysconfig
print("python", sys.version.split()[0], sys.executable)
include = sysconfig.get_paths()["include"]
print("  Python.h", "found" if os.path.exists(os.path.join(include, "Python.h")) else "MISSING", "in", include)
for name in ("numpy", "onnx", "onnxruntime", "grpc", "google.protobuf", "cupy", "cuda.bindings", "Cython",
             "pynvml", "prometheus_client", "rich", "uvloop", "pytest", "hypothesis", "ml_dtypes", "urllib3"):
    try:
        module = importlib.import_module(name)
        print(" ", name, getattr(module, "__version__", "?"))
    except Exception as exc:
        print(" ", name, "MISSING:", type(exc).__name__, exc)
PROBE
}

use_site() {
    # the carried wheels first on the path, the native frontend's libnghttp2 from the carried debs
    export PYTHONPATH=/tmp/site:$PWD/src
    if [ -d /tmp/nghttp2/usr/include ]; then
        export CPATH=/tmp/nghttp2/usr/include LIBRARY_PATH=/tmp/nghttp2/usr/lib/x86_64-linux-gnu
        export LD_LIBRARY_PATH=/tmp/nghttp2/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
        export FASTOIP_NGHTTP2_INCLUDE=/tmp/nghttp2/usr/include
    fi
}

publish() {
    # $OUT is emptied before each command: the summary grows in $STAGE and is copied out each time
    local out=${OUT:-$GPU_DIR/out}
    mkdir -p "$out"
    cp "$STAGE/summary.md" "$out/" 2>/dev/null || true
    for file in "$@"; do [ -f "$file" ] && cp "$file" "$out/"; done
    return 0
}

run() {
    # reassemble, install, build, GPU tests (about 3 min); `bench` follows in the next command
    reassemble
    if ! has_gpu; then
        say "no GPU on this machine: stopping here (the files were reassembled and checked; nothing installed or built)"
        would_run
        { echo "# gpu-check: no GPU"; echo; would_run; } > "$STAGE/summary.md"
        publish
        return 0
    fi
    local summary="$STAGE/summary.md" logs="$STAGE/logs"
    mkdir -p "$logs"
    { echo "# gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) ($(git rev-parse --short HEAD 2>/dev/null || echo '?'))"; echo
      echo '```'; nvidia-smi -L; echo '```'; echo "- pieces reassembled, checksums ok"; } > "$summary"
    step_begin run 120 || { publish "$STAGE/progress"; return 0; }
    # 2. install
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$STAGE"/*.whl
    # 3. build (native gRPC frontend on the carried headers; grpcio otherwise)
    if ls "$STAGE"/libnghttp2-dev_*.deb >/dev/null 2>&1; then
        for deb in "$STAGE"/libnghttp2*.deb; do dpkg -x "$deb" /tmp/nghttp2; done
    fi
    use_site
    local started=$SECONDS
    if ! "$PY" setup.py -q build_ext --inplace -j 8 > "$logs/build.log" 2>&1; then
        echo "- build FAILED (build.log)" >> "$summary"; publish "$logs/build.log"; return 1
    fi
    echo "- build: $((SECONDS - started)) s" >> "$summary"
    "$PY" -c 'import onnxruntime as o; print("- onnxruntime", o.__version__, o.get_available_providers())' >> "$summary" 2>&1 || true
    # 4. tests
    set +e
    started=$SECONDS
    timeout 240 "$PY" -m pytest -q -p no:cacheprovider --timeout 120 -rs tests/e2e/test_cuda.py tests/e2e/test_cuda_plumbing.py \
        "tests/e2e/test_metrics.py" -k "cuda or gpu or Cuda or GPU" > "$logs/tests.log" 2>&1
    echo "- tests (exit $?, $((SECONDS - started)) s; 124: timed out): $(tail -1 "$logs/tests.log")" >> "$summary"
    set -e
    step_end run
    publish "$logs/build.log" "$logs/tests.log" "$STAGE/progress"
    say "summary in $summary"
    cat "$summary"
}

bench() {
    # the GPU benchmark (about 4 min, at most 420 s), after `run` on the same held machine
    local summary="$STAGE/summary.md"
    if ! has_gpu; then
        say "no GPU on this machine: the benchmark would run benchmarks/gpu_bench.py (see would_run); stopping"
        return 0
    fi
    step_begin bench 240 || { publish "$STAGE/progress"; return 0; }
    # at most 420 s, and never past the device time left less what `cores` needs after it
    local left=$(( DEVICE_BUDGET_S - $(elapsed_s) - 150 )) limit=420
    [ "$left" -lt "$limit" ] && limit=$(( left > 180 ? left : 180 ))
    use_site
    set +e
    local started=$SECONDS
    timeout "$limit" "$PY" benchmarks/gpu_bench.py --out /tmp/fastoip-gpu-bench > "$STAGE/logs/bench.log" 2>&1
    local status=$?
    set -e
    step_end bench "$status"
    {
        echo "- bench (exit $status, $((SECONDS - started)) s; 0: every point answered without errors; 124: timed out)"
        echo
        if [ -f /tmp/fastoip-gpu-bench/gpu_bench.md ]; then cat /tmp/fastoip-gpu-bench/gpu_bench.md
        else echo '```'; tail -30 "$STAGE/logs/bench.log"; echo '```'; fi
    } >> "$summary"
    publish "$STAGE/logs/tests.log" "$STAGE/logs/bench.log" /tmp/fastoip-gpu-bench/gpu_bench.json \
        /tmp/fastoip-gpu-bench/serve-cuda.log /tmp/fastoip-gpu-bench/serve-cpu.log "$STAGE/progress"
    cat "$summary"
}

cores() {
    # the many-cores figures (about 2 min on 16 CPUs: 4 points of 10 s, each with a start, a probe and a 2 s
    # warm-up), after `run` on the same held machine (fastoip's native frontend built, /tmp/site installed)
    local out=${OUT:-$GPU_DIR/out} bundle=/tmp/fastoip-cores-bin dry=()
    mkdir -p "$out"
    step_begin cores 150 || { publish "$STAGE/progress"; return 0; }
    if [ "$(nproc)" -lt 16 ]; then
        dry=(--dry-run)
        say "$(nproc) CPUs here: the cores step runs as a dry run (small numbers)"
    fi
    local archive="$STAGE/$CORES_BUNDLE"
    [ -f "$archive" ] || archive="$GPU_DIR/cores/$CORES_BUNDLE"
    local cpp=() h2load=(--h2load h2load)
    if [ -f "$archive" ]; then
        rm -rf "$bundle" && mkdir -p "$bundle" && tar -C "$bundle" -xJf "$archive"
        cpp=(--cpp-server "$bundle/bin/grpc_cpp_server")
        command -v h2load >/dev/null || h2load=(--h2load "$bundle/bin/h2load")
        h2load+=(--lib-path "$bundle/lib")
    else
        say "no $CORES_BUNDLE (prepare builds it): the C++ server's points are skipped"
    fi
    [ -d /tmp/site ] && use_site
    set +e
    local started=$SECONDS
    timeout "$CORES_TIMEOUT" "$PY" benchmarks/cores.py --out "$out" "${cpp[@]}" "${h2load[@]}" "${dry[@]}" \
        > "$STAGE/cores.log" 2>&1
    local status=$?
    set -e
    step_end cores "$status"
    {
        echo "- cores (exit $status, $((SECONDS - started)) s; 124: timed out)"
        echo
        if [ -f "$out/cores.md" ]; then cat "$out/cores.md"; else echo '```'; tail -20 "$STAGE/cores.log"; echo '```'; fi
    } >> "$STAGE/summary.md"
    publish "$STAGE/cores.log" "$STAGE/progress"
    cat "$STAGE/cores.log"
    return 0
}

case "${1:-}" in
    prepare) prepare ;;
    pack) pack; plan ;;
    cores-bundle) bundle_cores ;;
    plan) plan ;;
    stage) stage "$2" ;;
    probe) probe ;;
    run) run ;;
    bench) bench ;;
    cores) cores ;;
    dry-run) dry_run ;;
    *) echo "usage: $0 prepare | pack | cores-bundle | plan | stage N | probe | run | bench | cores | dry-run" >&2
       exit 2 ;;
esac
