"""The ``python`` backend kind: completes a Python model's config and builds its instances."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..._proto import model_config_pb2 as mc
from ...content_types import ModelContentTypes
from ...errors import InvalidArgument
from ...lifecycle import is_batchable
from ...model_config import MODEL_SETTINGS, MODEL_SETTINGS_PARAMETER, is_model_settings_config, model_spec
from .mlserver.process import hosting_of, start_workers
from .native.deployment import run_deployment_hooks as _run_deployment_hooks
from .native.host import AsyncStreamInstance, PythonInstance, _Host
from .native.model_file import import_model_file as _import_model_file
from .native.model_file import model_class as _model_class
from .triton.kind import complete_python_config, is_triton_model_file, load_triton

log = logging.getLogger("fastoip.python")


def _truthy(text: str) -> bool | None:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    return None


def _resolve_class(path: Path, model_name: str, version: int, base: mc.ModelConfig) -> type:
    """The model's class; ``path`` is model.py, or model-settings.json in MLServer's layout (nothing to import)."""
    module = None if path.name == MODEL_SETTINGS else _import_model_file(path, model_name, version)
    return _model_class(module, path, base, model_name)


class PythonKind:
    """The ``python`` backend kind: ``model.py`` holding a ``fastoip.Model`` subclass."""

    name = "python"
    platforms: tuple[str, ...] = ()
    default_filename = "model.py"

    def prepare(self, model_name: str, paths: Sequence[Path], base: mc.ModelConfig, options: Any) -> None:
        """Before any model loads: import model.py and run its ``@on_deployment`` hooks."""
        for path in paths:
            if is_triton_model_file(path):
                continue  # Triton's models have no deployment hooks (and their code runs in workers)
            version = int(path.parent.name) if path.parent.name.isdigit() else 0
            cls = _resolve_class(path, model_name, version, base)
            _run_deployment_hooks(cls, path, model_name, from_load=False)

    def load(
        self, model_name: str, version: int, path: Path, base: mc.ModelConfig, options: Any
    ) -> tuple[mc.ModelConfig, list[Any]]:
        if is_triton_model_file(path):
            return load_triton(model_name, version, path, base, options)
        cls = _resolve_class(path, model_name, version, base)
        _run_deployment_hooks(cls, path, model_name, from_load=True)
        settings_model = is_model_settings_config(base)
        if getattr(cls, "streams_only", False):  # an MLServer runtime with predict_stream and no predict
            base = mc.ModelConfig.FromString(base.SerializeToString())
            base.model_transaction_policy.decoupled = True

        if not base.input and not base.output and not settings_model:
            raise InvalidArgument(
                f"model '{model_name}': a Python model declares its inputs and outputs "
                f"in config.pbtxt or {MODEL_SETTINGS}"
            )
        config = complete_python_config(base, model_name, options.default_max_batch_size)
        spec = model_spec(config)
        parameters = {key: value.string_value for key, value in config.parameters.items()}
        defaults = ModelContentTypes.from_parameters(
            parameters, [t.name for t in spec.inputs], [t.name for t in spec.outputs]
        )
        defaults.check(model_name)
        runtime_class = getattr(cls, "runtime_class", None)  # an MLServer runtime (mlserver.runtime.adapter)
        if runtime_class is not None:
            document = json.loads(parameters.get(MODEL_SETTINGS_PARAMETER) or "{}")
            if hosting_of(document, model_name) == "process":
                workers = start_workers(
                    runtime_class, model_name, version, path, config, options, bool(getattr(cls, "streams_only", False))
                )
                log.info("model '%s' version %d: %s in %d worker processes", model_name, version,
                         runtime_class.__qualname__, len(workers))
                return config, workers
        extra: dict = {}
        if parameters.get("extra"):
            try:
                extra = json.loads(parameters["extra"])
            except json.JSONDecodeError as exc:
                raise InvalidArgument(f"model '{model_name}': parameter 'extra' is not JSON: {exc}") from None

        said = _truthy(parameters.get("batchable", ""))
        marked = is_batchable(getattr(cls, "predict", None))
        batchable = config.max_batch_size > 0 and not getattr(cls, "one_request_per_call", False) and (
            said if said is not None else marked if marked is not None else config.HasField("dynamic_batching")
        )
        try:
            concurrency = max(1, int(parameters.get("max_concurrency") or 1))
        except ValueError:
            raise InvalidArgument(f"model '{model_name}': parameter 'max_concurrency' must be an integer") from None

        count = sum(group.count for group in config.instance_group) or 1
        hosts: list[_Host] = []
        try:
            for index in range(count):
                host = _Host(
                    cls, model_name, version, path.parent, config, spec, parameters, extra, index, defaults, batchable
                )
                hosts.append(host)
                host.start()
        except BaseException:
            for host in reversed(hosts):
                host.stop(drain=False)
            raise
        log.info(
            "model '%s' version %d: %s x%d%s",
            model_name,
            version,
            cls.__qualname__,
            count,
            " (batchable)" if batchable else "",
        )
        return config, [
            (AsyncStreamInstance if host.streams_async else PythonInstance)(host)
            for host in hosts for _ in range(concurrency)
        ]


KIND = PythonKind()
