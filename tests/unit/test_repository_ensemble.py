"""Ensemble plans checked at load: wiring, producers, cycles, datatypes and shapes."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from fastoip._proto import model_config_pb2 as mc
from fastoip.errors import InvalidArgument
from fastoip.repository.ensemble import ComposingModel, TensorShape, plan_ensemble

MODELS = {
    "pre": ComposingModel("pre", 8, {"RAW": TensorShape("UINT8", (4,))}, {"SCALED": TensorShape("FP32", (4,))}),
    "net": ComposingModel("net", 8, {"X": TensorShape("FP32", (4,))}, {"Y": TensorShape("FP32", (2,))}),
    "post": ComposingModel("post", 8, {"SCORES": TensorShape("FP32", (2,))}, {"LABEL": TensorShape("INT64", (1,))}),
    "fixed": ComposingModel("fixed", 0, {"X": TensorShape("FP32", (4,))}, {"Y": TensorShape("FP32", (2,))}),
    "small": ComposingModel("small", 4, {"X": TensorShape("FP32", (4,), True, "small")},
                            {"Y": TensorShape("FP32", (2,), True, "small")}),
    "flat": ComposingModel("flat", 0, {"X": TensorShape("FP32", (-1, 4), False, "flat")},
                           {"Y": TensorShape("FP32", (-1, 2), False, "flat")}),
}


def lookup(name: str) -> ComposingModel | None:
    return MODELS.get(name)


def config(steps: str, inputs: str = 'input { name: "IN" data_type: TYPE_UINT8 dims: [4] }',
           outputs: str = 'output { name: "OUT" data_type: TYPE_INT64 dims: [1] }') -> mc.ModelConfig:
    text = f'name: "ens" platform: "ensemble" max_batch_size: 8 {inputs} {outputs} ensemble_scheduling {{ {steps} }}'
    return text_format.Parse(text, mc.ModelConfig())


def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'step {{ model_name: "{model}" model_version: -1 {ins} {outs} }}'


CHAIN = [
    step("post", {"SCORES": "y"}, {"LABEL": "OUT"}),  # listed first: the plan orders steps by their inputs
    step("pre", {"RAW": "IN"}, {"SCALED": "x"}),
    step("net", {"X": "x"}, {"Y": "y"}),
]


def test_a_chain_is_ordered_by_what_each_step_needs() -> None:
    plan = plan_ensemble(config(" ".join(CHAIN)), lookup)
    assert [s.model_name for s in plan.steps] == ["pre", "net", "post"]
    assert plan.inputs == ("IN",) and plan.outputs == ("OUT",)
    assert plan.steps[0].model_version == ""
    assert plan.composing_models == ("pre", "net", "post")


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([step("pre", {"RAW": "IN"}, {"SCALED": "x"})], "output 'OUT' is not produced"),
        ([step("missing", {"RAW": "IN"}, {"SCALED": "OUT"})], "model 'missing' is not available"),
        ([step("pre", {}, {"SCALED": "x"}), *CHAIN[:1], CHAIN[2]],
         "in ensemble ens, input RAW in model pre is not mapped to any ensemble tensors"),
        ([step("pre", {"RAW": "IN", "NOPE": "IN"}, {"SCALED": "x"}), CHAIN[0], CHAIN[2]],
         "in ensemble ens, ensemble tensor IN is mapping to non-existing input NOPE in model pre"),
        ([step("pre", {"RAW": "IN"}, {"SCALED": "x"}), step("net", {"X": "x"}, {"Y": "x"}), CHAIN[0]],
         "'x' is already produced by step 0"),
        ([step("pre", {"RAW": "IN"}, {"SCALED": "IN"}), *CHAIN], "is an ensemble input"),
        ([step("net", {"X": "z"}, {"Y": "y"}), CHAIN[0]], "'z' is never produced"),
        ([step("net", {"X": "IN"}, {"Y": "y"}), CHAIN[0]],
         "in ensemble ens, ensemble tensor IN: inconsistent data type: TYPE_UINT8 is inferred"),
        # Triton's words: a step that batches less than the ensemble
        ([step("small", {"X": "x"}, {"Y": "y"}), *CHAIN[:2]],
         "ensemble ens allows maximum batch size 8, but it contains model small which only allows maximum batch size "
         "to be 4"),
    ],
)
def test_bad_wiring_is_a_load_error_naming_the_problem(steps: list[str], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        plan_ensemble(config(" ".join(steps)), lookup)


def test_a_cycle_between_steps_is_refused() -> None:
    models = {
        "a": ComposingModel("a", 8, {"I": TensorShape("FP32", (1,)), "J": TensorShape("FP32", (1,))},
                            {"O": TensorShape("FP32", (1,))}),
        "b": ComposingModel("b", 8, {"I": TensorShape("FP32", (1,))}, {"O": TensorShape("FP32", (1,))}),
    }
    steps = [step("a", {"I": "IN", "J": "q"}, {"O": "p"}), step("b", {"I": "p"}, {"O": "q"}),
             step("b", {"I": "q"}, {"O": "OUT"})]
    cfg = config(" ".join(steps), inputs='input { name: "IN" data_type: TYPE_FP32 dims: [1] }',
                 outputs='output { name: "OUT" data_type: TYPE_FP32 dims: [1] }')
    with pytest.raises(InvalidArgument, match="cycle"):
        plan_ensemble(cfg, models.get)


def test_shapes_must_agree_where_both_are_fixed() -> None:
    steps = [step("pre", {"RAW": "IN"}, {"SCALED": "x"}), step("post", {"SCORES": "x"}, {"LABEL": "OUT"})]
    with pytest.raises(InvalidArgument,
                       match=r"in ensemble ens, ensemble tensor x: inconsistent shape: \[4\] is inferred from model"):
        plan_ensemble(config(" ".join(steps)), lookup)


def test_a_batching_ensemble_may_hold_a_non_batching_step_whose_full_shapes_agree() -> None:
    """Triton accepts it: the non-batching model's [-1, 4] is the batching side's [4] with its batch dimension."""
    pre = ComposingModel("pre", 8, {"RAW": TensorShape("UINT8", (4,), True, "pre")},
                         {"SCALED": TensorShape("FP32", (4,), True, "pre")})
    post = ComposingModel("post", 8, {"SCORES": TensorShape("FP32", (2,), True, "post")},
                          {"LABEL": TensorShape("INT64", (1,), True, "post")})
    models = {"pre": pre, "post": post, "flat": MODELS["flat"]}
    steps = [step("pre", {"RAW": "IN"}, {"SCALED": "x"}), step("flat", {"X": "x"}, {"Y": "y"}), CHAIN[0]]
    plan = plan_ensemble(config(" ".join(steps)), models.get)
    assert [s.model_name for s in plan.steps] == ["pre", "flat", "post"]


def test_an_ensemble_needs_the_ensemble_platform() -> None:
    cfg = config(" ".join(CHAIN))
    cfg.platform = "onnxruntime_onnx"
    with pytest.raises(InvalidArgument, match='platform "ensemble"'):
        plan_ensemble(cfg, lookup)


SPLIT = ComposingModel("split", 8, {"RAW": TensorShape("UINT8", (4,))}, {"SCALED": TensorShape("FP32", (4,))},
                       decoupled=True)
MIXER = ComposingModel("mixer", 8, {"A": TensorShape("UINT8", (4,)), "B": TensorShape("FP32", (4,))},
                       {"Y": TensorShape("FP32", (2,))})


def with_decoupled(name: str) -> ComposingModel | None:
    return {"split": SPLIT, "mixer": MIXER}.get(name) or MODELS.get(name)


def test_a_decoupled_step_makes_the_plan_decoupled() -> None:
    steps = [step("split", {"RAW": "IN"}, {"SCALED": "x"}), step("net", {"X": "x"}, {"Y": "y"}),
             step("post", {"SCORES": "y"}, {"LABEL": "OUT"})]
    plan = plan_ensemble(config(" ".join(steps)), with_decoupled)
    assert plan.decoupled and [s.decoupled for s in plan.steps] == [True, False, False]
    assert not plan_ensemble(config(" ".join(CHAIN)), lookup).decoupled


def test_a_step_reading_two_decoupled_lineages_is_refused_in_tritons_words() -> None:
    steps = [step("split", {"RAW": "IN"}, {"SCALED": "x"}), step("mixer", {"A": "IN", "B": "x"}, {"Y": "y"}),
             step("post", {"SCORES": "y"}, {"LABEL": "OUT"})]
    with pytest.raises(InvalidArgument, match="in ensemble ens, step of model 'mixer' receives inputs originated "
                                              "from different decoupled models"):
        plan_ensemble(config(" ".join(steps)), with_decoupled)
