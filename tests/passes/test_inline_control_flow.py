"""inline_control_flow: If with a constant condition, Loop with M=1 and cond true, inlined (exact)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import graphpass as gp
from graphpass.passes import inline_control_flow
from graphpass.passes.framework import PassContext
from graphpass.testing import assert_equivalent, check_full, make_model, ops, ort_run

#: float32 values that break things: NaN, infinities, signed zeros, a subnormal, the max
SPECIAL = np.array([[np.nan, np.inf, -np.inf], [-0.0, 1e-45, np.finfo(np.float32).max]], np.float32)


def _vi(name, elem=TP.FLOAT, shape=(2, 3)):
    return helper.make_tensor_value_info(name, elem, list(shape) if shape is not None else None)


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name + "_v"))


def _branch(nodes, outputs, name, initializers=()):
    return helper.make_graph(nodes, name, [], [_vi(o) for o in outputs], initializer=list(initializers))


def _if_model(cond, then_g, else_g, outputs=("y",), tail=True, cond_input=False):
    """x -> If(cond) -> y -> Relu -> z (or y itself the graph output with ``tail=False``)."""
    nodes = [] if cond_input else [_const("c", np.array(cond))]
    nodes.append(helper.make_node("If", ["c"], list(outputs), then_branch=then_g, else_branch=else_g, name="if"))
    if tail:
        nodes.append(helper.make_node("Relu", [outputs[0]], ["z"]))
    inputs = {"x": [2, 3]}
    if cond_input:
        inputs["c"] = (TP.BOOL, [])
    outs = {"z": [2, 3]} if tail else {o: [2, 3] for o in outputs}
    return make_model(nodes, inputs, outs, initializers={"w": np.arange(6, dtype=np.float32).reshape(2, 3)})


def _then_else():
    then_g = _branch([helper.make_node("Add", ["x", "w"], ["t1"]), helper.make_node("Neg", ["t1"], ["t2"])],
                     ["t2"], "then")
    else_g = _branch([helper.make_node("Sub", ["x", "w"], ["e1"])], ["e1"], "else")
    return then_g, else_g


def _inline(model, ctx=None):
    graph = gp.load(model).graph
    result = inline_control_flow(graph, ctx)
    return graph, result


@pytest.mark.parametrize("cond, expected", [(True, ["Add", "Neg", "Relu"]), (False, ["Sub", "Relu"])])
def test_constant_if_is_replaced_by_the_taken_branch(cond, expected):
    model = _if_model(cond, *_then_else())
    graph, result = _inline(model)
    assert result.modified and result.stats["if_inlined"] == 1
    assert [o for o in ops(graph) if o != "Constant"] == expected
    out = gp.to_proto(graph)
    assert all(len(a.g.node) == 0 for n in out.graph.node for a in n.attribute)  # no subgraph left
    assert_equivalent(model, out, feeds={"x": SPECIAL}, exact=True)


def test_the_moved_node_writes_the_if_output_itself():
    model = _if_model(True, *_then_else())
    graph, _ = _inline(model)
    neg = next(n for n in graph.nodes if n.op == "Neg")
    assert neg.outputs[0].name == "y"  # the If's output tensor, its name and type kept
    relu = next(n for n in graph.nodes if n.op == "Relu")
    assert relu.inputs[0] is neg.outputs[0]


def _same(got, want):
    """Bit for bit as far as values go: dtype, shape, NaN positions, the sign of every value."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want, equal_nan=True) and np.array_equal(np.signbit(got), np.signbit(want))


def test_if_outputs_that_are_graph_outputs_keep_their_names_and_types():
    # onnxruntime refuses a branch returning an outer value directly (it asks for an Identity), so
    # the original cannot run: the result is compared with what the If means
    then_g = _branch([helper.make_node("Abs", ["x"], ["a"])], ["a", "x"], "then")  # second output: a graph input
    else_g = _branch([helper.make_node("Neg", ["x"], ["n"])], ["n", "n"], "else")
    model = _if_model(True, then_g, else_g, outputs=("y1", "y2"), tail=False)
    graph, _ = _inline(model)
    out = gp.to_proto(graph)
    check_full(out)
    assert [o.name for o in out.graph.output] == ["y1", "y2"]
    assert all(o.type.tensor_type.elem_type == TP.FLOAT for o in out.graph.output)
    assert [o for o in ops(graph) if o != "Constant"] == ["Abs", "Identity"]  # y2 = x: an Identity keeps its name
    got = ort_run(out, {"x": SPECIAL})
    _same(got["y1"], np.abs(SPECIAL))
    _same(got["y2"], SPECIAL)


def test_else_branch_giving_one_tensor_to_two_outputs():
    # onnxruntime 1.2x gives zeros for the first of two If outputs that are one branch tensor (a
    # runtime bug): the reference is the same computation without the If
    then_g = _branch([helper.make_node("Abs", ["x"], ["a"])], ["a", "a"], "then")
    else_g = _branch([helper.make_node("Neg", ["x"], ["n"])], ["n", "n"], "else")
    model = _if_model(False, then_g, else_g, outputs=("y1", "y2"), tail=False)
    graph, _ = _inline(model)
    out = gp.to_proto(graph)
    check_full(out)
    got = ort_run(out, {"x": SPECIAL})
    _same(got["y1"], got["y2"])
    ref = ort_run(make_model([helper.make_node("Neg", ["x"], ["n"])], {"x": [2, 3]}, {"n": [2, 3]}), {"x": SPECIAL})
    _same(got["y1"], ref["n"])
    model = _if_model(False, then_g, else_g, outputs=("y1", "y2"), tail=True)
    graph, _ = _inline(model)
    got = ort_run(gp.to_proto(graph), {"x": SPECIAL})
    ref = ort_run(make_model([helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Relu", ["n"], ["z"])],
                             {"x": [2, 3]}, {"z": [2, 3]}), {"x": SPECIAL})
    _same(got["z"], ref["z"])


def test_branch_output_from_outer_scope_and_from_a_branch_initializer():
    then_g = _branch([], ["x"], "then")  # the branch returns an outer tensor as it is
    k = numpy_helper.from_array(np.full((2, 3), -0.0, np.float32), "k")
    else_g = _branch([], ["k"], "else", initializers=[k])  # ... or its own initializer
    for cond, want in ((True, SPECIAL), (False, np.full((2, 3), -0.0, np.float32))):
        for tail in (True, False):  # the If output read by a Relu, or a graph output itself
            model = _if_model(cond, then_g, else_g, tail=tail)
            graph, result = _inline(model)
            assert result.modified and "If" not in ops(graph)
            out = gp.to_proto(graph)
            check_full(out)
            assert [o.name for o in out.graph.output] == (["z"] if tail else ["y"])
            got = ort_run(out, {"x": SPECIAL})
            if tail:
                relu = make_model([helper.make_node("Relu", ["v"], ["z"])], {"v": [2, 3]}, {"z": [2, 3]})
                _same(got["z"], ort_run(relu, {"v": want})["z"])
            else:
                _same(got["y"], want)


def test_branch_names_that_clash_with_other_scopes_are_renamed():
    # two Ifs whose taken branches both define 't' and read a branch initializer 'k' (legal in
    # sibling scopes); inlined side by side they would clash
    def branch(op):
        k = numpy_helper.from_array(np.array([2.0], np.float32), "k")
        return helper.make_graph([helper.make_node(op, ["x", "k"], ["t"])], "b", [], [_vi("t")], initializer=[k])
    nodes = [_const("c", np.array(True)),
             helper.make_node("If", ["c"], ["y1"], then_branch=branch("Add"), else_branch=branch("Sub")),
             helper.make_node("If", ["c"], ["y2"], then_branch=branch("Mul"), else_branch=branch("Div")),
             helper.make_node("Relu", ["y1"], ["z1"]), helper.make_node("Relu", ["y2"], ["z2"])]
    model = make_model(nodes, {"x": [2, 3]}, {"z1": [2, 3], "z2": [2, 3]})
    check_full(model)
    graph, result = _inline(model)
    assert result.stats["if_inlined"] == 2 and result.stats["renamed"] >= 1
    out = gp.to_proto(graph)
    names = [t for n in out.graph.node for t in n.output] + [i.name for i in out.graph.initializer]
    assert len(names) == len(set(names))
    assert_equivalent(model, out, feeds={"x": SPECIAL}, exact=True)


def test_nested_subgraph_reading_a_renamed_branch_tensor_follows_it():
    inner_then = _branch([helper.make_node("Abs", ["t"], ["it"])], ["it"], "inner_then")
    inner_else = _branch([helper.make_node("Neg", ["t"], ["ie"])], ["ie"], "inner_else")
    then_g = _branch([helper.make_node("Add", ["x", "w"], ["t"]),
                      helper.make_node("If", ["d"], ["r"], then_branch=inner_then, else_branch=inner_else)],
                     ["r"], "then")
    else_g = _branch([helper.make_node("Neg", ["x"], ["e"])], ["e"], "else")
    nodes = [_const("c", np.array(True)), helper.make_node("Exp", ["x"], ["pre"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Add", ["y", "pre"], ["z"])]
    # a tensor named 't' outside, beside the branch's own 't': the branch's is renamed
    model = make_model(nodes + [helper.make_node("Sigmoid", ["x"], ["t_outer"])], {"x": [2, 3], "d": (TP.BOOL, [])},
                       {"z": [2, 3], "t_outer": [2, 3]}, initializers={"w": np.ones((2, 3), np.float32)})
    check_full(model)
    graph, result = _inline(model)
    assert result.stats["if_inlined"] == 1  # the inner If reads a graph input: stays
    assert ops(graph).count("If") == 1
    out = gp.to_proto(graph)
    for d in (True, False):
        assert_equivalent(model, out, feeds={"x": SPECIAL, "d": np.array(d)}, exact=True)


def test_clash_with_a_name_of_the_parent_is_renamed():
    # the untaken branch defines 'e'; a parent tensor is named 't' like the taken branch's
    then_g = _branch([helper.make_node("Add", ["x", "w"], ["t"])], ["t"], "then")
    else_g = _branch([helper.make_node("Neg", ["x"], ["e"])], ["e"], "else")
    nodes = [_const("c", np.array(True)), helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Add", ["y", "x"], ["z"])]
    model = make_model(nodes, {"x": [2, 3]}, {"z": [2, 3]}, initializers={"w": np.ones((2, 3), np.float32)})
    graph = gp.load(model).graph
    graph.outputs[0].name = "t"  # the graph output now named like the branch-local tensor (gs allows it)
    model2 = gp.to_proto(graph)
    graph2, result = _inline(model2)
    out = gp.to_proto(graph2)
    check_full(out)
    assert [o.name for o in out.graph.output] == ["t"]
    assert_equivalent(model2, out, feeds={"x": SPECIAL}, exact=True)


def test_if_with_a_condition_that_is_not_constant_is_left_and_explained():
    model = _if_model(True, *_then_else(), cond_input=True)
    ctx = PassContext()
    graph, result = _inline(model, ctx)
    assert not result.modified and "If" in ops(graph)
    assert any("condition is not a constant" in e.reason for e in ctx.explanations)


def test_if_in_a_pipeline_inlines_after_its_condition_folds():
    # cond = Less(2, 3): folds to true, then the If goes
    then_g, else_g = _then_else()
    nodes = [_const("a", np.array(2, np.int64)), _const("b", np.array(3, np.int64)),
             helper.make_node("Less", ["a", "b"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Relu", ["y"], ["z"])]
    model = make_model(nodes, {"x": [2, 3]}, {"z": [2, 3]}, initializers={"w": np.ones((2, 3), np.float32)})
    out = gp.optimize(model, pipeline="cleanup", target="none").model.to_proto()
    assert [n.op_type for n in out.graph.node] == ["Add", "Neg", "Relu"]
    assert_equivalent(model, out, feeds={"x": SPECIAL}, exact=True)


# -- Loop ------------------------------------------------------------------------------------------


def _loop_body(scan=True, extra=()):
    """body(i, cond_in, acc_in): acc_out = acc_in * w + Cast(i); scan s = acc_out - x; cond_out = cond_in."""
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT),
             helper.make_node("Mul", ["acc_in", "w"], ["m"]),
             helper.make_node("Add", ["m", "fi"], ["acc_out"]),
             helper.make_node("Identity", ["cond_in"], ["cond_out"]), *extra]
    outs = [_vi("cond_out", TP.BOOL, []), _vi("acc_out")]
    if scan:
        nodes.append(helper.make_node("Sub", ["acc_out", "x"], ["s"]))
        outs.append(_vi("s"))
    return helper.make_graph(nodes, "body", [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, []), _vi("acc_in")], outs)


def _loop_model(m, cond, scan=True, opset=17, body=None, outputs_are_graph_outputs=True):
    """Loop(M, cond, x); M / cond: a value (an initializer), None (absent) or "input" (a graph input)."""
    inits = {"w": np.full((2, 3), 0.5, np.float32)}
    inputs = {"x": [2, 3]}
    names = []
    for key, value, elem in (("M", m, TP.INT64), ("cond", cond, TP.BOOL)):
        if value is None:
            names.append("")
        elif isinstance(value, str):
            inputs[key] = (elem, [])
            names.append(key)
        else:
            inits[key] = np.array(value)
            names.append(key)
    loop_outs = ["acc", "stack"] if scan else ["acc"]
    nodes = [helper.make_node("Loop", names + ["x"], loop_outs, body=body or _loop_body(scan), name="loop")]
    outputs = {"acc": [2, 3]}
    if scan:
        outputs["stack"] = [None, 2, 3]
    if not outputs_are_graph_outputs:
        nodes += [helper.make_node("Abs", [o], [o + "_abs"]) for o in loop_outs]
        outputs = {o + "_abs": v for o, v in outputs.items()}
    return make_model(nodes, inputs, outputs, initializers=inits, opset=opset)


@pytest.mark.parametrize("cond", [True, None])
@pytest.mark.parametrize("opset", [11, 13, 17, 21])
def test_single_trip_loop_is_inlined(cond, opset):
    model = _loop_model(np.int64(1), cond, opset=opset)
    graph, result = _inline(model)
    assert result.modified and result.stats["loop_inlined"] == 1
    assert "Loop" not in ops(graph) and "Unsqueeze" in ops(graph)
    out = gp.to_proto(graph)
    assert [o.name for o in out.graph.output] == ["acc", "stack"]
    assert_equivalent(model, out, feeds={"x": SPECIAL}, exact=True)


def test_single_trip_loop_with_outputs_read_inside_the_graph():
    model = _loop_model(np.int64(1), True, outputs_are_graph_outputs=False)
    graph, _ = _inline(model)
    assert "Loop" not in ops(graph)
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIAL}, exact=True)


@pytest.mark.parametrize("m, cond, reason", [
    (np.int64(0), True, "not the constant 1"),
    (np.int64(2), True, "not the constant 1"),
    (np.int64(1), False, "condition at entry is false"),
    (np.int64(1), "input", "condition at entry is not a constant"),
    ("input", True, "not the constant 1"),
    (None, True, "not the constant 1"),
])
def test_loops_that_may_not_run_exactly_once_stay(m, cond, reason):
    model = _loop_model(m, cond)
    ctx = PassContext()
    graph, result = _inline(model, ctx)
    assert not result.modified and "Loop" in ops(graph)
    assert any(reason in e.reason for e in ctx.explanations), [e.reason for e in ctx.explanations]


@pytest.mark.parametrize("m, cond", [(0, True), (1, False), (1, "input"), (2, True)])
def test_pipeline_keeps_zero_trip_and_multi_trip_loops_exact(m, cond):
    model = _loop_model(np.int64(m), cond)
    out = gp.optimize(model, pipeline="neutral", target="none").model.to_proto()
    assert "Loop" in [n.op_type for n in out.graph.node]
    feeds = {"x": SPECIAL}
    if cond == "input":
        for c in (True, False):
            assert_equivalent(model, out, feeds={**feeds, "cond": np.array(c)}, exact=True)
    else:
        assert_equivalent(model, out, feeds=feeds, exact=True)


def test_loop_body_passing_carried_value_through_and_reading_the_iteration_number():
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT),
         helper.make_node("Add", ["x", "fi"], ["s"])],
        "body", [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, []), _vi("acc_in")],
        [_vi("cond_out", TP.BOOL, []), _vi("acc_in"), _vi("s")])  # acc passes through untouched
    model = _loop_model(np.int64(1), True, body=body)
    graph, result = _inline(model)
    assert result.modified
    out = gp.to_proto(graph)
    assert_equivalent(model, out, feeds={"x": SPECIAL}, exact=True)
    model = _loop_model(np.int64(1), True, body=body, outputs_are_graph_outputs=False)
    graph, _ = _inline(model)
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIAL}, exact=True)


def test_nested_if_in_a_single_trip_loop_is_inlined_too():
    then_g = _branch([helper.make_node("Neg", ["m"], ["nm"])], ["nm"], "then")
    else_g = _branch([helper.make_node("Abs", ["m"], ["am"])], ["am"], "else")
    extra = [_const("k", np.array(False)),
             helper.make_node("If", ["k"], ["picked"], then_branch=then_g, else_branch=else_g)]
    body = _loop_body(scan=False, extra=extra)
    body.output.append(_vi("picked"))  # a scan output from the inner If
    model = _loop_model(np.int64(1), True, scan=False, body=body)
    model.graph.node[0].output.append("stack")
    model.graph.output.append(_vi("stack", TP.FLOAT, [1, 2, 3]))
    check_full(model)
    graph, result = _inline(model)
    assert result.stats == {**result.stats, "if_inlined": 1, "loop_inlined": 1}
    assert not any(n.op in ("If", "Loop") for n in graph.nodes)
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIAL}, exact=True)


def test_nested_if_in_a_multi_trip_loop_is_inlined_inside_the_body():
    then_g = _branch([helper.make_node("Neg", ["m"], ["nm"])], ["nm"], "then")
    else_g = _branch([helper.make_node("Abs", ["m"], ["am"])], ["am"], "else")
    extra = [helper.make_node("If", ["k"], ["picked"], then_branch=then_g, else_branch=else_g)]
    body = _loop_body(scan=False, extra=extra)
    body.output.append(_vi("picked"))
    model = _loop_model(np.int64(3), True, scan=False, body=body)
    model.graph.initializer.append(numpy_helper.from_array(np.array(True), "k"))  # an outer-scope constant
    model.graph.node[0].output.append("stack")
    model.graph.output.append(_vi("stack", TP.FLOAT, [3, 2, 3]))
    check_full(model)
    graph, result = _inline(model)
    assert result.stats["if_inlined"] == 1 and result.stats["loop_inlined"] == 0
    loop = next(n for n in graph.nodes if n.op == "Loop")
    assert "If" not in [n.op for n in loop.attrs["body"].nodes]
    out = gp.to_proto(graph)
    assert_equivalent(model, out, feeds={"x": SPECIAL}, exact=True)


def test_if_inside_a_scan_body_is_inlined_and_scan_stays():
    then_g = helper.make_graph([helper.make_node("Neg", ["xi"], ["n"])], "then", [], [_vi("n", shape=[3])])
    else_g = helper.make_graph([helper.make_node("Abs", ["xi"], ["a"])], "else", [], [_vi("a", shape=[3])])
    body = helper.make_graph(
        [_const("k", np.array(True)), helper.make_node("Add", ["st_in", "xi"], ["st_out"]),
         helper.make_node("If", ["k"], ["y"], then_branch=then_g, else_branch=else_g)],
        "body", [_vi("st_in", TP.FLOAT, [3]), _vi("xi", TP.FLOAT, [3])],
        [_vi("st_out", TP.FLOAT, [3]), _vi("y", TP.FLOAT, [3])])
    model = make_model([helper.make_node("Scan", ["s0", "x"], ["sf", "ys"], body=body, num_scan_inputs=1)],
                       {"s0": [3], "x": [2, 3]}, {"sf": [3], "ys": [2, 3]})
    check_full(model)
    graph, result = _inline(model)
    assert result.stats["if_inlined"] == 1 and ops(graph) == ["Scan"]
    out = gp.to_proto(graph)
    assert_equivalent(model, out, feeds={"s0": np.array([-0.0, np.nan, 1], np.float32), "x": SPECIAL}, exact=True)


def test_scan_stays_exact_through_the_pipeline():
    then_g = helper.make_graph([helper.make_node("Neg", ["xi"], ["n"])], "then", [], [_vi("n", shape=[3])])
    else_g = helper.make_graph([helper.make_node("Abs", ["xi"], ["a"])], "else", [], [_vi("a", shape=[3])])
    body = helper.make_graph(
        [_const("k", np.array(False)), helper.make_node("If", ["k"], ["y"], then_branch=then_g, else_branch=else_g)],
        "body", [_vi("xi", TP.FLOAT, [3])], [_vi("y", TP.FLOAT, [3])])
    model = make_model([helper.make_node("Scan", ["x"], ["ys"], body=body, num_scan_inputs=1)],
                       {"x": [None, 3]}, {"ys": [None, 3]})
    out = gp.optimize(model, pipeline="neutral", target="none").model.to_proto()
    body = next(a.g for a in out.graph.node[0].attribute if a.name == "body")
    assert [n.op_type for n in body.node] == ["Abs"]
    # (0 rows: onnxruntime fails on the original Scan itself, "Invalid dim0_offset")
    assert_equivalent(model, out, feeds={"x": SPECIAL}, exact=True)


def test_full_pipeline_on_a_vad_shaped_model_leaves_no_control_flow():
    # the voice-activity shape of issue 20: an If on a constant flag (sample rate 16k?) whose
    # taken branch holds a single-trip Loop over a state, with Identity/Cast noise inside
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["h_in"], ["h1"]),
         helper.make_node("Cast", ["h1"], ["h2"], to=TP.DOUBLE), helper.make_node("Cast", ["h2"], ["h3"], to=TP.FLOAT),
         helper.make_node("MatMul", ["h3", "wl"], ["h4"]), helper.make_node("Tanh", ["h4"], ["h_out"])],
        "body", [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, []), _vi("h_in", TP.FLOAT, [1, 4])],
        [_vi("cond_out", TP.BOOL, []), _vi("h_out", TP.FLOAT, [1, 4])])
    then_g = helper.make_graph(
        [helper.make_node("Loop", ["one", "", "x"], ["h"], body=body)], "then", [], [_vi("h", TP.FLOAT, [1, 4])])
    else_g = _branch([helper.make_node("Neg", ["x"], ["e"])], [], "else")
    else_g.output.append(_vi("e", TP.FLOAT, [1, 4]))
    nodes = [helper.make_node("Equal", ["sr", "sr16"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Sigmoid", ["y"], ["p"])]
    model = make_model(nodes, {"x": [1, 4]}, {"p": [1, 4]},
                       initializers={"sr": np.array(16000, np.int64), "sr16": np.array(16000, np.int64),
                                     "one": np.array(1, np.int64),
                                     "wl": np.linspace(-1, 1, 16, dtype=np.float32).reshape(4, 4)})
    check_full(model)
    out = gp.optimize(model, pipeline="neutral", target="none").model.to_proto()
    assert [n.op_type for n in out.graph.node] == ["MatMul", "Tanh", "Sigmoid"]
    x = np.array([[np.nan, -np.inf, -0.0, 3.0]], np.float32)
    assert_equivalent(model, out, feeds={"x": x}, exact=True)


def test_if_with_branches_of_other_dtypes():
    for elem, dtype in ((TP.INT64, np.int64), (TP.BOOL, np.bool_), (TP.FLOAT16, np.float16), (TP.INT8, np.int8)):
        then_g = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [], [_vi("t", elem)])
        else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [_vi("e", elem)])
        model = make_model([_const("c", np.array([True])),
                            helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                           {"x": (elem, [2, 3])}, {"y": (elem, [2, 3])})
        graph, result = _inline(model)
        assert result.modified
        out = gp.to_proto(graph)
        assert out.graph.output[0].type.tensor_type.elem_type == elem
        x = np.arange(6).reshape(2, 3).astype(dtype)
        assert_equivalent(model, out, feeds={"x": x}, exact=True)


def test_empty_tensors_through_an_inlined_if():
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [], [_vi("t", shape=None)])
    else_g = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [], [_vi("e", shape=None)])
    model = make_model([_const("c", np.array(False)),
                        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                       {"x": [None, 3]}, {"y": [None, 3]})
    graph, result = _inline(model)
    assert result.modified and [o for o in ops(graph) if o != "Constant"] == ["Abs"]
    out = gp.to_proto(graph)
    for rows in (0, 2):
        assert_equivalent(model, out, feeds={"x": np.full((rows, 3), -0.0, np.float32)}, exact=True)


def test_a_branch_constant_that_range_refuses_as_an_initializer_keeps_an_identity():
    # the ONNX function of AffineGrid: If(is_2d) { D = one_1d } -> Range(0, D, 1). Range takes a
    # [1] tensor computed at run time but onnxruntime refuses it as an initializer at load
    one = numpy_helper.from_array(np.array([2], np.int64), "one_1d")
    then_g = helper.make_graph([], "then", [], [_vi("one_1d", TP.INT64, [1])], initializer=[one])
    else_g = helper.make_graph([helper.make_node("Identity", ["n"], ["e"])], "else", [], [_vi("e", TP.INT64, [1])])
    nodes = [_const("c", np.array(True)),
             helper.make_node("If", ["c"], ["d"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Range", ["z", "d", "o"], ["r"])]
    model = make_model(nodes, {"n": (TP.INT64, [1])}, {"r": (TP.INT64, [None])}, opset=20,
                       initializers={"z": np.array(0, np.int64), "o": np.array(1, np.int64)})
    graph, result = _inline(model)
    assert result.modified and [o for o in ops(graph) if o != "Constant"] == ["Identity", "Range"]
    out = gp.to_proto(graph)
    assert_equivalent(model, out, feeds={"n": np.array([5], np.int64)}, exact=True)
    # and the cleanup pipeline after it keeps it runnable
    out = gp.optimize(model, pipeline="cleanup", target="none").model.to_proto()
    assert_equivalent(model, out, feeds={"n": np.array([5], np.int64)}, exact=True)


def test_an_if_of_another_domain_is_not_touched():
    then_g, else_g = _then_else()
    nodes = [_const("c", np.array(True)),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, domain="custom.cf"),
             helper.make_node("Relu", ["y"], ["z"])]
    model = make_model(nodes, {"x": [2, 3]}, {"z": [2, 3]}, initializers={"w": np.ones((2, 3), np.float32)},
                       extra_opsets={"custom.cf": 1})
    graph, result = _inline(model)
    assert not result.modified and "If" in ops(graph)


def test_the_pass_runs_in_the_cleanup_pipeline_after_fold_constants():
    from graphpass.passes.pipelines import PIPELINES

    for name in ("cleanup", "neutral", "default"):
        names = PIPELINES[name]
        assert names.index("fold_constants") < names.index("inline_control_flow") < names.index("eliminate_dead_nodes")


@pytest.mark.parametrize("kind", ["loop", "if"])
def test_an_output_declared_with_a_wrong_rank_takes_the_shape_its_source_computes(kind):
    # the fuzzer found it: a Loop output declared as a scalar while the body gives [0]; nothing
    # checked the declaration while the Loop hid the shape, shape inference rejects it once inlined
    if kind == "loop":
        model = _loop_model(np.int64(1), None, scan=False)
    else:
        model = _if_model(False, *_then_else(), tail=False)
    del model.graph.output[0].type.tensor_type.shape.dim[:]  # declared rank 0
    if kind == "loop":
        check_full(model)  # (the If's own inference sees its branches: that original is invalid)
    graph, result = _inline(model)
    assert result.modified
    out = gp.to_proto(graph)
    check_full(out)
    assert [d.dim_value for d in out.graph.output[0].type.tensor_type.shape.dim] == [2, 3]
    assert_equivalent(model, out, feeds={"x": SPECIAL}, exact=True)


def test_one_branch_tensor_for_two_outputs_both_read_inside_the_graph():
    then_g = _branch([helper.make_node("Abs", ["x"], ["a"])], ["a", "a"], "then")
    else_g = _branch([helper.make_node("Neg", ["x"], ["n"])], ["n", "n"], "else")
    nodes = [_const("c", np.array(True)),
             helper.make_node("If", ["c"], ["y1", "y2"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Relu", ["y1"], ["z1"]), helper.make_node("Sigmoid", ["y2"], ["z2"])]
    model = make_model(nodes, {"x": [2, 3]}, {"z1": [2, 3], "z2": [2, 3]})
    graph, _ = _inline(model)
    abs_node = next(n for n in graph.nodes if n.op == "Abs")
    assert abs_node.outputs[0].name == "y1"
    assert {n.op for n in abs_node.outputs[0].outputs} == {"Relu", "Sigmoid"}  # y2's reader reads y1
    got = ort_run(gp.to_proto(graph), {"x": SPECIAL})
    ref = ort_run(make_model([helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["z1"]),
                              helper.make_node("Sigmoid", ["a"], ["z2"])], {"x": [2, 3]},
                             {"z1": [2, 3], "z2": [2, 3]}), {"x": SPECIAL})
    _same(got["z1"], ref["z1"])
    _same(got["z2"], ref["z2"])


def test_a_loop_body_tensor_both_carried_and_scanned():
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Mul", ["acc_in", "w"], ["m"])],
        "body", [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, []), _vi("acc_in")],
        [_vi("cond_out", TP.BOOL, []), _vi("m"), _vi("m")])  # m carried and scanned
    for graph_outputs in (True, False):
        model = _loop_model(np.int64(1), True, body=body, outputs_are_graph_outputs=graph_outputs)
        graph, result = _inline(model)
        assert result.modified and "Loop" not in ops(graph)
        assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIAL}, exact=True)


_VAD = __import__("pathlib").Path(__file__).parents[1] / "data" / "control_flow" / "vad_scripted.torchscript.onnx"


def _count(g):
    return len(g.node) + sum(_count(a.g) for n in g.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH)


def test_a_scripted_torch_export_loses_its_single_trip_loop_bit_for_bit():
    # a real TorchScript export (tests/data/control_flow/make_vad_scripted.py): an If on the sample
    # rate input, a Loop over range(batch) around an LSTM cell whose weights are sliced in the body.
    # 90 nodes (subgraphs counted); onnxslim 0.1.x leaves 18 and changes hn/cn by 1e-8 (it makes the
    # LSTM weights initializers, which onnxruntime prepacks)
    model = onnx.load(_VAD)
    assert _count(model.graph) == 90
    out = gp.optimize(model, pipeline="neutral", target="none").model.to_proto()
    assert "Loop" not in [n.op_type for n in out.graph.node]
    assert _count(out.graph) <= 18
    kept = gp.optimize(model, pipeline="neutral", target="none", disable=["inline_control_flow"]).model.to_proto()
    assert "Loop" in [n.op_type for n in kept.graph.node]
    for sr in (16000, 8000):
        for seed in range(2):
            feeds = {"x": np.random.default_rng(seed).standard_normal((1, 512)).astype(np.float32),
                     "h": np.full((1, 8), -0.0, np.float32), "c": np.zeros((1, 8), np.float32),
                     "sr": np.array(sr, np.int64)}
            assert_equivalent(model, out, feeds=feeds, exact=True)


def test_the_neutral_fusions_and_cleanups_run_inside_a_loop_that_stays():
    # a Loop with a runtime trip count (never inlined): Pad->Conv, Conv->BatchNormalization, an
    # Identity and a duplicate inside its body fuse/clean there, reading outer weights
    rng = np.random.default_rng(0)
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Pad", ["acc_in", "pads"], ["p"]),
         helper.make_node("Conv", ["p", "cw"], ["cv"]),
         helper.make_node("BatchNormalization", ["cv", "s", "b", "mu", "var"], ["bn"]),
         helper.make_node("Identity", ["bn"], ["bn_id"]),
         helper.make_node("MatMul", ["bn_id", "mw"], ["mm"]), helper.make_node("Add", ["mm", "mb"], ["ma"]),
         helper.make_node("Tanh", ["ma"], ["t1"]), helper.make_node("Tanh", ["ma"], ["t2"]),
         helper.make_node("Add", ["t1", "t2"], ["acc_out"])],
        "body", [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, []), _vi("acc_in", shape=[1, 2, 4, 4])],
        [_vi("cond_out", TP.BOOL, []), _vi("acc_out", shape=[1, 2, 4, 4])])
    inits = {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "cw": rng.standard_normal((2, 2, 3, 3)).astype(np.float32),
             "s": np.array([1.5, 0.5], np.float32), "b": np.array([0.1, -0.2], np.float32),
             "mu": np.array([0.3, 0.0], np.float32), "var": np.array([2.0, 1.0], np.float32),
             "mw": rng.standard_normal((4, 4)).astype(np.float32), "mb": rng.standard_normal(4).astype(np.float32)}
    model = make_model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)],
                       {"x": [1, 2, 4, 4], "M": (TP.INT64, [])}, {"y": [1, 2, 4, 4]}, initializers=inits)
    check_full(model)
    out = gp.optimize(model, pipeline="neutral", target="none").model.to_proto()
    body_ops = [n.op_type for n in next(a.g for a in out.graph.node[0].attribute if a.name == "body").node]
    # Pad and BN folded into the Conv, the Identity and the second Tanh gone (a 4-D MatMul stays: Gemm is 2-D)
    assert body_ops == ["Identity", "Conv", "MatMul", "Add", "Tanh", "Add"], body_ops
    for m in (0, 1, 2):
        assert_equivalent(model, out, feeds={"x": rng.standard_normal((1, 2, 4, 4)).astype(np.float32),
                                             "M": np.array(m, np.int64)}, rtol=1e-4, atol=1e-5)


def test_a_cast_pair_that_only_a_subgraph_would_read_keeps_its_if():
    # onnxruntime fails at run time ('Missing Input') on a Cast reading a Cast in a graph whose
    # result only a subgraph reads; inlining this If would build exactly that
    then_g = helper.make_graph([helper.make_node("Cast", ["x"], ["a"], to=TP.DOUBLE),
                                helper.make_node("Cast", ["a"], ["b"], to=TP.FLOAT)], "then", [], [_vi("b")])
    else_g = _branch([helper.make_node("Neg", ["x"], ["e"])], ["e"], "else")
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["acc_in", "y"], ["acc_out"])],
        "body", [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, []), _vi("acc_in")],
        [_vi("cond_out", TP.BOOL, []), _vi("acc_out")])
    model = make_model([_const("c", np.array(True)),
                        helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
                        helper.make_node("Loop", ["M", "", "x"], ["z"], body=body)],
                       {"x": [2, 3], "M": (TP.INT64, [])}, {"z": [2, 3]})
    ctx = PassContext()
    graph, result = _inline(model, ctx)
    assert not result.modified
    assert any("reads a Cast" in e.reason for e in ctx.explanations)
    out = gp.optimize(model, pipeline="neutral", target="none").model.to_proto()  # the pair goes first, then the If
    for m in (0, 2):
        assert_equivalent(model, out, feeds={"x": SPECIAL, "M": np.array(m, np.int64)}, exact=True)


def test_nested_constant_ifs_and_nested_single_trip_loops_all_go():
    inner_then = _branch([helper.make_node("Abs", ["x"], ["it"])], ["it"], "inner_then")
    inner_else = _branch([helper.make_node("Neg", ["x"], ["ie"])], ["ie"], "inner_else")
    outer_then = _branch([_const("k", np.array(False)),
                          helper.make_node("If", ["k"], ["r"], then_branch=inner_then, else_branch=inner_else),
                          helper.make_node("Sigmoid", ["r"], ["s"])], ["s"], "outer_then")
    outer_else = _branch([helper.make_node("Tanh", ["x"], ["e"])], ["e"], "outer_else")
    model = _if_model(True, outer_then, outer_else)
    graph, result = _inline(model)
    assert result.stats["if_inlined"] == 2
    assert [o for o in ops(graph) if o != "Constant"] == ["Neg", "Sigmoid", "Relu"]
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIAL}, exact=True)

    inner = helper.make_graph(
        [helper.make_node("Identity", ["c_in2"], ["c_out2"]), helper.make_node("Mul", ["a_in2", "w"], ["a_out2"]),
         helper.make_node("Sub", ["a_out2", "x"], ["s2"])],
        "inner", [_vi("i2", TP.INT64, []), _vi("c_in2", TP.BOOL, []), _vi("a_in2")],
        [_vi("c_out2", TP.BOOL, []), _vi("a_out2"), _vi("s2")])
    outer = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Loop", ["one", "", "acc_in"], ["acc_out", "st"], body=inner)],
        "outer", [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, []), _vi("acc_in")],
        [_vi("cond_out", TP.BOOL, []), _vi("acc_out"), _vi("st", shape=[1, 2, 3])])
    model = _loop_model(np.int64(1), True, body=outer)
    model.graph.initializer.append(numpy_helper.from_array(np.array(1, np.int64), "one"))
    model.graph.output[1].CopyFrom(_vi("stack", shape=[1, 1, 2, 3]))
    check_full(model)
    graph, result = _inline(model)
    assert result.stats["loop_inlined"] == 2 and "Loop" not in ops(graph)
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIAL}, exact=True)


def test_a_cond_of_shape_1_reaches_the_body_as_it_is():
    # onnxruntime feeds the Loop's cond to the body as it is: a [1] cond gives Shape(cond_in) = [1]
    # (a scalar true put in its place would give []); the inlined body reads the same tensor
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Shape", ["cond_in"], ["cs"]),
         helper.make_node("Identity", ["acc_in"], ["acc_out"])],
        "body", [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, None), _vi("acc_in")],
        [_vi("cond_out", TP.BOOL, None), _vi("acc_out"), _vi("cs", TP.INT64, [None])])
    model = make_model([helper.make_node("Loop", ["M", "cond", "x"], ["acc", "shapes"], body=body)],
                       {"x": [2, 3]}, {"acc": [2, 3], "shapes": (TP.INT64, [1, None])},
                       initializers={"M": np.array(1, np.int64), "cond": np.array([True])})
    ref = ort_run(model, {"x": SPECIAL})
    graph, result = _inline(model)
    assert result.modified
    got = ort_run(gp.to_proto(graph), {"x": SPECIAL})
    assert got["shapes"].shape == ref["shapes"].shape and np.array_equal(got["shapes"], ref["shapes"])
    _same(got["acc"], ref["acc"])


@pytest.mark.parametrize("i_shape", [[], [1]])
@pytest.mark.parametrize("cond", [np.array(True), None])
def test_the_iteration_number_and_an_absent_cond_reach_the_body_as_onnxruntime_feeds_them(cond, i_shape):
    # onnxruntime shapes them as the body declares them ([] or [1]; it refuses an undeclared one)
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Shape", ["i"], ["si"]),
         helper.make_node("Shape", ["cond_in"], ["sc"]), helper.make_node("Concat", ["si", "sc"], ["s"], axis=0),
         helper.make_node("Add", ["i", "i"], ["i2"]), helper.make_node("Identity", ["acc_in"], ["acc_out"])],
        "body", [_vi("i", TP.INT64, i_shape), _vi("cond_in", TP.BOOL, None if cond is not None else i_shape),
                 _vi("acc_in")],
        [_vi("cond_out", TP.BOOL, None), _vi("acc_out"), _vi("s", TP.INT64, [None]), _vi("i2", TP.INT64, None)])
    inits = {"M": np.array(1, np.int64)}
    if cond is not None:
        inits["cond"] = cond
    model = make_model([helper.make_node("Loop", ["M", "cond" if cond is not None else "", "x"], ["acc", "shapes", "iters"],
                                         body=body)],
                       {"x": [2, 3]}, {"acc": [2, 3], "shapes": (TP.INT64, [1, None]), "iters": (TP.INT64, None)},
                       initializers=inits)
    ref = ort_run(model, {"x": SPECIAL})
    graph, result = _inline(model)
    assert result.modified
    got = ort_run(gp.to_proto(graph), {"x": SPECIAL})
    for k in ("shapes", "iters"):
        assert got[k].shape == ref[k].shape and np.array_equal(got[k], ref[k]), k


def test_a_branch_output_written_by_a_constant_node_that_range_refuses_keeps_an_identity():
    # (attack branch) the AffineGrid function after simplify_shapes: the branch's D = Identity(one_1d)
    # became a Constant node; moved out, it would write the Range bound itself, and onnxruntime
    # makes a Constant node an initializer at load (conformance test_affine_grid_2d_expanded failed)
    then_g = helper.make_graph([_const("dc", np.array([2], np.int64))], "then", [], [_vi("dc", TP.INT64, [1])])
    else_g = helper.make_graph([helper.make_node("Identity", ["n"], ["e"])], "else", [], [_vi("e", TP.INT64, [1])])
    nodes = [_const("c", np.array(True)),
             helper.make_node("If", ["c"], ["d"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Range", ["z", "d", "o"], ["r"])]
    model = make_model(nodes, {"n": (TP.INT64, [1])}, {"r": (TP.INT64, [None])}, opset=20,
                       initializers={"z": np.array(0, np.int64), "o": np.array(1, np.int64)})
    graph, result = _inline(model)
    assert result.modified and "If" not in ops(graph) and "Identity" in ops(graph)
    assert_equivalent(model, gp.to_proto(graph), feeds={"n": np.array([5], np.int64)}, exact=True)
    out = gp.optimize(model, pipeline="cleanup", target="none").model.to_proto()
    assert_equivalent(model, out, feeds={"n": np.array([5], np.int64)}, exact=True)


# -- mutation survivors (benchmarks/mutation.py --passes inline_control_flow, issue 20) --------------

def test_stats_count_exactly_what_was_inlined_and_renamed():
    graph, result = _inline(_if_model(True, *_then_else()))
    assert result.stats == {"if_inlined": 1, "loop_inlined": 0, "renamed": 0}
    # a branch tensor named like a main-graph tensor ("z", the Relu's output) is renamed once
    then_g = _branch([helper.make_node("Add", ["x", "w"], ["z"]), helper.make_node("Neg", ["z"], ["t2"])], ["t2"], "then")
    model = _if_model(True, then_g, _then_else()[1])
    graph, result = _inline(model)
    assert result.stats == {"if_inlined": 1, "loop_inlined": 0, "renamed": 1}
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIAL}, exact=True)
    graph, result = _inline(make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]}))
    assert not result.modified and result.stats == {"if_inlined": 0, "loop_inlined": 0, "renamed": 0}


def test_a_loop_body_of_unknown_input_and_output_shapes_is_inlined():
    """The body's scan output has no static shape (a Reshape to a shape given at run time): the
    Unsqueeze that replaces the stacking gets no shape either. (A body declaring i or cond without
    a shape: onnxruntime refuses to run it, "Loop subgraph input 0 has unknown shape".)"""
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT), helper.make_node("Add", ["acc_in", "fi"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Reshape", ["acc_out", "r"], ["s"])],
        "body", [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, []), _vi("acc_in")],
        [_vi("cond_out", TP.BOOL, None), _vi("acc_out"), _vi("s", shape=None)])
    model = make_model([helper.make_node("Loop", ["M", "", "x"], ["acc", "stack"], body=body)],
                       {"x": [2, 3], "r": (TP.INT64, [2])}, {"acc": [2, 3], "stack": (TP.FLOAT, None)},
                       initializers={"M": np.array(1, np.int64)})
    graph, result = _inline(model)
    assert result.stats["loop_inlined"] == 1 and "Loop" not in ops(graph)
    out = gp.to_proto(graph)
    for r in ([3, 2], [6, 1]):
        got = assert_equivalent(model, out, feeds={"x": SPECIAL, "r": np.array(r, np.int64)}, exact=True)
        assert got["stack"].shape == (1, *r)


def test_an_if_branch_output_of_unknown_shape_or_of_another_static_shape_is_inlined():
    # unknown: a Reshape to a shape given at run time
    then_g = helper.make_graph([helper.make_node("Reshape", ["x", "r"], ["t"])], "then", [], [_vi("t", shape=None)])
    else_g = _branch([helper.make_node("Neg", ["x"], ["e"])], ["e"], "else")
    nodes = [_const("c", np.array(True)), helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    model = make_model(nodes, {"x": [2, 3], "r": (TP.INT64, [2])}, {"y": (TP.FLOAT, None)})
    graph, result = _inline(model)
    assert result.stats["if_inlined"] == 1 and [o for o in ops(graph) if o != "Constant"] == ["Reshape"]
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIAL, "r": np.array([3, 2], np.int64)}, exact=True)
    # another static shape of the same rank: the output declared [2, 3], the branch gives [3, 2]
    then_g = _branch([helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0])], ["t"], "then")
    then_g.output[0].type.tensor_type.shape.dim[0].dim_value, then_g.output[0].type.tensor_type.shape.dim[1].dim_value = 3, 2
    else_g = _branch([helper.make_node("Transpose", ["x"], ["e"], perm=[1, 0])], ["e"], "else")
    else_g.output[0].type.tensor_type.shape.dim[0].dim_value, else_g.output[0].type.tensor_type.shape.dim[1].dim_value = 3, 2
    nodes = [_const("c", np.array(True)), helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    model = make_model(nodes, {"x": [2, 3]}, {"y": [2, 3]})
    graph, result = _inline(model)
    assert result.stats["if_inlined"] == 1
    out = gp.to_proto(graph)
    check_full(out)
    assert [d.dim_value for d in out.graph.output[0].type.tensor_type.shape.dim] == [3, 2]
    assert_equivalent(model, out, feeds={"x": SPECIAL}, exact=True)


def test_a_cast_pair_in_a_branch_read_by_the_main_graph_is_inlined():
    """The refusal of test_a_cast_pair_that_only_a_subgraph_would_read_keeps_its_if is only for a
    pair whose result only a subgraph reads: read by a main-graph node, the If goes."""
    then_g = _branch([helper.make_node("Cast", ["x"], ["d"], to=TP.DOUBLE), helper.make_node("Cast", ["d"], ["t"], to=TP.FLOAT)],
                     ["t"], "then")
    model = _if_model(True, then_g, _then_else()[1])
    graph, result = _inline(model)
    assert result.stats["if_inlined"] == 1 and [o for o in ops(graph) if o != "Constant"] == ["Cast", "Cast", "Relu"]
    assert_equivalent(model, gp.to_proto(graph), feeds={"x": SPECIAL}, exact=True)
