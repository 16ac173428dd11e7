"""gather_to_split: scalar-index Gathers of one tensor along one axis -> one Split and a Squeeze
each (issue 25, auto_optimizer's Gather-to-Split knowledge); exact; scored; needs a target."""

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.passes import gather_to_split
from graphpass.passes.framework import PassContext

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exporters"))
import _corpus  # noqa: E402

F = TensorProto.FLOAT


def _model(idx=(0, 1, 2), dims=(3, 2, 5), axis=0, opset=17, dtype=F, index_dtype=TensorProto.INT64, index_shape=()):
    nodes, outs, inits = [helper.make_node("Identity", ["x"], ["r"])], [], []
    for j, i in enumerate(idx):
        nodes.append(helper.make_node("Gather", ["r", f"i{j}"], [f"y{j}"], axis=axis, name=f"gather{j}"))
        outs.append(helper.make_tensor_value_info(f"y{j}", dtype, None))
        inits.append(helper.make_tensor(f"i{j}", index_dtype, list(index_shape), [i] if not index_shape else [i] * index_shape[0]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", dtype, list(dims))], outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(m)


def _run(m, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _apply(m, target="ascend910b2"):
    graph = gp.load(m).graph
    result = gather_to_split(graph, PassContext(target=target))
    return result, graph


def _same(before, after, feeds):
    onnx.checker.check_model(after, full_check=True)
    for a, b in zip(_run(before, feeds), _run(after, feeds)):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _x(dims, dtype=np.float32):
    special = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, 1e-45, 3.4e38, -7.5], np.float32)
    return np.resize(special, int(np.prod(dims))).reshape(dims).astype(dtype)


@pytest.mark.parametrize("opset", [11, 13, 17, 18, 21])
@pytest.mark.parametrize("idx, axis, dims", [((0, 1, 2), 0, (3, 2, 5)), ((0, 2), 0, (3, 2, 5)), ((-1, 1), 1, (2, 4, 3)),
                                             ((4, 0, 4), -1, (2, 3, 5)), ((1, 2), -2, (2, 4, 3))])
def test_gathers_become_one_split_bitwise(opset, idx, axis, dims):
    m = _model(idx, dims, axis, opset)
    result, graph = _apply(m)
    assert result.stats["splits"] == 1 and result.stats["gathers"] == len(idx)
    ops = [n.op for n in graph.nodes]
    assert ops.count("Split") == 1 and ops.count("Squeeze") == len(idx) and "Gather" not in ops
    out = gp.to_proto(graph)
    assert [o.name for o in out.graph.output] == [f"y{j}" for j in range(len(idx))]
    _same(m, out, {"x": _x(dims)})


@pytest.mark.parametrize("dtype, np_dtype", [(TensorProto.INT64, np.int64), (TensorProto.FLOAT16, np.float16),
                                             (TensorProto.BOOL, np.bool_), (TensorProto.DOUBLE, np.float64),
                                             (TensorProto.INT32, np.int32), (TensorProto.UINT8, np.uint8)])
def test_every_dtype(dtype, np_dtype):
    m = _model((0, 2), (3, 4), 0, 17, dtype)
    result, graph = _apply(m)
    assert result.modified
    x = (np.arange(12) % 5 - 2).astype(np_dtype).reshape(3, 4) if np_dtype is not np.bool_ else (np.arange(12) % 3 == 0).reshape(3, 4)
    _same(m, gp.to_proto(graph), {"x": x})


@pytest.mark.parametrize("kwargs, why", [
    ({"idx": (0,)}, "one Gather is already one kernel"),
    ({"idx": (0, 3)}, "an index out of range fails at run time"),
    ({"idx": (0, 1), "index_shape": (1,)}, "1-D indices: fuse_gather_split's output, never undone"),
    ({"idx": (0, 1), "dims": ("n", 2)}, "the axis' size is not static"),
])
def test_not_fired(kwargs, why):
    m = _model(**{"dims": (3, 2), **kwargs})
    result, graph = _apply(m)
    assert not result.modified, why
    assert "Split" not in [n.op for n in graph.nodes]


def test_an_out_of_range_gather_still_fails_at_run_time_after_the_others_split():
    m = _model((0, 1, 5), (3, 2))
    result, graph = _apply(m)
    assert result.stats["gathers"] == 2
    out = gp.to_proto(graph)
    with pytest.raises(Exception):
        _run(out, {"x": _x((3, 2))})


def test_duplicate_indices_share_one_part():
    m = _model((1, 1, 2), (3, 2))
    result, graph = _apply(m)
    assert result.stats["gathers"] == 3
    _same(m, gp.to_proto(graph), {"x": _x((3, 2))})


def test_without_a_target_it_does_not_run():
    out = gp.optimize(_model(), target="none")
    assert "Gather" in [n.op for n in out.model.graph.nodes]
    assert any("gather_to_split" in note for note in out.report.notes)


def test_it_never_undoes_fuse_gather_split_in_one_run():
    """Gather(x, [..]) -> Split: fuse_gather_split writes one Gather per part with 1-D indices,
    which gather_to_split does not take (scalar indices only)."""
    g = helper.make_graph(
        [helper.make_node("Gather", ["x", "idx"], ["gx"], axis=1), helper.make_node("Split", ["gx", "sz"], ["a", "b"], axis=1)],
        "g", [helper.make_tensor_value_info("x", F, [1, 4, 3])],
        [helper.make_tensor_value_info("a", F, [1, 2, 3]), helper.make_tensor_value_info("b", F, [1, 2, 3])],
        [helper.make_tensor("idx", TensorProto.INT64, [4], [2, 0, 3, 1]), helper.make_tensor("sz", TensorProto.INT64, [2], [2, 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    out = gp.optimize(m, target="ascend910b2", passes=["fuse_gather_split", "gather_to_split"])
    fired = {r.name for r in out.report.passes if r.modified}
    assert "gather_to_split" not in fired
    _same(m, gp.to_proto(out.model), {"x": _x((1, 4, 3))})


@pytest.mark.parametrize("name", ["gpt2.torchscript", "llama.torchscript", "nms_detector.dynamo", "vad_control_flow.dynamo"])
def test_real_exports_split_and_stay_bitwise(name):
    """After the (exact) cleanup pipeline, gather_to_split fires on these exports and the outputs
    stay bit for bit the export's."""
    from graphpass.passes.pipelines import PIPELINES

    entry = next(e for e in _corpus.exported() if e["file"] == f"{name}.onnx")
    path = _corpus.DATA / entry["file"]
    out = gp.optimize(path, target="ascend910b2", passes=list(PIPELINES["cleanup"]) + ["gather_to_split"])
    applied = [r for r in out.report.passes if r.name == "gather_to_split" and r.modified]
    assert applied and sum(r.stats["splits"] for r in applied) >= 1
    feeds = _corpus.feeds_for(entry)
    ref, got = _run(onnx.load(str(path)), feeds), _run(gp.to_proto(out.model), feeds)
    assert len(ref) == len(got)
    for a, b in zip(ref, got):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
