"""Loading a ``TritonPythonModel`` (Triton's Python backend): config, auto-complete, instances.

Rules:
- A model.py is Triton's when it defines ``class TritonPythonModel`` (read as
  text: the server never imports a process-hosted model's code itself).
- Hosting (config parameter ``hosting``): ``process`` (default) runs each
  instance in its own worker process; ``in_process`` runs them in the server.
- ``auto_complete_config`` (when model.py defines it) runs once, in a worker of
  its own (process hosting), and may add inputs, outputs, max_batch_size, a
  dynamic batcher and the transaction policy to what config.pbtxt says.
- ``initialize(args)`` gets Triton's keys: ``model_config`` (JSON, every
  field), ``model_instance_kind``, ``model_instance_name``,
  ``model_instance_device_id``, ``model_repository``, ``model_version``, ``model_name``.
- Refused at load: ``EXECUTION_ENV_PATH`` (conda-pack environments).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from ...._proto import model_config_pb2 as mc
from ....errors import InvalidArgument
from ....model_config import MODEL_SETTINGS, DiscoveredTensor, complete_config
from ....pyworker import utils as pb
from ....pyworker.channel import AutoComplete, Initialize, Load
from ..describe import describe as _describe
from ..hosting.worker_process import WorkerDied, WorkerError, WorkerProcess
from .instances import PIPELINE_BATCHED_DEFAULT, PIPELINE_DEFAULT, InProcessInstance, ProcessInstance
from .server_bridge import link_of

_TRITON_CLASS = re.compile(r"^class\s+TritonPythonModel\b", re.MULTILINE)


def is_triton_model_file(path: Path) -> bool:
    try:
        return bool(_TRITON_CLASS.search(path.read_text(encoding="utf-8", errors="replace")))
    except OSError:
        return False


def config_dict(config: mc.ModelConfig) -> dict[str, Any]:
    """The config as Triton gives it to Python models: proto field names, every field, numbers as numbers."""
    try:
        data = json_format.MessageToDict(
            config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    except TypeError:  # protobuf < 5.26
        data = json_format.MessageToDict(
            config, preserving_proto_field_name=True, including_default_value_fields=True  # type: ignore[call-arg]
        )
    for kind in ("input", "output"):
        for entry in data.get(kind, []):
            entry["dims"] = [int(d) for d in entry.get("dims", [])]
            if "reshape" in entry:
                entry["reshape"]["shape"] = [int(d) for d in entry["reshape"].get("shape", [])]
    return data


def complete_python_config(base: mc.ModelConfig, model_name: str, default_max_batch_size: int) -> mc.ModelConfig:
    """A Python model's config completed from the tensors it declares (either kind: fastoip's or Triton's)."""
    batch = base.max_batch_size > 0
    config = complete_config(
        base,
        model_name,
        declared_tensors(base.input, batch, model_name, "input"),
        declared_tensors(base.output, batch, model_name, "output"),
        default_max_batch_size,
        platform="",
    )
    if not config.backend:
        config.backend = "python"
    return config


def declared_tensors(entries: Sequence[Any], batch: bool, model_name: str, kind: str) -> list[DiscoveredTensor]:
    """A config's inputs or outputs as the tensors a Python model declares (a data_type is required)."""
    from ....datatypes import CONFIG_TO_V2

    out = []
    for entry in entries:
        if entry.data_type == mc.TYPE_INVALID:
            raise InvalidArgument(f"model '{model_name}': {kind} '{entry.name}' needs a data_type")
        dims = tuple(None if d < 0 else int(d) for d in entry.dims)
        out.append(
            DiscoveredTensor(
                entry.name, CONFIG_TO_V2[mc.DataType.Name(entry.data_type)], ((None,) if batch else ()) + dims
            )
        )
    return out


def _merge_auto_complete(base: mc.ModelConfig, completed: dict[str, Any], model_name: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    try:
        json_format.ParseDict(completed, config, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise InvalidArgument(f"model '{model_name}': auto_complete_config() gave an invalid config: {exc}") from None
    return config


def load_triton(
    model_name: str, version: int, path: Path, base: mc.ModelConfig, options: Any
) -> tuple[mc.ModelConfig, list[Any]]:
    parameters = {key: value.string_value for key, value in base.parameters.items()}
    if "EXECUTION_ENV_PATH" in parameters:
        raise InvalidArgument(
            f"model '{model_name}': parameter EXECUTION_ENV_PATH (a conda-pack execution environment) is not "
            "supported by this server: install the model's packages where the server runs"
        )
    hosting = (parameters.get("hosting") or "process").strip().lower()
    if hosting not in ("process", "in_process"):
        raise InvalidArgument(f"model '{model_name}': parameter 'hosting' must be 'process' or 'in_process'")
    try:
        memory_mb = int(parameters.get("worker_memory_limit_mb") or 0)
    except ValueError:
        raise InvalidArgument(f"model '{model_name}': parameter 'worker_memory_limit_mb' must be an integer") from None
    base = mc.ModelConfig.FromString(base.SerializeToString())
    base.name = base.name or model_name
    load_message = Load(str(path), model_name, version, memory_mb)

    runner = None
    in_process_bridge: Any = None
    if hosting == "in_process":
        from ....pyworker.runner import import_runner
        from . import server_bridge

        in_process_bridge = server_bridge.InProcessBridge(server_bridge.link_of(options))
        pb.BRIDGE.current = in_process_bridge  # for the model's own threads (see pb_utils' BRIDGE)
        try:
            runner = import_runner(path, model_name, version)
            base = _merge_auto_complete(base, runner.auto_complete(config_dict(base)), model_name)
        except InvalidArgument:
            raise
        except Exception as exc:
            raise InvalidArgument(f"model '{model_name}': {_describe(exc)}") from exc
    elif "auto_complete_config" in path.read_text(encoding="utf-8", errors="replace"):
        probe = WorkerProcess(
            f"model '{model_name}' (auto-complete)", lambda *a: None, lambda cause: None, link=link_of(options)
        )
        try:
            probe.control(load_message)
            completed = probe.control(AutoComplete(config_dict(base)))
        except (WorkerDied, WorkerError) as exc:
            raise InvalidArgument(f"model '{model_name}': {_error_text(exc)}") from None
        finally:
            probe.kill()
        base = _merge_auto_complete(base, completed, model_name)

    if not base.input and not base.output:
        raise InvalidArgument(
            f"model '{model_name}': a Python model declares its inputs and outputs in config.pbtxt, "
            f"{MODEL_SETTINGS} or auto_complete_config()"
        )
    if not base.instance_group:
        # the group Triton adds is named after the model (the ones a config lists: <model>_<index>)
        base.instance_group.add(name=model_name, count=1, kind=mc.ModelInstanceGroup.KIND_AUTO)
    for group_index, group in enumerate(base.instance_group):
        if not group.name:
            group.name = f"{model_name}_{group_index}"  # Triton's group names: instances are <group>_<n>
    config = complete_python_config(base, model_name, options.default_max_batch_size)
    decoupled = bool(config.model_transaction_policy.decoupled)
    config_json = json.dumps(config_dict(config))

    window = _pipeline_depth(parameters, model_name, config.WhichOneof("scheduling_choice") is not None)
    instances: list[Any] = []
    try:
        groups = list(config.instance_group) or [mc.ModelInstanceGroup(count=1)]
        index = 0
        for group in groups:
            group_name = group.name
            on_gpu = group.kind == mc.ModelInstanceGroup.KIND_GPU
            for local in range(max(1, group.count)):
                args = {
                    "model_config": config_json,
                    "model_instance_kind": "GPU" if on_gpu else "CPU",
                    "model_instance_name": f"{group_name}_{local}",
                    "model_instance_device_id": str(group.gpus[0] if on_gpu and group.gpus else 0),
                    "model_repository": str(path.parent.parent),
                    "model_version": str(version),
                    "model_name": model_name,
                }
                if runner is not None:
                    from ....pyworker.runner import import_runner

                    instance_runner = runner if index == 0 else import_runner(path, model_name, version)
                    try:
                        with pb.BRIDGE.using(in_process_bridge):
                            instance_runner.initialize(args, decoupled)
                    except Exception as exc:
                        raise InvalidArgument(
                            f"model '{model_name}': initialize() failed: {_describe(exc)}"
                        ) from exc
                    instances.append(
                        InProcessInstance(
                            instance_runner, model_name, str(version), index, decoupled, in_process_bridge
                        )
                    )
                else:
                    try:
                        instances.append(
                            ProcessInstance(
                                model_name, str(version), index, decoupled,
                                [load_message, Initialize(args, decoupled)], link_of(options), window=window,
                            )
                        )
                    except WorkerDied as exc:
                        # Triton's sentence first (its QA greps it), then how the worker ended
                        raise InvalidArgument(
                            f"model '{model_name}': Stub process '{args['model_instance_name']}' is not healthy. "
                            f"({_error_text(exc)})"
                        ) from None
                    except WorkerError as exc:
                        raise InvalidArgument(f"model '{model_name}': {_error_text(exc)}") from None
                index += 1
    except BaseException:
        for instance in instances:
            instance.close()
        raise
    return config, instances


def _pipeline_depth(parameters: dict[str, str], model_name: str, batched: bool) -> int:
    """How many batches may be on their way to one worker (config parameter ``worker_pipeline``; default
    :data:`PIPELINE_DEFAULT`, or :data:`PIPELINE_BATCHED_DEFAULT` with a dynamic or sequence batcher: more
    than one makes its batches smaller, as it hands over a batch instead of letting it grow while the worker
    is busy)."""
    text = (parameters.get("worker_pipeline") or "").strip()
    if not text:
        return PIPELINE_BATCHED_DEFAULT if batched else PIPELINE_DEFAULT
    try:
        depth = int(text)
    except ValueError:
        depth = 0
    if depth < 1:
        raise InvalidArgument(f"model '{model_name}': parameter 'worker_pipeline' must be an integer >= 1")
    return depth


def _error_text(exc: Exception) -> str:
    if isinstance(exc, WorkerDied):
        return f"its Python worker process {exc.cause} while loading"
    return str(exc)
