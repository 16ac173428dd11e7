"""The ATC kit: op check and opset fit, gears, options against the CANN data, round trip."""

import json
import shlex

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphpass.atc import check_command, check_ops, fit_opset, plan_gears, read_kit, write_kit
from graphpass.cost_model import cann
from graphpass.errors import UnsupportedError, UsageError
from graphpass.passes.fusion_switch import fusion_passes
from graphpass.testing import make_model

EXAMPLE = "examples/models/shufflenet_v2_x0_5.onnx"


def _opset20():
    nodes = [helper.make_node("Add", ["x", "b"], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["r"], name="relu"),
             helper.make_node("ReduceMean", ["r", "axes"], ["y"], name="mean", keepdims=1)]
    return make_model(nodes, {"x": [2, 3, 4, 5]}, {"y": [2, 1, 4, 5]},
                      {"b": np.float32([[[[np.nan]], [[-0.0]], [[np.inf]]]]), "axes": np.int64([1])}, opset=20)


def _dynamic_batch():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    m = make_model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]},
                   {"w": np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)})
    for vi in (m.graph.input[0], m.graph.output[0]):
        vi.type.tensor_type.shape.dim[0].ClearField("dim_value")
        vi.type.tensor_type.shape.dim[0].dim_param = "batch"
    return m


def test_an_opset_20_model_is_converted_for_a_cann_that_takes_v9_to_v18_and_verified():
    m = _opset20()
    fitted, check = fit_opset(m, cann.release("7.0"))
    assert check.converted_from == 20 and check.opset == 18
    assert "bitwise equal" in check.verified and not check.refused
    assert [i.version for i in fitted.opset_import if i.domain in ("", "ai.onnx")] == [18]
    onnx.checker.check_model(fitted, full_check=True)
    assert [i.version for i in m.opset_import if i.domain == ""] == [20]  # the input is not changed


def test_a_model_inside_the_range_is_not_converted():
    fitted, check = fit_opset(_dynamic_batch(), cann.release("7.0"))
    assert check.converted_from is None and check.opset == 17


def test_an_op_missing_from_the_chosen_cann_is_refused_by_name_before_the_kit(tmp_path):
    assert not cann.release().supports("DFT", 17)
    nodes = [helper.make_node("DFT", ["x"], ["y"], name="my_dft", onesided=0)]
    m = make_model(nodes, {"x": [1, 8, 1]}, {"y": [1, 8, 2]})
    check = check_ops(m, cann.release())
    assert [(r.node, r.op_type) for r in check.refused] == [("my_dft", "DFT")]
    with pytest.raises(UnsupportedError, match="my_dft \\(DFT\\)"):
        write_kit(m, tmp_path / "kit")
    assert not (tmp_path / "kit").exists()


def test_a_custom_domain_node_is_refused():
    nodes = [helper.make_node("Foo", ["x"], ["y"], name="foo", domain="my.ops")]
    m = make_model(nodes, {"x": [2]}, {"y": [2]}, extra_opsets={"my.ops": 1})
    assert "ai.onnx ops only" in check_ops(m, cann.release()).refused[0].reason


@pytest.mark.parametrize("target", ["ascend910a", "ascend910b2", "ascend310p3"])
@pytest.mark.parametrize("version", sorted(cann.releases()))
def test_every_target_and_release_gives_a_documented_command_whose_files_parse(tmp_path, target, version):
    kit = write_kit(EXAMPLE, tmp_path, target=target, cann=version, name="shufflenet", profiles=["N=1"])
    rel = cann.release(version)
    assert check_command(kit.options, rel, tmp_path) == []
    for k, v in kit.options:
        assert rel.option(k) is not None, k
    assert dict(kit.options)["soc_version"] == cann.soc_version(target)
    assert ("precision_mode_v2" in dict(kit.options)) == (rel.option("precision_mode_v2") is not None)
    words = shlex.split((tmp_path / "atc.sh").read_text().split("atc \\", 1)[1].replace("\\\n", " "))
    assert words == [f"--{k}={v}" for k, v in kit.options]
    for f in kit.files:
        assert (tmp_path / f).is_file(), f
    onnx.checker.check_model(str(tmp_path / "shufflenet.onnx"), full_check=True)
    json.loads((tmp_path / "fusion_switch.json").read_text())
    readme = (tmp_path / "README.md").read_text()
    assert all(f"`--{k}`" in readme for k, _ in kit.options)


def test_three_gears_of_a_dynamic_batch_give_dynamic_batch_size_and_an_estimate_per_gear(tmp_path):
    kit = write_kit(_dynamic_batch(), tmp_path, profiles=["batch=1", "batch=4", "batch=16"], cann="7.0")
    opts = dict(kit.options)
    assert opts["input_shape"] == "x:-1,3,8,8" and opts["dynamic_batch_size"] == "1,4,16"
    assert "dynamic_dims" not in opts and opts["input_format"] == "NCHW"
    ms = [e["total_ms"] for e in kit.estimates]
    assert len(ms) == 3 and ms[0] < ms[1] < ms[2]
    assert [e["gear"] for e in kit.estimates] == ["x:1,3,8,8", "x:4,3,8,8", "x:16,3,8,8"]
    assert "| `x:16,3,8,8` |" in (tmp_path / "README.md").read_text()


def test_gears_in_a_non_batch_dim_give_dynamic_dims_with_nd():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    m = make_model(nodes, {"x": [1, 5]}, {"y": [1, 5]})
    m.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "seq"
    g = plan_gears(m, ["x:1,8", "x:1,16", "seq=32"])
    assert g.input_shape == {"x": [1, -1]} and g.option == "dynamic_dims" and g.value == "8;16;32"


def test_an_open_dim_without_a_profile_is_a_usage_error_naming_it():
    with pytest.raises(UsageError, match="batch"):
        plan_gears(_dynamic_batch(), [])
    with pytest.raises(UsageError, match="does not fit"):
        plan_gears(_dynamic_batch(), ["x:1,3,9,8", "x:2,3,8,8"])
    with pytest.raises(UsageError, match="no input dim named bacth \\(the model's symbolic dims: batch\\)"):
        plan_gears(_dynamic_batch(), ["bacth=1", "batch=2"])
    with pytest.raises(UsageError, match="at most 100"):
        plan_gears(_dynamic_batch(), [f"batch={i}" for i in range(1, 102)])


def test_keep_list_and_switches_round_trip_through_the_kit_files(tmp_path):
    m = _dynamic_batch()
    switches = {n: (i % 2 == 0) for i, n in enumerate(sorted(fusion_passes()))}
    kit = write_kit(m, tmp_path, profiles=["batch=1", "batch=2"], keep_fp32=["relu"], switches=switches,
                    precision_mode="allow_mix_precision")
    back = read_kit(tmp_path)
    assert back.keep_fp32 == ["relu"] == kit.keep_fp32
    assert back.switches == switches
    assert back.options == dict(kit.options)
    assert back.options["precision_mode_v2"] == "mixed_float16"
    assert back.options["op_select_implmode"] == "high_precision"
    mix = json.loads((tmp_path / back.options["modify_mixlist"]).read_text())
    assert mix == {"black-list": {"to-add": sorted(cann.release().ascend_types["Relu"])}}


def test_no_keep_dtype_where_atc_ignores_it(tmp_path):
    kit = write_kit(EXAMPLE, tmp_path, precision_mode="must_keep_origin_dtype", keep_fp32=[],
                    name="s", cann="6.0", profiles=["N=2"])
    opts = dict(kit.options)
    assert opts["precision_mode"] == "must_keep_origin_dtype" and "keep_dtype" not in opts


def test_check_command_finds_what_the_documentation_does_not_allow(tmp_path):
    rel = cann.release("6.0")
    bad = [("precision_mode_v2", "fp16"), ("log", "loud"), ("keep_dtype", "missing.cfg"),
           ("dynamic_batch_size", "4"), ("no_such", "1")]
    problems = " | ".join(check_command(bad, rel, tmp_path))
    for word in ("--precision_mode_v2 is not", "--log=loud", "missing.cfg", "1 gears", "--no_such"):
        assert word in problems


def test_a_change_onnx_has_no_adapter_for_but_only_widened_types_is_relabelled_and_verified():
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]  # Relu 13 -> 14 added bfloat16 only
    m = make_model(nodes, {"x": [2, 3]}, {"y": [2, 3]}, opset=17)
    fitted, check = fit_opset(m, cann.release("6.0"))
    assert check.converted_from == 17 and check.opset == 13 and "bitwise equal" in check.verified
    onnx.checker.check_model(fitted, full_check=True)


def test_an_op_newer_than_the_target_opset_is_expanded_by_its_function_body_or_named():
    nodes = [helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="ln", axis=-1)]
    m = make_model(nodes, {"x": [2, 4]}, {"y": [2, 4]}, {"s": np.ones(4, np.float32)}, opset=17)
    fitted, check = fit_opset(m, cann.release("6.0"))
    assert "LayerNormalization" not in [n.op_type for n in fitted.graph.node] and "expanded" in check.verified
    nodes = [helper.make_node("DFT", ["x"], ["y"], name="the_dft", onesided=0)]  # no function body
    m = make_model(nodes, {"x": [1, 8, 1]}, {"y": [1, 8, 2]}, opset=17)
    with pytest.raises(UsageError, match="step v17 -> v16.*the_dft \\(DFT\\) does not exist at v16"):
        fit_opset(m, cann.release("6.0"))


DYNAMO20 = "tests/data/atc/tiny_cnn.dynamo.opset20.onnx"  # torch 2.14 dynamo export at opset 20 (make_opset20.py)


def test_a_dynamo_opset_20_export_is_converted_for_7_0_and_gelu_expanded_by_its_function_body(tmp_path):
    m = onnx.load(DYNAMO20)
    assert [i.version for i in m.opset_import if i.domain == ""] == [20]
    assert "Gelu" in [n.op_type for n in m.graph.node]
    fitted, check = fit_opset(m, cann.release("7.0"))
    assert check.converted_from == 20 and check.opset == 18 and not check.refused
    assert "1 node(s) expanded" in check.verified and "within float rounding" in check.verified
    ops = [n.op_type for n in fitted.graph.node]
    assert "Gelu" not in ops and "Erf" in ops
    onnx.checker.check_model(fitted, full_check=True)
    kit = write_kit(DYNAMO20, tmp_path, cann="7.0", profiles=["batch=1", "batch=2", "batch=4"], name="tiny")
    assert dict(kit.options)["dynamic_batch_size"] == "1,2,4" and "converted from v20" in (tmp_path / "README.md").read_text()


def test_the_same_export_goes_down_to_6_0_through_split_and_reducemean_changes():
    fitted, check = fit_opset(onnx.load(DYNAMO20), cann.release("6.0"))
    assert check.opset == 13 and not check.refused
    split = next(n for n in fitted.graph.node if n.op_type == "Split")
    assert len(split.input) == 2 and not any(a.name == "num_outputs" for a in split.attribute)
    mean = next(n for n in fitted.graph.node if n.op_type == "ReduceMean")
    assert [a.name for a in mean.attribute if a.name == "axes"] == ["axes"] and len(mean.input) == 1
    onnx.checker.check_model(fitted, full_check=True)


def test_shape_with_start_end_and_an_uneven_split_are_converted_exactly():
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape", start=1, end=-1),
             helper.make_node("Split", ["x"], ["a", "b", "c"], name="split", axis=1, num_outputs=3)]
    m = make_model(nodes, {"x": [2, 7, 3]}, {"s": (TensorProto.INT64, [1]), "a": [2, 3, 3], "b": [2, 3, 3],
                                              "c": [2, 1, 3]}, opset=18)
    fitted, check = fit_opset(m, cann.release("6.0"))
    assert check.opset == 13 and "bitwise equal" in check.verified
    ops = [n.op_type for n in fitted.graph.node]
    assert ops == ["Shape", "Slice", "Split"]
    sizes = next(t for t in fitted.graph.initializer if t.name.startswith("split_sizes"))
    assert list(onnx.numpy_helper.to_array(sizes)) == [3, 3, 1]


def test_an_unnamed_kept_node_is_named_in_the_kit_model_as_the_keep_list_calls_it(tmp_path):
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Relu", ["e"], ["y"], name="relu")]
    m = make_model(nodes, {"x": [2, 3]}, {"y": [2, 3]})
    kit = write_kit(m, tmp_path, keep_fp32=["e"], name="m")
    assert read_kit(tmp_path).keep_fp32 == ["e"] == kit.keep_fp32
    assert [n.name for n in onnx.load(tmp_path / "m.onnx").graph.node] == ["e", "relu"]
    assert m.graph.node[0].name == ""  # the caller's model is not changed
