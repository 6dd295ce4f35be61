"""Execution providers from a model's config, as Triton's onnxruntime backend reads it (backends/ort_providers.py).

The provider lists are built for a GPU machine's provider names without one: ``plan_providers`` only chooses.
The sessions here are real ONNX Runtime sessions on this machine's CPU.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from onnx import TensorProto

from fastoip._proto import model_config_pb2 as mc
from fastoip.backends.onnx import OnnxBackend, available_providers
from fastoip.backends.ort_providers import CPU, CUDA, OPENVINO, TENSORRT, plan_providers
from fastoip.errors import InvalidArgument
from fastoip.repository import RepositoryOptions
from fastoip.testing import InProcessClient
from models import identity_model_bytes, write_model

GPU_MACHINE = [TENSORRT, CUDA, CPU]  # what onnxruntime-gpu lists


def config(text: str) -> mc.ModelConfig:
    return text_format.Parse('name: "m" ' + text, mc.ModelConfig())


def accelerator(kind: str, name: str, **parameters: str) -> str:
    entries = " ".join(f'parameters {{ key: "{key}" value: "{value}" }}' for key, value in parameters.items())
    one = f'{kind}_execution_accelerator {{ name: "{name}" {entries} }}'
    return f"optimization {{ execution_accelerators {{ {one} }} }}"


def parameters(**values: str) -> str:
    return " ".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in values.items())


def plan(text: str, tmp_path: Path, gpu: bool = True, available: list[str] = GPU_MACHINE, device_id: int = 0):  # type: ignore[no-untyped-def]
    return plan_providers(config(text), gpu=gpu, available=available, model_dir=tmp_path, device_id=device_id)


def refused(text: str, tmp_path: Path) -> str:
    with pytest.raises(InvalidArgument) as err:
        plan(text, tmp_path)
    message = str(err.value)
    assert message.startswith("model 'm': "), message
    return message


def test_a_plain_config_gets_the_cuda_ep_on_the_gpu_and_the_cpu_ep_elsewhere(tmp_path: Path) -> None:
    assert plan("", tmp_path, device_id=1) == ([(CUDA, {"device_id": "1"}), CPU], [])
    assert plan("", tmp_path, gpu=False) == ([CPU], [])
    assert plan("", tmp_path, available=[CPU]) == ([CPU], [])  # onnxruntime without the CUDA EP


def test_triton_model_parameters_become_cuda_ep_options(tmp_path: Path) -> None:
    text = parameters(
        cudnn_conv_algo_search="1", gpu_mem_limit="4294967296", arena_extend_strategy="1",
        do_copy_in_default_stream="false",
    )
    providers, notes = plan(text, tmp_path)
    assert providers == [
        (CUDA, {"cudnn_conv_algo_search": "HEURISTIC", "gpu_mem_limit": "4294967296",
                "arena_extend_strategy": "kSameAsRequested", "do_copy_in_default_stream": "0", "device_id": "0"}),
        CPU,
    ]
    assert notes == []
    for number, name in enumerate(("EXHAUSTIVE", "HEURISTIC", "DEFAULT")):
        (cuda, _), _ = plan(parameters(cudnn_conv_algo_search=str(number)), tmp_path)
        assert cuda == (CUDA, {"cudnn_conv_algo_search": name, "device_id": "0"})


@pytest.mark.parametrize(
    ("name", "value", "words"),
    [
        ("cudnn_conv_algo_search", "3", "must be one of 0 (EXHAUSTIVE), 1 (HEURISTIC), 2 (DEFAULT): "
         "unsupported cudnn_conv_algo_search value '3'"),
        ("cudnn_conv_algo_search", "fast", "unsupported cudnn_conv_algo_search value 'fast'"),
        ("arena_extend_strategy", "2", "must be one of 0 (kNextPowerOfTwo), 1 (kSameAsRequested)"),
        ("gpu_mem_limit", "-1", "must be a number of bytes from 0 to 18446744073709551615, got '-1'"),
        ("gpu_mem_limit", "4GB", "must be a number of bytes"),
        ("do_copy_in_default_stream", "maybe", "must be true or false, got 'maybe'"),
    ],
)
def test_a_bad_cuda_parameter_is_refused_naming_it(tmp_path: Path, name: str, value: str, words: str) -> None:
    message = refused(parameters(**{name: value}), tmp_path)
    assert message.startswith(f"model 'm': parameter '{name}' ") and words in message, message


def test_bad_values_are_refused_on_a_cpu_machine_too(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="parameter 'cudnn_conv_algo_search'"):
        plan(parameters(cudnn_conv_algo_search="9"), tmp_path, gpu=False, available=[CPU])


def test_the_tensorrt_accelerator_goes_ahead_of_cuda_with_tritons_parameters(tmp_path: Path) -> None:
    text = accelerator(
        "gpu", "tensorrt", precision_mode="FP16", max_workspace_size_bytes="1073741824",
        trt_max_partition_iterations="10", trt_min_subgraph_size="2", trt_engine_cache_enable="1",
        trt_engine_cache_path="trt_cache", trt_timing_cache_enable="on", trt_timing_cache_path="cache/timing",
        trt_auxiliary_streams="-1", trt_profile_min_shapes="INPUT0:1x4", trt_dump_subgraphs="false",
    )
    providers, notes = plan(text, tmp_path, device_id=2)
    base = tmp_path.resolve()
    assert providers == [
        (TENSORRT, {
            "trt_fp16_enable": "True", "trt_max_workspace_size": "1073741824", "trt_max_partition_iterations": "10",
            "trt_min_subgraph_size": "2", "trt_engine_cache_enable": "True",
            "trt_engine_cache_path": str(base / "trt_cache"), "trt_timing_cache_enable": "True",
            "trt_timing_cache_path": str(base / "cache" / "timing"), "trt_auxiliary_streams": "-1",
            "trt_profile_min_shapes": "INPUT0:1x4", "trt_dump_subgraphs": "False", "device_id": "2",
        }),
        (CUDA, {"device_id": "2"}),
        CPU,
    ]
    assert notes == []


def test_precision_modes_and_int8_parameters(tmp_path: Path) -> None:
    for mode, option in (("INT8", "trt_int8_enable"), ("BF16", "trt_bf16_enable")):
        ((_, options), *_), _ = plan(accelerator("gpu", "tensorrt", precision_mode=mode), tmp_path)
        assert options == {option: "True", "device_id": "0"}
    ((_, options), *_), _ = plan(accelerator("gpu", "tensorrt", precision_mode="FP32"), tmp_path)
    assert options == {"device_id": "0"}
    text = accelerator(
        "gpu", "tensorrt", precision_mode="INT8", int8_calibration_table_name="calibration.flatbuffers",
        int8_use_native_calibration_table="1",
    )
    ((_, options), *_), _ = plan(text, tmp_path)
    assert options == {
        "trt_int8_enable": "True", "trt_int8_calibration_table_name": "calibration.flatbuffers",
        "trt_int8_use_native_calibration_table": "True", "device_id": "0",
    }


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"precision_mode": "fp16"}, "parameter 'precision_mode' of the tensorrt execution accelerator must be FP32, "
         "FP16, BF16 or INT8: unsupported precision mode 'fp16'"),
        ({"max_workspace_size": "1"}, "unknown parameter 'max_workspace_size' is provided for the tensorrt "
         "execution accelerator"),
        ({"trt_min_subgraph_size": "two"}, "parameter 'trt_min_subgraph_size' of the tensorrt execution "
         "accelerator must be an integer"),
        ({"trt_engine_cache_enable": "enabled"}, "parameter 'trt_engine_cache_enable' of the tensorrt execution "
         "accelerator must be true or false, got 'enabled'"),
        ({"max_workspace_size_bytes": ""}, "parameter 'max_workspace_size_bytes' of the tensorrt execution "
         "accelerator must be a number of bytes"),
        ({"int8_calibration_table_name": "../table"}, "must be a file name, not a path, got '../table'"),
        ({"trt_engine_cache_prefix": "a/b"}, "must be a file name, not a path"),
    ],
)
def test_a_bad_tensorrt_parameter_is_refused_naming_it(tmp_path: Path, values: dict, words: str) -> None:
    assert words in refused(accelerator("gpu", "tensorrt", **values), tmp_path)


def test_tensorrt_paths_stay_inside_the_model_directory(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    (model_dir / "1").mkdir(parents=True)
    inside = model_dir / "engines"
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (model_dir / "link").symlink_to(outside)
    ok = accelerator(
        "gpu", "tensorrt", trt_engine_cache_path=str(inside), trt_extra_plugin_lib_paths="lib/a.so; lib/b.so",
        trt_ep_context_file_path="1/context.onnx", trt_engine_cache_prefix="",  # empty: no setting, as Triton
    )
    ((_, options), *_), _ = plan(ok, model_dir)
    base = model_dir.resolve()
    assert options["trt_engine_cache_path"] == str(base / "engines")
    assert options["trt_extra_plugin_lib_paths"] == f"{base / 'lib' / 'a.so'};{base / 'lib' / 'b.so'}"
    assert options["trt_ep_context_file_path"] == str(base / "1" / "context.onnx")
    assert "trt_engine_cache_prefix" not in options
    for key, value in (
        ("trt_engine_cache_path", "../elsewhere"),
        ("trt_timing_cache_path", str(outside)),
        ("trt_engine_cache_path", "link/engines"),  # a symbolic link out of the model's directory
        ("trt_extra_plugin_lib_paths", "lib/a.so;/usr/lib/evil.so"),
        ("trt_ep_context_file_path", "/etc/passwd"),
    ):
        with pytest.raises(InvalidArgument) as err:
            plan_providers(config(accelerator("gpu", "tensorrt", **{key: value})), gpu=True, available=GPU_MACHINE,
                           model_dir=model_dir)
        assert f"parameter '{key}' of the tensorrt execution accelerator must be a path inside the model's " \
            f"directory {base}" in str(err.value), (key, value)


def test_cuda_accelerator_parameters_become_cuda_ep_options(tmp_path: Path) -> None:
    text = accelerator(
        "gpu", "cuda", cudnn_conv_use_max_workspace="0", use_ep_level_unified_stream="true",
        cudnn_conv_algo_search="HEURISTIC", gpu_mem_limit="1000", prefer_nhwc="on", sdpa_kernel="2",
        some_later_option="x", device_id="3", tunable_op_max_tuning_duration_ms="",
    )
    providers, notes = plan(text, tmp_path, device_id=1)
    assert providers == [
        (CUDA, {"cudnn_conv_use_max_workspace": "0", "use_ep_level_unified_stream": "1",
                "cudnn_conv_algo_search": "HEURISTIC", "gpu_mem_limit": "1000", "prefer_nhwc": "1",
                "sdpa_kernel": "2",
                "some_later_option": "x",  # not checked here: ORT refuses names it does not know, on a GPU
                "device_id": "1"}),
        CPU,
    ]
    assert notes == ["parameter 'device_id' of the cuda execution accelerator is ignored: fastoip sets it from the "
                     "instance group"]


def test_triton_model_parameters_win_over_the_cuda_accelerator(tmp_path: Path) -> None:
    text = accelerator("gpu", "cuda", cudnn_conv_algo_search="DEFAULT", arena_extend_strategy="kSameAsRequested")
    text += " " + parameters(cudnn_conv_algo_search="1")
    ((_, options), _), _ = plan(text, tmp_path)
    assert options == {"cudnn_conv_algo_search": "HEURISTIC", "arena_extend_strategy": "kSameAsRequested",
                       "device_id": "0"}


def test_cuda_options_that_are_addresses_are_refused(tmp_path: Path) -> None:
    for key in ("user_compute_stream", "gpu_external_alloc"):
        message = refused(accelerator("gpu", "cuda", **{key: "140737488355328"}), tmp_path)
        assert f"parameter '{key}' of the cuda execution accelerator is a memory address" in message
    assert "parameter 'enable_cuda_graph' of the cuda execution accelerator must be true or false" in refused(
        accelerator("gpu", "cuda", enable_cuda_graph="sometimes"), tmp_path
    )
    assert "parameter 'sdpa_kernel' of the cuda execution accelerator must be an integer" in refused(
        accelerator("gpu", "cuda", sdpa_kernel="flash"), tmp_path
    )


def test_unknown_accelerators_are_refused_as_triton_refuses_them(tmp_path: Path) -> None:
    for kind, name in (("gpu", "auto_mixed_precision"), ("gpu", "openvino"), ("cpu", "tensorrt"), ("cpu", "cuda")):
        message = refused(accelerator(kind, name), tmp_path)
        assert message == (
            f"model 'm': unknown execution accelerator '{name}' is requested (gpu_execution_accelerator takes "
            "tensorrt or cuda, cpu_execution_accelerator openvino)"
        )
    twice = 'optimization { execution_accelerators { gpu_execution_accelerator [{ name: "tensorrt" }, ' \
        '{ name: "tensorrt" }] } }'
    assert "lists the tensorrt accelerator twice" in refused(twice, tmp_path)


def test_an_accelerator_this_machine_lacks_is_left_out_with_a_note(tmp_path: Path) -> None:
    tensorrt = accelerator("gpu", "tensorrt", precision_mode="FP16")
    providers, notes = plan(tensorrt, tmp_path, available=[CUDA, CPU])
    assert providers == [(CUDA, {"device_id": "0"}), CPU]
    assert notes == [f"the tensorrt execution accelerator is not used: this onnxruntime has no {TENSORRT} "
                     f"(available: {CUDA}, {CPU}); the model runs on the CUDA EP"]
    for gpu, available in ((False, GPU_MACHINE), (True, [CPU])):  # a CPU instance, or no CUDA EP
        providers, notes = plan(tensorrt, tmp_path, gpu=gpu, available=available)
        assert providers == [CPU]
        assert notes == ["gpu_execution_accelerator tensorrt not used: the model runs on the CPU (Triton ignores "
                         "GPU accelerators for CPU instances too)"]
    providers, notes = plan(accelerator("cpu", "openvino"), tmp_path, available=[CPU])
    assert providers == [CPU]
    assert notes[0].startswith(f"the openvino execution accelerator is not used: this onnxruntime has no {OPENVINO}")


def test_openvino_follows_cuda_where_onnxruntime_has_it(tmp_path: Path) -> None:
    text = accelerator("cpu", "openvino", device_type="GPU")
    everything = [TENSORRT, CUDA, OPENVINO, CPU]
    providers, notes = plan(text, tmp_path, available=everything)
    assert providers == [(CUDA, {"device_id": "0"}), (OPENVINO, {"device_type": "CPU"}), CPU]
    assert notes == ["the openvino execution accelerator's parameters ['device_type'] are ignored (Triton reads "
                     "none: OpenVINO runs with device_type CPU)"]
    providers, _ = plan(text, tmp_path, gpu=False, available=everything)
    assert providers == [(OPENVINO, {"device_type": "CPU"}), CPU]


@pytest.mark.filterwarnings("ignore:Specified provider")  # ORT's own warning for the providers it leaves out
def test_a_session_notes_a_tensorrt_ep_onnx_runtime_did_not_start(tmp_path: Path) -> None:
    """ORT leaves out providers it cannot start; the backend says so and runs on what did start.

    This machine's onnxruntime has neither TensorRT nor CUDA: the backend is told they are there, so it asks ORT
    for them, and ORT (for real) starts the CPU EP alone.
    """
    path = tmp_path / "1" / "model.onnx"
    path.parent.mkdir()
    path.write_bytes(identity_model_bytes(TensorProto.FLOAT, [4]))
    backend = OnnxBackend(
        path, use_gpu=True, config=config(accelerator("gpu", "tensorrt", precision_mode="FP16")),
        model_dir=tmp_path, available=GPU_MACHINE,
    )
    assert backend.providers == [CPU] and not backend.on_gpu and not backend.on_tensorrt
    assert len(backend.notes) == 1
    assert backend.notes[0].startswith(f"the tensorrt execution accelerator is not used: onnxruntime did not start "
                                       f"{TENSORRT}")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(backend.run({"INPUT0": x}, ["OUTPUT0"])[0], x)
    backend.close()


def test_a_model_with_a_tensorrt_accelerator_serves_on_this_cpu_machine(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert TENSORRT not in available_providers()  # the point of this test: a CPU-only onnxruntime
    text = (
        "max_batch_size: 4\n"
        + accelerator("gpu", "tensorrt", precision_mode="FP16", trt_engine_cache_enable="1",
                      trt_engine_cache_path="trt_cache")
        + "\n" + parameters(cudnn_conv_algo_search="1")
    )
    write_model(tmp_path, "trt", identity_model_bytes(TensorProto.FLOAT, [4]), config=text)
    write_model(tmp_path, "bad", identity_model_bytes(TensorProto.FLOAT, [4]),
                config="max_batch_size: 4\n" + accelerator("gpu", "tensorrt", precision_mode="FP8"))
    with caplog.at_level(logging.WARNING, logger="fastoip"):
        # use_gpu as `fastoip serve` has it: this machine has no GPU
        client = InProcessClient(tmp_path, repository_options=RepositoryOptions(), require_ready=False)
    with client:
        assert client.is_model_ready("trt")
        assert not client.is_model_ready("bad")
        assert "parameter 'precision_mode' of the tensorrt execution accelerator must be FP32, FP16, BF16 or INT8: " \
            "unsupported precision mode 'FP8'" in client.model_not_ready_reason("bad")
        notes = [r.getMessage() for r in caplog.records if r.name == "fastoip.onnx"]
        assert notes == ["model 'trt': gpu_execution_accelerator tensorrt not used: the model runs on the CPU "
                         "(Triton ignores GPU accelerators for CPU instances too)"]
        assert [backend.providers for backend in client.core.repository.get("trt").backends] == [[CPU]]
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        np.testing.assert_array_equal(client.infer("trt", {"INPUT0": x})["OUTPUT0"], x)
        assert not (tmp_path / "trt" / "trt_cache").exists()  # nothing written for an accelerator not used
