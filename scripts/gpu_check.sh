#!/usr/bin/env bash
# The GPU path (issue 26) in one prepared run: `make gpu-check`.
#
#   scripts/gpu_check.sh prepare   here (network): the wheels the GPU machine lacks, for cp312 manylinux, and
#                                  libnghttp2's Debian packages, into .gpu/; files over PIECE_MIB split into
#                                  pieces; everything packed into .gpu/batch<N>/ folders of at most BATCH_MIB
#                                  each (the device tool carries at most 64 MiB a command); prints the plan
#   scripts/gpu_check.sh plan      the device commands, one per batch, in order
#   scripts/gpu_check.sh stage N   there: copy batch N into $STAGE (it stays while the machine is held)
#   scripts/gpu_check.sh run       there, after the last stage: reassemble and check the pieces, install into
#                                  /tmp/site, build the extensions (native gRPC frontend on the carried
#                                  libnghttp2 headers), run the GPU tests, a short GPU benchmark, and write
#                                  $OUT/summary.md (or .gpu/out/summary.md without $OUT)
#
# Without a GPU (no nvidia-smi, or it lists none), `run` stops cleanly: it prints "no GPU" and what it would
# have run, and exits 0. `make gpu-check` is `prepare` then `run` on this machine: on CPU, a dry run.
set -euo pipefail
cd "$(dirname "$0")/.."

GPU_DIR=.gpu
STAGE=${STAGE:-/tmp/fastoip-gpu}
PIECE_MIB=${PIECE_MIB:-48}
BATCH_MIB=${BATCH_MIB:-52}
PY=${PY:-python3}
# What the GPU image lacks (its package list: the device tool's KINDS.md): ONNX Runtime's CUDA build, fastoip's
# HTTP stack, and tritonclient with what its grpc/http clients import. Exact versions: one of each travels.
WHEELS=(
    onnxruntime-gpu==1.31.1
    "tritonclient==2.73.0" python-rapidjson geventhttpclient gevent greenlet zope.event zope.interface brotli
    uvicorn httptools orjson swagger-ui-bundle==1.1.0
)
DEBS=(libnghttp2-dev libnghttp2-14)

say() { echo "gpu-check: $*"; }

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
    pack
    plan
}

pack() {
    # pieces of at most PIECE_MIB, then first-fit into batches of at most BATCH_MIB
    rm -rf "$GPU_DIR"/batch* "$GPU_DIR/pieces" && mkdir -p "$GPU_DIR/pieces"
    (cd "$GPU_DIR" && sha256sum wheels/* debs/* > SHA256SUMS 2>/dev/null || true)
    for file in "$GPU_DIR"/wheels/* "$GPU_DIR"/debs/*; do
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
    local batches
    batches=$(cat "$GPU_DIR/BATCHES")
    say "$batches device commands, in order, to the same held machine (each carries one batch folder):"
    for n in $(seq 1 "$batches"); do
        local cmd="bash scripts/gpu_check.sh stage $n"
        [ "$n" = "$batches" ] && cmd="$cmd && bash scripts/gpu_check.sh run"
        echo "  [$n/$batches] carry=[\"$GPU_DIR/batch$n\"] ($(du -sh "$GPU_DIR/batch$n" | cut -f1))  command: $cmd"
    done
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
  2. pip install --no-index --no-deps --target /tmp/site $STAGE/*.whl (onnxruntime-gpu 1.31.1, tritonclient, ...)
  3. unpack libnghttp2-dev/-14 into /tmp/nghttp2; setup.py build_ext --inplace (native gRPC frontend on them)
  4. pytest tests/test_cuda.py tests/test_cuda_plumbing.py, test_metrics.py -k gpu (CUDA EP + IO binding,
     pinned batch buffers, CUDA shared memory from tritonclient over gRPC and HTTP, nv_gpu_* metrics)
  5. bench: fastoip serve on the demo repository, CUDA EP then --cpu-only, fastoip bench -i grpc -m mlp at
     c=1,16,64; image_identity (602 KB) with --shared-memory cuda / system / none at c=1,16
  6. write summary.md (GPU, versions, test counts, bench tables) into \$OUT
EOF
}

reassemble() {
    # the split wheels whole again, every file checked against the checksums taken before the split
    (cd "$STAGE" && for first in *.part00; do
        [ -e "$first" ] || continue
        cat "${first%.part00}".part?? > "${first%.part00}" && rm "${first%.part00}".part??
    done)
    (cd "$STAGE" && sed 's#  \(wheels\|debs\)/#  #' SHA256SUMS | sha256sum -c --quiet)
    say "reassembled and checked: $(ls "$STAGE" | grep -c '\.whl$') wheels, $(ls "$STAGE" | grep -c '\.deb$') debs"
}

run() {
    local out=${OUT:-$GPU_DIR/out}
    mkdir -p "$out"
    reassemble
    if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L 2>/dev/null | grep -q "^GPU "; then
        say "no GPU on this machine: stopping here (the files were reassembled and checked; nothing installed or built)"
        would_run
        { echo "# gpu-check: no GPU"; echo; would_run; } > "$out/summary.md"
        return 0
    fi
    local summary="$out/summary.md"
    { echo "# gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ)"; echo; echo '```'; nvidia-smi -L; echo '```'; } > "$summary"
    echo "- pieces reassembled, checksums ok" >> "$summary"
    # 2. install
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$STAGE"/*.whl
    export PYTHONPATH=/tmp/site:$PWD/src
    # 3. build (native gRPC frontend on the carried headers; grpcio otherwise)
    if ls "$STAGE"/libnghttp2-dev_*.deb >/dev/null 2>&1; then
        for deb in "$STAGE"/libnghttp2*.deb; do dpkg -x "$deb" /tmp/nghttp2; done
        export CPATH=/tmp/nghttp2/usr/include LIBRARY_PATH=/tmp/nghttp2/usr/lib/x86_64-linux-gnu
        export LD_LIBRARY_PATH=/tmp/nghttp2/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
        export FASTOIP_NGHTTP2_INCLUDE=/tmp/nghttp2/usr/include
    fi
    "$PY" setup.py -q build_ext --inplace > "$out/build.log" 2>&1 || { echo "- build FAILED (build.log)" >> "$summary"; return 1; }
    "$PY" -c 'import onnxruntime as o; print("- onnxruntime", o.__version__, o.get_available_providers())' >> "$summary"
    # 4. tests
    set +e
    timeout 300 "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_cuda_plumbing.py \
        "tests/test_metrics.py" -k "cuda or gpu or Cuda or GPU" > "$out/tests.log" 2>&1
    echo "- tests (exit $?): $(tail -1 "$out/tests.log")" >> "$summary"
    # 5. bench
    bench_pair >> "$summary" 2>&1
    set -e
    say "summary in $summary"
    cat "$summary"
}

bench_pair() {
    local repo=/tmp/fastoip-demo
    "$PY" -m fastoip.cli demo-repository "$repo" >/dev/null
    for mode in cuda cpu; do
        local extra=()
        [ "$mode" = cpu ] && extra=(--cpu-only)
        "$PY" -m fastoip.cli serve --model-repository "$repo" --grpc-port 18001 --http-port -1 --metrics-port -1 \
            --shutdown-grace 0 "${extra[@]}" > "/tmp/serve-$mode.log" 2>&1 &
        local pid=$!
        for _ in $(seq 1 120); do grep -q "grpc listening" "/tmp/serve-$mode.log" && break; sleep 0.5; done
        echo; echo "## mlp, $mode EP (c=1,16,64)"; echo '```'
        "$PY" -m fastoip.cli bench grpc://127.0.0.1:18001 -m mlp --concurrency-range 1,16,64 -p 1000 -r 4 -q
        if [ "$mode" = cuda ]; then
            for shm in cuda system none; do
                echo "## image_identity (602 KB), shared memory $shm"
                "$PY" -m fastoip.cli bench grpc://127.0.0.1:18001 -m image_identity --shared-memory "$shm" \
                    --concurrency-range 1,16 -p 1000 -r 4 -q
            done
        fi
        echo '```'
        kill -INT "$pid"; wait "$pid" || true
    done
}

case "${1:-}" in
    prepare) prepare ;;
    pack) pack; plan ;;
    plan) plan ;;
    stage) stage "$2" ;;
    run) run ;;
    *) echo "usage: $0 prepare | plan | stage N | run" >&2; exit 2 ;;
esac
