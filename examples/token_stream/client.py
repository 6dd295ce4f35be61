"""Read the tokens example's stream over gRPC with tritonclient, printing each response as it arrives.

    python examples/token_stream/client.py [--url 127.0.0.1:8001] [--text "a few words"]

Over HTTP the same model answers Server-Sent Events:
    curl -N -d '{"text_input": "a few words"}' 127.0.0.1:8000/v2/models/tokens/generate_stream
"""

from __future__ import annotations

import argparse
import queue

import numpy as np
import tritonclient.grpc as grpcclient


def stream_tokens(url: str, text: str) -> list[str]:
    """Every token of one request, read until Triton's final-response flag."""
    client = grpcclient.InferenceServerClient(url)
    results: queue.SimpleQueue = queue.SimpleQueue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    tensor = grpcclient.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode("utf-8")], dtype=object))
    tokens = []
    try:
        client.async_stream_infer("tokens", [tensor], enable_empty_final_response=True)
        while True:
            result, error = results.get(timeout=60)
            if error is not None:
                raise error
            if result.get_response().parameters["triton_final_response"].bool_param:
                return tokens  # the empty final response: nothing more for this request
            tokens.append(result.as_numpy("text_output")[0].decode("utf-8"))
            print(tokens[-1], flush=True)
    finally:
        client.stop_stream()
        client.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="127.0.0.1:8001")
    parser.add_argument("--text", default="fastoip streams one response per token")
    args = parser.parse_args()
    stream_tokens(args.url, args.text)
