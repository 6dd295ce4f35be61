"""Send a small table to the loan_scorer example and print what comes back.

    python examples/pandas_pipeline/client.py [--url 127.0.0.1:8001] [--protocol grpc|http]
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

APPLICANTS = {
    "applicant": ["Joanne", "Michael", "Zo\u00eb"],
    "income": [52000.0, 31000.0, 87000.0],
    "debt": [4000.0, 21000.0, 12000.0],
    "customer_since": ["2015-06-01", "2024-11-15", "2019-03-30T09:30:00"],
}


def score(url: str, protocol: str = "grpc") -> dict[str, Any]:
    """Call loan_scorer; returns {output name: numpy array} plus the outputs' content types."""
    if protocol == "grpc":
        import tritonclient.grpc as client_lib
    else:
        import tritonclient.http as client_lib  # type: ignore[no-redef]
    client = client_lib.InferenceServerClient(url)
    inputs = []
    for name, values in APPLICANTS.items():
        if isinstance(values[0], str):
            array = np.array([v.encode("utf-8") for v in values], dtype=object)
            datatype = "BYTES"
        else:
            array = np.array(values, dtype=np.float64)
            datatype = "FP64"
        tensor = client_lib.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    # The model's metadata already says "pd" (and str / datetime for two inputs);
    # a request could override them with parameters={"content_type": ...}.
    result = client.infer("loan_scorer", inputs)
    response = result.get_response()
    if protocol == "grpc":
        names = [o.name for o in response.outputs]
        content_types = {o.name: o.parameters["content_type"].string_param for o in response.outputs}
    else:
        names = [o["name"] for o in response["outputs"]]
        content_types = {o["name"]: o.get("parameters", {}).get("content_type") for o in response["outputs"]}
    return {"outputs": {n: result.as_numpy(n) for n in names}, "content_types": content_types}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="127.0.0.1:8001")
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    args = parser.parse_args()
    found = score(args.url, args.protocol)
    outputs = found["outputs"]
    for row in range(len(outputs["applicant"])):
        print(
            f"{outputs['applicant'][row].decode():8s} debt ratio {outputs['debt_ratio'][row]:.2f}  "
            f"tenure {outputs['tenure_years'][row]:5.2f} y  score {outputs['score'][row]:.3f}  "
            f"{outputs['decision'][row].decode()}"
        )
    print("content types:", found["content_types"])


if __name__ == "__main__":
    main()
