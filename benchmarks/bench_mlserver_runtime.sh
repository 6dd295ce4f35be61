#!/bin/bash
# MLServer runtimes through fastoip against the same runtimes on real MLServer (issue 21), in one run.
#
#   CUSTOM_JSON=/path/to/MLServer/docs/examples/custom-json D=5 benchmarks/bench_mlserver_runtime.sh
#
# Needs the lab (benchmarks/.work/venv-mlserver: mlserver 1.7.1), wrk, h2load, and a Python with fastoip's
# dependencies plus mlserver for fastoip itself (FASTOIP_PY; PYTHONPATH is set to this tree's src).
# Models: an MLServer-style NumPy runtime written here (x -> 2x, FP32 [1,16]) and, when CUSTOM_JSON names a copy
# of MLServer's custom-json example, that runtime unchanged (its model-settings.json gains an input declaration
# only). REST: wrk -c16 with the lab's v2_infer.lua; gRPC: h2load -c16 -m1 (p99 from its --log-file). MLServer runs with
# its default settings (one inference worker process).
# HOSTINGS="in_process process" serves the same models through fastoip once per hosting (model-settings
# parameters.fastoip_hosting: the runtime in the server process, or in a worker process), one after the other.
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-$(mktemp -d /tmp/fastoip-mlserver-bench.XXXX)}
MLSERVER=${MLSERVER:-$HERE/benchmarks/.work/venv-mlserver/bin/mlserver}
FASTOIP_PY=${FASTOIP_PY:-python3}
LUA=${LUA:-$HERE/benchmarks/.work/../bench/v2_infer.lua}
[ -f "$LUA" ] || LUA=/work/shared/peers/bench/v2_infer.lua
D=${D:-5}
REPO=$WORK/repo; OUT=$WORK/out; mkdir -p "$REPO/numpy-double" "$OUT"
cat > "$REPO/numpy-double/runtime.py" <<'PY'
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class Doubler(MLModel):
    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output("y", x * 2)])
PY
HOSTINGS=${HOSTINGS:-in_process}
write_settings() { # MLServer's settings; with a hosting: fastoip's parameters.fastoip_hosting too
  local extra=""
  [ -n "${1:-}" ] && extra=", \"parameters\": {\"fastoip_hosting\": \"$1\"}"
  cat > "$REPO/numpy-double/model-settings.json" <<JS
{"name": "numpy-double", "implementation": "runtime.Doubler",
 "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}],
 "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 16]}]$extra}
JS
  if [ -n "${CUSTOM_JSON:-}" ]; then
    echo "{\"name\": \"json-hello-world\", \"implementation\": \"jsonmodels.JsonHelloWorldModel\"$extra}" \
      > "$REPO/json-hello-world/model-settings.json"
  fi
}
echo '{"host": "127.0.0.1", "http_port": 18801, "grpc_port": 18802, "metrics_port": 18803}' > "$REPO/settings.json"
if [ -n "${CUSTOM_JSON:-}" ]; then
  mkdir -p "$REPO/json-hello-world" && cp "$CUSTOM_JSON"/jsonmodels.py "$REPO/json-hello-world/"
fi
write_settings ""
PYTHONPATH=$HERE/src "$FASTOIP_PY" - "$WORK" <<'PY'
import json, struct, sys
import numpy as np
from fastoip._proto import grpc_service_pb2 as pb
work = sys.argv[1]
text = json.dumps({"name": "Foo Bar", "message": "Hello from Client (REST)!"})
json.dump({"inputs": [{"name": "echo_request", "shape": [len(text)], "datatype": "BYTES", "data": [text]}]},
          open(f"{work}/json_body.json", "w"))
json.dump({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]},
          open(f"{work}/numpy_body.json", "w"))
r = pb.ModelInferRequest(model_name="numpy-double")
t = r.inputs.add(); t.name = "x"; t.datatype = "FP32"; t.shape.extend([1, 16])
r.raw_input_contents.append(np.full(16, 0.5, np.float32).tobytes())
b = r.SerializeToString()
open(f"{work}/numpy.grpc", "wb").write(b"\x00" + struct.pack(">I", len(b)) + b)
r = pb.ModelInferRequest(model_name="json-hello-world")  # the README's gRPC request: BYTES [len(text)], one element
t = r.inputs.add(); t.name = "echo_request"; t.datatype = "BYTES"; t.shape.extend([len(text)])
t.contents.bytes_contents.append(text.encode())
b = r.SerializeToString()
open(f"{work}/json.grpc", "wb").write(b"\x00" + struct.pack(">I", len(b)) + b)
PY
wait_ready() { for _ in $(seq 1 120); do curl -sf -o /dev/null "http://127.0.0.1:$1/v2/health/ready" && return 0; sleep 0.5; done; return 1; }
measure() { # name http-port grpc-port
  [ -n "${CUSTOM_JSON:-}" ] && wrk -t1 -c16 -d"${D}s" -s "$LUA" "http://127.0.0.1:$2/v2/models/json-hello-world/infer" \
    -- "$WORK/json_body.json" > "$OUT/$1-json-rest.txt" 2>&1
  wrk -t1 -c16 -d"${D}s" -s "$LUA" "http://127.0.0.1:$2/v2/models/numpy-double/infer" -- "$WORK/numpy_body.json" \
    > "$OUT/$1-np-rest.txt" 2>&1
  [ -n "${CUSTOM_JSON:-}" ] && h2load -t 1 -c 16 -m 1 -D "$D" --log-file="$OUT/$1-json-grpc.log" -d "$WORK/json.grpc" -H 'content-type: application/grpc' \
    -H 'te: trailers' "http://127.0.0.1:$3/inference.GRPCInferenceService/ModelInfer" > "$OUT/$1-json-grpc.txt" 2>&1
  h2load -t 1 -c 16 -m 1 -D "$D" --log-file="$OUT/$1-np-grpc.log" -d "$WORK/numpy.grpc" -H 'content-type: application/grpc' -H 'te: trailers' \
    "http://127.0.0.1:$3/inference.GRPCInferenceService/ModelInfer" > "$OUT/$1-np-grpc.txt" 2>&1
}
(cd "$REPO" && exec "$MLSERVER" start "$REPO") > "$OUT/mlserver.log" 2>&1 &
MP=$!
wait_ready 18801 && measure mlserver 18801 18802
CHILDREN=$(pgrep -P $MP | tr '\n' ' '); kill -9 $MP $CHILDREN 2>/dev/null; sleep 1
for HOSTING in $HOSTINGS; do
  write_settings "$HOSTING"
  NAME=fastoip; [ "$HOSTINGS" != in_process ] && NAME=fastoip-$HOSTING
  PYTHONPATH=$HERE/src "$FASTOIP_PY" -c "import sys; from fastoip.cli import main; sys.exit(main())" serve \
    --model-repository "$REPO" --http-port 18811 --grpc-port 18812 --metrics-port -1 > "$OUT/$NAME.log" 2>&1 &
  FP=$!
  wait_ready 18811 && measure "$NAME" 18811 18812
  kill $FP; sleep 2; kill -9 $FP 2>/dev/null
done
for f in "$OUT"/*-rest.txt; do echo "$(basename "$f") $(grep -o 'Requests/sec: *[0-9.]*' "$f") $(grep -o '"lat_p99_us":[0-9]*' "$f")"; done
for f in "$OUT"/*-grpc.txt; do
  p99=$(cut -f3 "${f%.txt}.log" 2>/dev/null | sort -n | awk '{v[NR]=$1} END {if (NR) print v[int(NR*0.99)]}')
  echo "$(basename "$f") $(grep -o 'finished in .*req/s' "$f") $(grep -o '[0-9]* succeeded, [0-9]* failed' "$f") p99_us=$p99"
done
