#!/usr/bin/env bash
# Idempotent setup for the fastoip benchmark lab (benchmarks/lab.py).
#   * the peers lab's setup.sh with PEERS_WORK=benchmarks/.work:
#     apt nghttp2-client (h2load) + wrk, venvs venv-{base,mlserver,triton,kserve}
#   * the project's own .venv (make venv) when it cannot import fastoip + its codec
#   * the ONNX models (peers' models.py) into benchmarks/.work/models
# Usage: benchmarks/setup.sh            (re-running it is cheap once everything is there)
# Env:   FASTOIP_PEERS_DIR  the peers lab (default: <repo>/../shared/peers)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(git -C "$HERE" rev-parse --show-toplevel 2>/dev/null || (cd "$HERE/.." && pwd))
PEERS_DIR=${FASTOIP_PEERS_DIR:-$REPO/../shared/peers}
W="$HERE/.work"
mkdir -p "$W/logs"

if [ ! -x "$PEERS_DIR/setup.sh" ] && [ ! -f "$PEERS_DIR/setup.sh" ]; then
  echo "peers lab not found at $PEERS_DIR (set FASTOIP_PEERS_DIR)" >&2; exit 1
fi
PEERS_DIR=$(cd "$PEERS_DIR" && pwd)

echo "== peers setup ($PEERS_DIR/setup.sh, PEERS_WORK=$W)"
PEERS_WORK="$W" timeout 3600 bash "$PEERS_DIR/setup.sh"

echo "== fastoip venv ($REPO/.venv)"
if [ -x "$REPO/.venv/bin/python" ] && "$REPO/.venv/bin/python" -c 'import fastoip, fastoip._codec, fastoip.cli' 2>/dev/null; then
  echo "fastoip venv: ok"
else
  echo "fastoip venv: make venv (log: $W/logs/make-venv.log)"
  timeout 1800 make -C "$REPO" venv >"$W/logs/make-venv.log" 2>&1 || { tail -n 30 "$W/logs/make-venv.log"; exit 1; }
  "$REPO/.venv/bin/python" -c 'import fastoip, fastoip._codec, fastoip.cli' \
    || echo "WARNING: .venv cannot import fastoip; lab.py runs it with PYTHONPATH=$REPO/src"
fi

echo "== models ($W/models)"
timeout 300 "$W/venv-base/bin/python" "$PEERS_DIR/models.py" --out "$W/models" --check >"$W/logs/models.log" 2>&1 \
  || { cat "$W/logs/models.log"; exit 1; }
tail -n 3 "$W/logs/models.log"
echo "benchmarks setup done"
