"""``fastoip.testing``: call the models of a repository in-process, without a server or a socket.

For users' tests of their own models (``model.py`` or ONNX)::

    from fastoip.testing import InProcessClient

    with InProcessClient("path/to/repository") as client:
        outputs = client.infer("my_model", {"x": np.array([[1.0, 2.0]], dtype=np.float32)})
        assert outputs["y"].shape == (1, 2)

Rules:
- One path: requests go through :class:`fastoip.core.Core`, the object the gRPC and HTTP frontends call,
  so the model sees what it sees behind a server (config validation, batcher, content types, reshape,
  statistics); only the wire codecs are skipped.
- Errors are the project's own (:mod:`fastoip.errors`: ``InvalidArgument``, ``NotFound``, ``Unavailable``,
  ``InferenceError``), with the messages a client would get.
- Inputs are numpy arrays sent as they are (the array's dtype names the datatype, as tritonclient's
  ``set_data_from_numpy`` does; str / bytes arrays are BYTES); plain Python values (lists, numbers, strings)
  become an array of the datatype the model declares for that input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from .core import Core
from .core.answers import ModelMetadata, ModelStatistics, RepositoryIndexEntry
from .datatypes import bf16_bits_from_float32, numpy_dtype, to_bytes_elements, v2_datatype_of
from .errors import InvalidArgument, Unavailable
from .options import RepositoryOptions
from .types import InferInput, InferRequest, InferResponse, RequestedOutput

__all__ = ["InProcessClient"]


class InProcessClient:
    """The models of ``repository`` loaded in this process, called like a client calls a server.

    ``models``: load only these (Triton's explicit model control); default: every model in the repository.
    ``use_gpu``: let ONNX models use CUDA when onnxruntime-gpu is installed (default: CPU, for repeatable tests).
    ``repository_options``: server-wide defaults (auto-complete, default max batch size, ...), as ``fastoip serve``
    sets them from its flags.
    ``require_ready``: raise :class:`fastoip.errors.Unavailable` naming each model that did not load, with the
    reason (an exception in its ``load()``, a bad config); False lets a test look at a failed load itself.

    A context manager; ``close()`` unloads the models (their ``@on_shutdown`` hooks run).
    """

    def __init__(
        self,
        repository: str | Path,
        *,
        models: Iterable[str] | None = None,
        use_gpu: bool = False,
        worker_threads: int = 4,
        repository_options: RepositoryOptions | None = None,
        require_ready: bool = True,
    ) -> None:
        root = Path(repository)
        if not root.is_dir():
            raise FileNotFoundError(f"model repository '{root}' is not a directory")
        options = repository_options or RepositoryOptions(use_gpu=use_gpu, allow_code_loads=True)
        chosen = list(models) if models is not None else None
        self.core = Core(
            root,
            options,
            worker_threads=worker_threads,
            model_control_mode="explicit" if chosen is not None else "none",
            startup_models=chosen,
        )
        self._closed = False
        try:
            self.core.load_models()
            if require_ready:
                failed = [entry for entry in self.core.repository_index() if entry.state not in ("READY", "")]
                if failed:
                    raise Unavailable("; ".join(
                        f"model '{entry.name}' is {entry.state}" + (f": {entry.reason}" if entry.reason else "")
                        for entry in failed
                    ))
        except BaseException:
            self.close()
            raise

    # -- lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Unload every model and stop the worker threads (idempotent)."""
        if not self._closed:
            self._closed = True
            self.core.stop_accepting()
            self.core.close()

    def __enter__(self) -> InProcessClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # -- inference -----------------------------------------------------------------------------
    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: str = "",
        outputs: Iterable[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
        request_id: str = "",
    ) -> dict[str, np.ndarray]:
        """Run one request; the outputs by name (BYTES outputs are object arrays of ``bytes``).

        ``inputs``: name -> a numpy array, a plain value, or a :class:`fastoip.types.InferInput` for full
        control (datatype, per-input parameters such as ``{"content_type": "str"}``).
        ``outputs``: the outputs to return (default: all). ``parameters``: request parameters
        (e.g. ``{"content_type": "pd"}`` for a Python model that takes a DataFrame).
        Raises :class:`fastoip.errors.InferenceError` (or a subclass) with the server's message.
        """
        response = self.infer_response(
            model, inputs, version=version, outputs=outputs, parameters=parameters, request_id=request_id
        )
        return {output.name: _output_array(output.datatype, output.data) for output in response.outputs}

    def infer_response(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: str = "",
        outputs: Iterable[str] | None = None,
        parameters: Mapping[str, Any] | None = None,
        request_id: str = "",
    ) -> InferResponse:
        """:meth:`infer`, answering the whole response (outputs with their datatype and parameters,
        response parameters, the model version that ran)."""
        declared = {tensor.name: tensor.datatype for tensor in self.core.model_metadata(model, version).inputs}
        request = InferRequest(
            model,
            version,
            id=request_id,
            parameters=dict(parameters or {}),
            inputs=[_input(name, value, declared.get(name)) for name, value in inputs.items()],
            outputs=[RequestedOutput(name) for name in outputs] if outputs is not None else None,
        )
        return self.core.infer(request)

    # -- health, metadata, statistics, control ---------------------------------------------------------
    def is_model_ready(self, model: str, version: str = "") -> bool:
        return self.core.model_ready(model, version)

    def model_not_ready_reason(self, model: str, version: str = "") -> str:
        """Why ``model`` is not ready ("" when it is): e.g. the exception its ``load()`` raised."""
        return self.core.model_not_ready_reason(model, version)

    def model_metadata(self, model: str, version: str = "") -> ModelMetadata:
        return self.core.model_metadata(model, version)

    def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        """The model's configuration (after auto-complete) in Triton's JSON form."""
        from .core import config_to_json

        return config_to_json(self.core.model_config(model, version))

    def statistics(self, model: str = "", version: str = "") -> list[ModelStatistics]:
        return self.core.statistics(model, version)

    def repository_index(self) -> list[RepositoryIndexEntry]:
        return self.core.repository_index()

    def load_model(self, model: str) -> None:
        """Load (or reload, after editing its files) ``model``."""
        self.core.load_model(model)

    def unload_model(self, model: str) -> None:
        self.core.unload_model(model)


def _input(name: str, value: Any, declared: str | None) -> InferInput:
    """An InferInput from what the test passed; see the module rules for how the datatype is chosen."""
    if isinstance(value, InferInput):
        if value.name != name:
            raise InvalidArgument(f"input '{name}' was given an InferInput named '{value.name}'")
        return value
    if isinstance(value, np.ndarray):
        array = value
    elif declared is not None and declared != "BYTES":
        try:
            # BF16 travels as bfloat16 bits in a uint16 array: plain numbers become those bits
            array = (
                bf16_bits_from_float32(np.asarray(value, dtype=np.float32))
                if declared == "BF16"
                else np.asarray(value, dtype=numpy_dtype(declared))
            )
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"input '{name}': cannot make {declared} data from {value!r}: {exc}") from None
    else:
        array = np.asarray(value, dtype=object if declared == "BYTES" else None)
    if declared == "BF16" and array.dtype == np.uint16:
        datatype = "BF16"
    else:
        datatype = v2_datatype_of(array)
    if datatype == "BYTES":
        array = to_bytes_elements(array)
    return InferInput(name, datatype, tuple(array.shape), array)


def _output_array(datatype: str, data: np.ndarray | None) -> np.ndarray:
    if data is None:  # written to a shared-memory region instead (not used in-process)
        return np.empty((0,), dtype=numpy_dtype(datatype) if datatype != "BYTES" else object)
    return data
