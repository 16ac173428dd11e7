"""eliminate_transdata: inverse pairs, chains, fan-out duplicates, weights, moving through ops."""

import numpy as np
from onnx import helper

import graphpass as gp
from graphpass.cost_model import create
from graphpass.passes.framework.context import PassContext
from graphpass.ir import annotations as A
from graphpass.ir.device_ops import DOMAIN, is_transdata, transdata_function
from graphpass.passes import eliminate_transdata
from graphpass.testing import assert_equivalent, make_model

CM = create("ascend910a")


def _td(x, y, src, dst):
    return helper.make_node("TransData", [x], [y], domain=DOMAIN, src_format=src, dst_format=dst)


def _model(nodes, inputs, outputs, inits=None):
    return make_model(nodes, inputs, outputs, initializers=inits, functions=[transdata_function(17)],
                      extra_opsets={DOMAIN: 1})


def _run(model):
    graph = gp.load(model).graph
    res = eliminate_transdata(graph, PassContext(target="ascend910a"))
    assert_equivalent(model, gp.to_proto(graph), exact=True)
    assert_equivalent(model, gp.to_proto(graph, emit="portable"), exact=True)
    return graph, res


def _pairs(graph):
    return [(n.attrs["src_format"], n.attrs["dst_format"]) for n in graph.nodes if is_transdata(n)]


X = {"x": [1, 32, 8, 8]}
Y = {"y": [1, 32, 8, 8]}


def test_inverse_pair_cancels():
    model = _model([helper.make_node("Relu", ["x"], ["r"]), _td("r", "a", "ND", "NC1HWC0"), _td("a", "b", "NC1HWC0", "ND"),
                    helper.make_node("Neg", ["b"], ["y"])], X, Y)
    graph, res = _run(model)
    assert res.stats["inverse_pairs"] == 1 and not _pairs(graph)
    assert [n.op for n in graph.nodes] == ["Relu", "Neg"]


def test_chain_composes_and_duplicates_on_fan_out_merge():
    model = _model([helper.make_node("Relu", ["x"], ["r"]), _td("r", "a", "ND", "NC1HWC0"),
                    _td("a", "b", "NC1HWC0", "FRACTAL_NZ"), _td("r", "c", "ND", "NHWC"), _td("r", "d", "ND", "NHWC"),
                    helper.make_node("Add", ["c", "d"], ["s"]), helper.make_node("Add", ["s", "b"], ["y"])], X, Y)
    graph, res = _run(model)
    assert res.stats["chains"] == 1 and res.stats["duplicates"] == 1
    assert sorted(_pairs(graph)) == [("ND", "FRACTAL_NZ"), ("ND", "NHWC")]


def test_weights_convert_at_compile_time():
    w = np.random.default_rng(0).standard_normal((1, 32, 1, 1)).astype(np.float32)
    model = _model([_td("w", "w5", "ND", "NC1HWC0"), helper.make_node("Add", ["x", "w5"], ["y"])], X, Y, {"w": w})
    graph, res = _run(model)
    assert res.stats["weights"] == 1 and not _pairs(graph)
    assert A.get_format(graph.nodes[0].inputs[1]) == "NC1HWC0"


def test_conversion_moves_through_a_format_agnostic_op():
    """TransData(5HD->ND) -> Relu -> TransData(ND->5HD) between two Convs: the Relu runs in 5HD."""
    w = np.random.default_rng(1).standard_normal((32, 32, 1, 1)).astype(np.float32) * 0.1
    model = _model([_td("x", "x5", "ND", "NC1HWC0"), helper.make_node("Conv", ["x5", "w"], ["c"], kernel_shape=[1, 1]),
                    _td("c", "cn", "NC1HWC0", "ND"), helper.make_node("Relu", ["cn"], ["r"]),
                    _td("r", "r5", "ND", "NC1HWC0"), helper.make_node("Conv", ["r5", "w"], ["c2"], kernel_shape=[1, 1]),
                    _td("c2", "y", "NC1HWC0", "ND")], X, Y, {"w": w})
    graph, res = _run(model)
    assert res.stats["moved_through"] == 1
    assert _pairs(graph) == [("ND", "NC1HWC0"), ("NC1HWC0", "ND")]
    relu = next(n for n in graph.nodes if n.op == "Relu")
    assert A.get_format(relu.outputs[0]) == "NC1HWC0"
    assert CM.estimate(graph).transdata["implicit"] == 0


def test_does_not_fire_on_needed_conversions_or_graph_outputs():
    model = _model([helper.make_node("Relu", ["x"], ["r"]), _td("r", "a", "ND", "NC1HWC0"),
                    helper.make_node("Neg", ["a"], ["n"]), _td("n", "y", "NC1HWC0", "ND")], X, Y)
    graph, res = _run(model)
    assert not res.modified and len(_pairs(graph)) == 2
    # a Reshape between the pair is not format-agnostic: nothing moves through it
    model = _model([_td("x", "a", "ND", "NC1HWC0"), _td("a", "b", "NC1HWC0", "ND"),
                    helper.make_node("Reshape", ["b", "s"], ["t"]), _td("t", "t5", "ND", "NC1HWC0"),
                    helper.make_node("Relu", ["t5"], ["u"]), _td("u", "y", "NC1HWC0", "ND")], X, Y,
                   {"s": np.array([1, 32, 8, 8], np.int64)})
    graph, res = _run(model)
    assert res.stats["inverse_pairs"] == 1 and res.stats["moved_through"] == 0
    assert any(n.op == "Reshape" for n in graph.nodes)


def _move_through_model():
    w = np.random.default_rng(1).standard_normal((32, 32, 1, 1)).astype(np.float32) * 0.1
    return _model([_td("x", "x5", "ND", "NC1HWC0"), helper.make_node("Conv", ["x5", "w"], ["c"], kernel_shape=[1, 1]),
                   _td("c", "cn", "NC1HWC0", "ND"), helper.make_node("Relu", ["cn"], ["r"]),
                   _td("r", "r5", "ND", "NC1HWC0"), helper.make_node("Conv", ["r5", "w"], ["c2"], kernel_shape=[1, 1]),
                   _td("c2", "y", "NC1HWC0", "ND")], X, Y, {"w": w})


def test_without_an_active_cost_model_nothing_moves_through():
    # moving a conversion through an op is a cost decision: with no model (or target none) the
    # other rules still run, this one does not
    from graphpass.cost_model.base import NullCostModel

    model = _move_through_model()
    for ctx in (PassContext(), PassContext(cost_model=NullCostModel())):
        graph = gp.load(model).graph
        res = eliminate_transdata(graph, ctx)
        assert res.stats["moved_through"] == 0 and len(_pairs(graph)) == 4
        assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_a_duplicate_conversion_that_is_a_graph_output_is_kept():
    # two ND->NHWC conversions of r; one of them is the graph output y2: it keeps its TransData
    model = _model([helper.make_node("Relu", ["x"], ["r"]), _td("r", "a", "ND", "NHWC"), helper.make_node("Neg", ["a"], ["y"]),
                    _td("r", "y2", "ND", "NHWC")], X, {**Y, "y2": [1, 32, 8, 8]})
    graph, res = _run(model)
    assert res.stats["duplicates"] == 0 and len(_pairs(graph)) == 2
    assert [t.name for t in graph.outputs] == ["y", "y2"] and is_transdata(graph.outputs[1].inputs[0])


def test_only_nd_and_5hd_conversions_move_through():
    # the same sandwich with FRACTAL_NZ instead of NC1HWC0 stays as it is
    model = _model([helper.make_node("Relu", ["x"], ["c"]),
                    _td("c", "cn", "FRACTAL_NZ", "ND"), helper.make_node("Relu", ["cn"], ["r"]),
                    _td("r", "r5", "ND", "FRACTAL_NZ"), helper.make_node("Neg", ["r5"], ["y"])], X, Y)
    graph, res = _run(model)
    assert res.stats["moved_through"] == 0 and len(_pairs(graph)) == 2


def test_a_weight_two_readers_want_in_different_formats_gets_neither():
    # one weight, converted to 5HD for one reader and to NHWC for another: stored once, it can
    # take neither format (each conversion still happens at compile time)
    w = np.random.default_rng(0).standard_normal((1, 32, 1, 1)).astype(np.float32)
    model = _model([_td("w", "w5", "ND", "NC1HWC0"), _td("w", "wh", "ND", "NHWC"),
                    helper.make_node("Add", ["x", "w5"], ["s"]), helper.make_node("Add", ["s", "wh"], ["y"])],
                   X, Y, {"w": w})
    graph, res = _run(model)
    assert res.stats["weights"] == 2 and not _pairs(graph)
    weight = graph.nodes[0].inputs[1]
    assert weight.name == "w" and A.get_format(weight) in (None, "ND")


def test_a_weight_every_reader_wants_in_one_format_takes_it():
    # two conversions of one weight, both to 5HD: the weight is stored in 5HD once
    w = np.random.default_rng(0).standard_normal((1, 32, 1, 1)).astype(np.float32)
    model = _model([_td("w", "w5", "ND", "NC1HWC0"), _td("w", "w6", "ND", "NC1HWC0"),
                    helper.make_node("Add", ["x", "w5"], ["s"]), helper.make_node("Add", ["s", "w6"], ["y"])],
                   X, Y, {"w": w})
    graph, res = _run(model)
    assert res.stats["weights"] == 2 and not _pairs(graph)
    assert A.get_format(graph.nodes[0].inputs[1]) == "NC1HWC0"


# --- the mutation run's survivors (README "Mutation testing") -------------------------------------

def test_a_transdata_nobody_reads_goes():
    model = _model([helper.make_node("Relu", ["x"], ["y"]), _td("y", "unused", "ND", "NC1HWC0")], X, Y)
    graph, res = _run(model)
    assert res.modified and res.stats["dead"] == 1 and sum(res.stats.values()) == 1
    assert [n.op for n in graph.nodes] == ["Relu"]


def test_a_transdata_to_its_own_format_goes():
    # NCHW and ND are one format: the conversion is an identity
    model = _model([helper.make_node("Relu", ["x"], ["r"]), _td("r", "a", "NCHW", "ND"), helper.make_node("Neg", ["a"], ["y"])],
                   X, Y)
    graph, res = _run(model)
    assert res.stats["inverse_pairs"] == 1 and sum(res.stats.values()) == 1
    assert [n.op for n in graph.nodes] == ["Relu", "Neg"] and graph.nodes[1].inputs[0] is graph.nodes[0].outputs[0]


def test_moving_through_drops_the_first_conversion_in_the_same_sweep():
    graph, res = _run(_move_through_model())
    assert res.stats["moved_through"] == 1 and res.stats["dead"] == 0  # not left for a later sweep as dead


def _sandwich(op_nodes, outputs=Y):
    w = np.ones((32, 32, 1, 1), np.float32)
    return _model([_td("x", "x5", "ND", "NC1HWC0"), helper.make_node("Conv", ["x5", "w"], ["c"], kernel_shape=[1, 1]),
                   _td("c", "cn", "NC1HWC0", "ND"), *op_nodes,
                   _td("r", "r5", "ND", "NC1HWC0"), helper.make_node("Conv", ["r5", "w"], ["c2"], kernel_shape=[1, 1]),
                   _td("c2", "y", "NC1HWC0", "ND")], X, outputs, {"w": w})


def test_nothing_moves_through_an_op_of_two_runtime_inputs_or_one_writing_a_graph_output():
    # Add(cn, x): its other input x stays ND, so the Add cannot run in 5HD; Relu -> r also a graph
    # output: r must stay ND
    two_inputs = _sandwich([helper.make_node("Add", ["cn", "x"], ["r"])])
    output = _sandwich([helper.make_node("Relu", ["cn"], ["r"])], outputs={**Y, "r": [1, 32, 8, 8]})
    for model in (two_inputs, output):
        graph, res = _run(model)
        assert res.stats["moved_through"] == 0 and len(_pairs(graph)) == 4


def test_an_op_dearer_in_the_source_format_than_the_two_conversions_stays_between_them(monkeypatch):
    # the shipped cost data never prices a one-input op so (a TransData costs about what the
    # padding adds to the op): a cost model that does must keep the sandwich
    from graphpass.cost_model.formats import FormatOracle

    node_us = FormatOracle.node_us
    for five_hd_price, moved in ((1000.0, 0), (None, 1)):
        def priced(self, node, role, five_hd, _p=five_hd_price):
            if node.op == "Relu" and five_hd and _p is not None:
                return _p
            return node_us(self, node, role, five_hd)

        monkeypatch.setattr(FormatOracle, "node_us", priced)
        graph, res = _run(_move_through_model())
        assert res.stats["moved_through"] == moved and len(_pairs(graph)) == 4 - 2 * moved
