"""The portable export leaves out the TransData calls it drops (device_ops.transdata_bypassed)
instead of writing them and bypassing them in the proto: the bytes are the same as the proto
path's, the graph is left exactly as it was, and graphs the fast path does not handle
(subgraphs, a TransData of a constant, ...) take the proto path."""

from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.ir import device_ops
from graphpass.ir.device_ops import DOMAIN, is_transdata, transdata_function
from graphpass.passes import propagate_layout
from graphpass.passes.framework.context import PassContext
from graphpass.testing import assert_equivalent, make_model


def _td(x, y, src="NC1HWC0", dst="ND", name=None):
    return helper.make_node("TransData", [x], [y], domain=DOMAIN, name=name or f"td_{y}", src_format=src,
                            dst_format=dst)


def _model(nodes, inputs, outputs, initializers=None, value_info=()):
    return make_model(nodes, inputs, outputs, initializers=initializers, opset=13,
                      functions=[transdata_function(13)], extra_opsets={DOMAIN: 1}, value_info=value_info)


def _state(graph):
    """Everything about the graph an export might disturb: node order, inputs, outputs, readers."""
    tensors = graph.tensors()
    return ([id(n) for n in graph.nodes], [[id(t) for t in n.inputs] for n in graph.nodes],
            [[id(t) for t in n.outputs] for n in graph.nodes],
            {name: [id(n) for n in t.outputs] for name, t in tensors.items()},
            {name: [id(n) for n in t.inputs] for name, t in tensors.items()})


def _both(make, monkeypatch):
    """Portable bytes through the fast path and through the proto path (each on a fresh graph
    from ``make``, a model or a function returning a graph), and whether the fast path bypassed
    anything. Each export leaves its graph as it was, but for the opset imports gs's exporter
    records on it, which both paths record alike."""
    def fresh():
        return make() if callable(make) else gp.load(make).graph

    took = []
    real = device_ops.transdata_bypassed

    class spy:
        def __init__(self, g):
            self.cm = real(g)

        def __enter__(self):
            took.append(self.cm.__enter__())
            return took[-1]

        def __exit__(self, *exc):
            return self.cm.__exit__(*exc)

    graphs, protos = [], []
    for path in (spy, lambda g: _no()):
        graph = fresh()
        monkeypatch.setattr(device_ops, "transdata_bypassed", path)
        before = _state(graph)
        protos.append(gp.to_proto(graph, emit="portable"))
        assert _state(graph) == before
        graphs.append(graph)
    monkeypatch.setattr(device_ops, "transdata_bypassed", real)
    assert [(d.domain, d.version) for d in graphs[0].import_domains] == \
        [(d.domain, d.version) for d in graphs[1].import_domains]
    return protos[0], protos[1], took[0]


class _no:
    def __enter__(self):
        return False

    def __exit__(self, *exc):
        return False


def _same(fast, slow):
    assert fast.SerializeToString(deterministic=True) == slow.SerializeToString(deterministic=True)
    onnx.checker.check_model(fast, full_check=True)
    assert not any(n.domain == DOMAIN for n in fast.graph.node)


X = [1, 16, 4, 4]


def test_chain_shared_readers_double_read_and_graph_output(monkeypatch):
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r0"),
             _td("a", "b"), _td("b", "c", "ND", "NC1HWC0"),  # a chain: readers of c read a
             helper.make_node("Add", ["c", "c"], ["d"], name="add"),  # reads it twice
             helper.make_node("Mul", ["b", "x"], ["e"], name="mul"),
             _td("x", "xi", "ND", "NC1HWC0"),  # of a graph input
             helper.make_node("Sub", ["xi", "e"], ["f"], name="sub"),
             _td("d", "y"),  # writes a graph output: kept (inlined as Identity)
             _td("f", "dead")]  # read by nothing
    model = _model(nodes, {"x": X}, {"y": X, "f": X})
    fast, slow, took = _both(model, monkeypatch)
    assert took is True
    _same(fast, slow)
    assert [n.op_type for n in fast.graph.node] == ["Relu", "Add", "Mul", "Sub", "Identity"]
    assert_equivalent(model, fast)


def test_annotations_and_value_info_of_the_dropped_outputs(monkeypatch):
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, X) for n in ("a", "b", "c")]
    nodes = [helper.make_node("Relu", ["x"], ["a"]), _td("a", "b"), helper.make_node("Neg", ["b"], ["c"]),
             _td("c", "d", "ND", "NC1HWC0"), helper.make_node("Abs", ["d"], ["y"])]
    from graphpass.ir import annotations as A

    def make():
        graph = gp.load(_model(nodes, {"x": X}, {"y": X}, value_info=vi)).graph
        for t in graph.tensors().values():
            if t.name != "x":
                A.set_format(t, "NC1HWC0")
        for n in graph.nodes:
            A.set(n, A.REASON, f"why {n.name}")
        return graph

    fast, slow, took = _both(make, monkeypatch)
    assert took is True
    _same(fast, slow)
    assert {vi.name for vi in fast.graph.value_info} == {"a", "c"}


@pytest.mark.parametrize("mode", ["optimal", "greedy"])
def test_propagate_layout_outputs(mode, monkeypatch):
    """Conv / unaligned Concat / residual Add / graph outputs in the device format (twins)."""
    rng = np.random.default_rng(0)
    w = {f"w{i}": rng.standard_normal((c, 16 if i != 3 else 24, 1, 1)).astype(np.float32)
         for i, c in ((1, 16), (2, 8), (3, 16))}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], kernel_shape=[1, 1]),
             helper.make_node("Concat", ["r1", "c2"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w3"], ["c3"], kernel_shape=[1, 1]),
             helper.make_node("Add", ["c3", "r1"], ["y"]),
             helper.make_node("Sigmoid", ["c1"], ["z"])]
    model = make_model(nodes, {"x": X}, {"y": X, "z": X, "cat": [1, 24, 4, 4]}, initializers=w, opset=13)
    def make():
        graph = gp.load(model).graph
        res = propagate_layout(graph, PassContext(target="ascend910a"), mode=mode)
        assert res.stats["transdata"] >= 3
        return graph

    fast, slow, took = _both(make, monkeypatch)
    assert took is True
    _same(fast, slow)
    assert_equivalent(model, fast)


def test_transdata_of_a_constant_takes_the_proto_path(monkeypatch):
    nodes = [_td("k", "kk", "ND", "NC1HWC0"), helper.make_node("Add", ["x", "kk"], ["y"])]
    model = _model(nodes, {"x": X}, {"y": X}, initializers={"k": np.ones(X, np.float32)})
    fast, slow, took = _both(model, monkeypatch)
    assert took is False
    _same(fast, slow)


def test_graph_with_a_subgraph_takes_the_proto_path(monkeypatch):
    then = helper.make_graph([helper.make_node("Neg", ["b"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, X)])
    other = helper.make_graph([helper.make_node("Abs", ["b"], ["o"])], "else", [],
                              [helper.make_tensor_value_info("o", TensorProto.FLOAT, X)])
    nodes = [helper.make_node("Relu", ["x"], ["a"]), _td("a", "b"),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
    model = _model(nodes, {"x": X, "cond": (TensorProto.BOOL, [])}, {"y": X})
    fast, slow, took = _both(model, monkeypatch)
    assert took is False
    _same(fast, slow)


def test_no_transdata_and_device_form_untouched(monkeypatch):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": X}, {"y": X}, opset=13)
    fast, slow, took = _both(model, monkeypatch)
    assert took is False
    _same(fast, slow)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), _td("a", "b"), helper.make_node("Neg", ["b"], ["y"])]
    graph = gp.load(_model(nodes, {"x": X}, {"y": X})).graph
    device = gp.to_proto(graph, emit="device")
    assert [n.op_type for n in device.graph.node] == ["Relu", "TransData", "Neg"]


def test_every_call_dropped_records_the_opset_imports_as_before(monkeypatch):
    """No call left for the exporter to see: gs's record of the device domain on the graph is
    made all the same (a later device export of the same graph sees the same imports)."""
    w = np.ones((16, 16, 1, 1), np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Reshape", ["r", "s"], ["y"])]
    model = make_model(nodes, {"x": X}, {"y": [1, 256]}, initializers={"w": w, "s": np.array([1, 256], np.int64)},
                       opset=13)

    def make():
        graph = gp.load(model).graph
        assert propagate_layout(graph, PassContext(target="ascend910a")).stats["transdata"] == 2
        assert [d.domain for d in graph.import_domains] == [""]
        return graph

    fast, slow, took = _both(make, monkeypatch)
    assert took is True
    _same(fast, slow)
    assert "Identity" not in [n.op_type for n in fast.graph.node]
    graph = make()
    gp.to_proto(graph, emit="portable")
    assert [d.domain for d in graph.import_domains] == ["", DOMAIN]


def test_an_export_that_raises_midway_leaves_the_graph_as_it_was(monkeypatch):
    """attack14: the block is left by an exception (the exporter fails): node list, readers'
    inputs and the tensors' reader/writer lists are put back, and the next export is the one a
    fresh graph gives."""
    from graphpass.errors import BadModelError
    from graphpass.ir import serialize

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r0"), _td("a", "b"), _td("b", "c", "ND", "NC1HWC0"),
             helper.make_node("Add", ["c", "b"], ["d"], name="add"), _td("d", "y")]
    model = _model(nodes, {"x": X}, {"y": X})
    graph = gp.load(model).graph
    before = _state(graph)
    real = serialize._export_weightless
    seen = []

    def failing(g, *a, **k):
        seen.append([n.op for n in g.nodes])  # inside the block: the dropped calls are out
        raise RuntimeError("disk full")

    monkeypatch.setattr(serialize, "_export_weightless", failing)
    with pytest.raises(BadModelError, match="disk full"):
        gp.to_proto(graph, emit="portable")
    assert seen == [["Relu", "Add", "TransData"]]
    assert _state(graph) == before
    monkeypatch.setattr(serialize, "_export_weightless", real)
    again = gp.to_proto(graph, emit="portable")
    _same(again, gp.to_proto(gp.load(model).graph, emit="portable"))
    assert_equivalent(model, again)


def test_chain_ending_in_a_graph_output_and_an_output_also_read(monkeypatch):
    """attack14: a TransData chain whose last call writes a graph output (kept, inlined as an
    Identity of the chain's source), and a graph output another TransData reads."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r0"), _td("a", "b"), _td("b", "c", "ND", "NC1HWC0"),
             _td("c", "y"), helper.make_node("Neg", ["y"], ["n"], name="neg"), _td("n", "z"),
             helper.make_node("Abs", ["z"], ["w"], name="abs")]
    model = _model(nodes, {"x": X}, {"y": X, "z": X, "w": X})
    fast, slow, took = _both(model, monkeypatch)
    assert took is True
    _same(fast, slow)
    assert_equivalent(model, fast)


def test_transdata_inside_a_local_function_is_left_to_the_proto_path(monkeypatch):
    """attack14: a model function whose body calls TransData: only the top graph's calls are
    the block's; the function's are inlined as before."""
    body = [helper.make_node("TransData", ["p"], ["q"], domain=DOMAIN, src_format="NC1HWC0", dst_format="ND"),
            helper.make_node("Relu", ["q"], ["r"])]
    fn = helper.make_function("user", "F", ["p"], ["r"], body,
                              [helper.make_opsetid("", 13), helper.make_opsetid(DOMAIN, 1)])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="r0"), _td("a", "b"),
             helper.make_node("F", ["b"], ["y"], domain="user", name="f")]
    model = make_model(nodes, {"x": X}, {"y": X}, opset=13, functions=[transdata_function(13), fn],
                       extra_opsets={DOMAIN: 1, "user": 1})
    fast, slow, took = _both(model, monkeypatch)
    assert took is True
    assert fast.SerializeToString(deterministic=True) == slow.SerializeToString(deterministic=True)


def test_device_ops_are_found_in_any_attribute_holding_a_graph():
    # save writes only the value_info its pruning keeps unless a device op may read the rest:
    # one nested in any node's attribute counts (a body of an If, a list of graphs on a node
    # of another op), not only where iter_graphs looks
    from graphpass.ir.device_ops import DOMAIN
    from graphpass.ir.serialize import _holds_device_ops

    def body(domain):
        a, b = gs.Variable("a", dtype=np.float32, shape=[1]), gs.Variable("b", dtype=np.float32, shape=[1])
        return gs.Graph(nodes=[gs.Node("TransData", inputs=[a], outputs=[b], domain=domain)], inputs=[a], outputs=[b])

    def graph(attrs):
        x, y = gs.Variable("x", dtype=np.float32, shape=[1]), gs.Variable("y", dtype=np.float32, shape=[1])
        return gs.Graph(nodes=[gs.Node("Custom", inputs=[x], outputs=[y], attrs=attrs)], inputs=[x], outputs=[y])

    assert not _holds_device_ops(graph({"k": 1}))
    assert not _holds_device_ops(graph({"then_branch": body("other.domain")}))
    assert _holds_device_ops(graph({"then_branch": body(DOMAIN)}))
    assert _holds_device_ops(graph({"bodies": [body("other.domain"), body(DOMAIN)]}))


def test_save_writes_only_the_kept_value_info_where_no_expansion_reads_it(tmp_path, monkeypatch):
    """save writes value_info only for what its pruning keeps unless a device op whose portable
    form reads declared shapes (attention) is in the graph: the other device ops (fused convs,
    TransData) give the same bytes as writing every value_info and pruning after."""
    from graphpass.ir import serialize
    from graphpass.ir.graph import iter_graphs

    data = Path(__file__).resolve().parents[1] / "data" / "exporters"
    reads = serialize._SHAPE_READING_DEVICE_OPS
    kinds = set()
    for name, target in (("resnet18.dynamo.onnx", "ascend910a"), ("mobilenet_v3_small.torchscript.onnx", "ascend910a"),
                         ("vad_control_flow.dynamo.onnx", "ascend910a"), ("llama_static.dynamo.onnx", "ascend910b2"),
                         ("gpt2.dynamo.onnx", "ascend910b2")):
        m = gp.optimize(gp.load(str(data / name)), target=target).model
        ops = {n.op for g in iter_graphs(m.graph) for n in g.nodes if n.domain == DOMAIN}
        kinds.add("attention" if ops & reads else "device" if ops else "none")
        outs = []
        for reading in (reads, None):  # None: every device op reads (as before)
            monkeypatch.setattr(serialize, "_SHAPE_READING_DEVICE_OPS", reading)
            out = tmp_path / f"{name}.{reading is None}.onnx"
            gp.save(m, out, external_data=False)
            outs.append(out.read_bytes())
        assert outs[0] == outs[1], name
    assert {"device", "attention"} <= kinds
