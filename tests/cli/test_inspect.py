"""Issue 23: ``inspect`` prints each input's and output's dtype and full shape, symbolic names
included, as written in the file (brackets in a name or a dim are text, never table markup)."""

import onnx
from onnx import TensorProto, helper

from graphpass.cli import main


def _model(path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["p2o.DynamicDimension.0", 3, 640, 640])
    m = helper.make_tensor_value_info("[bold]mask", TensorProto.BOOL, ["[b]", None])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    s = helper.make_tensor_value_info("[red]s", TensorProto.INT64, [4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT16, [])
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Shape", ["x"], ["[red]s"]),
             helper.make_node("ReduceMax", ["x"], ["zf"], keepdims=0),
             helper.make_node("Cast", ["zf"], ["z"], to=TensorProto.FLOAT16)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x, m], [y, s, z]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return path


def test_inspect_prints_dtype_and_full_shape_of_every_input_and_output(tmp_path, capsys):
    assert main(["inspect", str(_model(tmp_path / "m.onnx"))]) == 0
    out = capsys.readouterr().out
    rows = {x.split("│")[2].strip(): x.split("│")[3].strip() for x in out.splitlines() if x.count("│") >= 4}
    assert rows["x"] == "float[p2o.DynamicDimension.0, 3, 640, 640]", out
    assert rows["[bold]mask"] == "bool[[b], ?]", out
    assert rows["y"] == "float, shape unknown", out
    assert rows["[red]s"] == "int64[4]", out
    assert rows["z"] == "float16[] (scalar)", out
    assert "dynamic dims: x[0]=p2o.DynamicDimension.0, [bold]mask[0]=[b], [bold]mask[1]=?" in out


def test_inspect_of_a_path_with_brackets_prints_it_whole(tmp_path, capsys):
    path = _model(tmp_path / "[red]model.onnx")
    assert main(["inspect", str(path)]) == 0
    assert str(path) in capsys.readouterr().out
