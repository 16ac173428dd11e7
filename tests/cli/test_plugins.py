"""Issue 23: a user's passes, written with the pass API, loaded by ``--plugin FILE|MODULE`` or an
entry point of the ``graphpass.passes`` group, run in the default pipeline at the position they
declare (examples/plugin_passes.py)."""

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

from graphpass.cli import main
from graphpass.passes.framework import registry

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "examples" / "plugin_passes.py"


@pytest.fixture(autouse=True)
def _clean_registry():
    before = dict(registry._REGISTRY)
    modules = set(sys.modules)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(before)
    for m in set(sys.modules) - modules:
        del sys.modules[m]


def _conv_relu_relu(path: Path) -> Path:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 4, 4])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2, 4, 4])
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((2, 2, 1, 1)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu1"), helper.make_node("Relu", ["r"], ["y"], name="relu2")]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, path)
    return path


def _run(path, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _optimize(model, tmp_path, *extra):
    out, report = tmp_path / "o.onnx", tmp_path / "r.json"
    assert main(["optimize", str(model), "-o", str(out), "--report", str(report), "--emit", "portable", *extra]) == 0
    return onnx.load(out), json.loads(report.read_text())


def _check(model_path, out_model, tmp_path):
    onnx.checker.check_model(out_model, full_check=True)
    onnx.save(out_model, tmp_path / "check.onnx")
    x = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 1e-45, -3.0, 3.4e38] * 4, np.float32).reshape(1, 2, 4, 4)
    a, b = _run(model_path, {"x": x})[0], _run(tmp_path / "check.onnx", {"x": x})[0]
    assert a.tobytes() == b.tobytes()  # the plugin's pass is exact (fuse_conv_activation too)


def test_without_the_plugin_the_second_relu_stays(tmp_path):
    model = _conv_relu_relu(tmp_path / "m.onnx")
    out, report = _optimize(model, tmp_path)
    assert [n.op_type for n in out.graph.node].count("Relu") == 2
    assert "collapse_relu_relu" not in {r["name"] for r in report["passes"]}


def test_a_plugin_file_joins_the_default_pipeline_before_the_fusions(tmp_path, capsys):
    model = _conv_relu_relu(tmp_path / "m.onnx")
    out, report = _optimize(model, tmp_path, "--plugin", str(PLUGIN))
    ran = [r["name"] for r in report["passes"]]
    assert ran.index("collapse_relu_relu") < ran.index("fuse_conv_activation")  # the declared position
    fired = [r for r in report["passes"] if r["name"] == "collapse_relu_relu" and r["modified"]]
    assert fired and fired[0]["stats"]["fired"] == 1
    assert [n.op_type for n in out.graph.node].count("Relu") == 1
    assert "collapse_relu_relu" in capsys.readouterr().out  # named among the passes that changed something
    _check(model, out, tmp_path)


def test_a_plugin_module_on_the_path_and_the_passes_listing(tmp_path, capsys, monkeypatch):
    (tmp_path / "my_gp_plugin.py").write_text(PLUGIN.read_text())
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["passes", "--plugin", "my_gp_plugin"]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if "collapse_relu_relu" in x)
    assert " on " in row and "cleanup" in row


def test_an_entry_point_pass_runs_in_the_default_pipeline(tmp_path, monkeypatch):
    site = tmp_path / "site"
    (site / "relu_plugin_pkg").mkdir(parents=True)
    (site / "relu_plugin_pkg" / "__init__.py").write_text(PLUGIN.read_text())
    info = site / "relu_plugin_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: relu-plugin-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[graphpass.passes]\nrelu_relu = relu_plugin_pkg\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry, "_LOADED", False)  # a fresh process: entry points load with the built-ins
    model = _conv_relu_relu(tmp_path / "m.onnx")
    out, report = _optimize(model, tmp_path)
    assert any(r["name"] == "collapse_relu_relu" and r["modified"] for r in report["passes"])
    assert [n.op_type for n in out.graph.node].count("Relu") == 1
    _check(model, out, tmp_path)


def test_a_broken_entry_point_is_a_warning_not_a_failure(tmp_path, monkeypatch, caplog):
    site = tmp_path / "site"
    info = site / "broken_gp-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-gp\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[graphpass.passes]\nbroken = no_such_module_gp\n")
    monkeypatch.syspath_prepend(str(site))
    assert registry.load_entry_points() == []
    assert "no_such_module_gp" in caplog.text


@pytest.mark.parametrize("text,says", [
    (None, "no such file"),
    ("def broken(:\n", "SyntaxError"),
    ("raise RuntimeError('boom')\n", "RuntimeError: boom"),
    ("from graphpass.passes.framework.rewrite import rule_pass, rule\n"
     "rule_pass('fold_constants', [rule(('Relu',), lambda m: None)], register=True)\n", "registered twice"),
    ("PASSES = [42]\n", "not a graphpass Pass class"),
])
def test_a_bad_plugin_is_one_line_and_exit_2(text, says, tmp_path, capsys):
    path = tmp_path / "bad_plugin.py"
    if text is not None:
        path.write_text(text)
    model = _conv_relu_relu(tmp_path / "m.onnx")
    assert main(["optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--plugin", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err and "--plugin" in err, err
    assert not (tmp_path / "o.onnx").exists()


def test_an_unknown_plugin_module_is_exit_2(tmp_path, capsys):
    assert main(["passes", "--plugin", "no_such_gp_plugin_module"]) == 2
    assert "no module or .py file" in capsys.readouterr().err


def test_an_entry_point_may_name_a_function_that_returns_the_classes(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    (site / "fn_plugin_gp.py").write_text(
        "from graphpass.passes.framework.pass_base import EXACT, PassKind\n"
        "from graphpass.passes.framework.rewrite import rule, rule_pass\n"
        "def passes():\n"
        "    return [rule_pass('t_fn_relu_relu', [rule(('Relu', 'Relu'), lambda m: m.op('Relu', [m.nodes[0].inputs[0]]))],\n"
        "                      kind=PassKind.CLEANUP, promise=EXACT, runs_before=(PassKind.FUSION,))]\n")
    info = site / "fn_plugin_gp-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fn-plugin-gp\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[graphpass.passes]\nfn = fn_plugin_gp:passes\n")
    monkeypatch.syspath_prepend(str(site))
    assert registry.load_entry_points() == ["t_fn_relu_relu"]
    model = _conv_relu_relu(tmp_path / "m.onnx")
    out, report = _optimize(model, tmp_path)
    assert any(r["name"] == "t_fn_relu_relu" and r["modified"] for r in report["passes"])
    _check(model, out, tmp_path)


# --- the worked example of a user's Ascend knowledge (issue 25) ------------------------------

KNOWLEDGE = ROOT / "examples" / "ascend_knowledge_hardswish.py"


def _hsig_mul(path: Path, alpha=1 / 6, beta=0.5, dtype=onnx.TensorProto.FLOAT, opset=17, other="x", conv=True) -> Path:
    x = helper.make_tensor_value_info("x", dtype, ["N", 2, 4, 4])
    y = helper.make_tensor_value_info("y", dtype, ["N", 2, 4, 4])
    np_t = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((2, 2, 1, 1)).astype(np_t), "w")
    nodes = [helper.make_node("Conv", ["x0", "w"], ["x"], name="conv")] if conv else []
    nodes += [helper.make_node("HardSigmoid", ["x"], ["h"], alpha=alpha, beta=beta, name="hsig"),
              helper.make_node("Mul", [other, "h"] if other else ["h", "x"], ["y"], name="mul")]
    inputs = [helper.make_tensor_value_info("x0", dtype, ["N", 2, 4, 4])] if conv else [x]
    if other not in (None, "x"):
        inputs.append(helper.make_tensor_value_info(other, dtype, ["N", 2, 4, 4]))
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, [y], [w] if conv else []),
                          opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, path)
    return path


def _values(dtype):
    if dtype == np.float16:  # every float16 value
        return np.arange(65536, dtype=np.uint16).view(np.float16)
    special = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 1e-45, -1e-45, 3.4e38, -3.4e38, 3.0, -3.0,
                        2.9999998, -2.9999998], np.float32)
    return np.concatenate([special, np.random.default_rng(1).standard_normal(4096).astype(np.float32) * 4])


@pytest.mark.parametrize("dtype, other", [(onnx.TensorProto.FLOAT, "x"), (onnx.TensorProto.FLOAT16, "x"),
                                          (onnx.TensorProto.FLOAT, None)])  # None: Mul(HardSigmoid(x), x)
def test_the_hardswish_knowledge_fires_and_is_bitwise_exact(tmp_path, dtype, other):
    model = _hsig_mul(tmp_path / "m.onnx", dtype=dtype, conv=False, other=other)
    out, report = _optimize(model, tmp_path, "--plugin", str(KNOWLEDGE), "--target", "ascend910b2")
    fired = [r for r in report["passes"] if r["name"] == "ascend_hardswish" and r["modified"]]
    assert fired and fired[0]["stats"]["fired"] == 1
    assert [n.op_type for n in out.graph.node] == ["HardSwish"]
    onnx.checker.check_model(out, full_check=True)
    onnx.save(out, tmp_path / "check.onnx")
    v = _values(onnx.helper.tensor_dtype_to_np_dtype(dtype))
    x = np.resize(v, (len(v) + 31) // 32 * 32).reshape(-1, 2, 4, 4)
    a, b = _run(model, {"x": x})[0], _run(tmp_path / "check.onnx", {"x": x})[0]
    assert a.shape == x.shape and a.tobytes() == b.tobytes()


def test_the_hardswish_knowledge_runs_before_the_conv_fusion(tmp_path):
    model = _hsig_mul(tmp_path / "m.onnx")
    out, report = _optimize(model, tmp_path, "--plugin", str(KNOWLEDGE), "--target", "ascend910b2", "--emit", "device")
    ran = [r["name"] for r in report["passes"]]
    assert ran.index("ascend_hardswish") < ran.index("fuse_conv_activation")
    assert "HardSigmoid" not in [n.op_type for n in out.graph.node]


@pytest.mark.parametrize("kwargs, why", [
    ({"alpha": 0.2}, "is not HardSwish's"),
    ({"beta": 0.4}, "is not HardSwish's"),
    ({"alpha": 0.1666}, "is not HardSwish's"),
    ({"other": "z"}, "other factor"),
    ({"opset": 13}, "needs opset 14"),
])
def test_the_hardswish_knowledge_refuses_near_misses(tmp_path, capsys, kwargs, why):
    model = _hsig_mul(tmp_path / "m.onnx", conv=False, **kwargs)
    out, report = _optimize(model, tmp_path, "--plugin", str(KNOWLEDGE), "--explain")
    assert "HardSigmoid" in [n.op_type for n in out.graph.node]
    assert why in capsys.readouterr().out
