import pytest
import numpy as np
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.cost_model import create
from graphpass.passes.framework import PassContext
from graphpass.ir import annotations as A
from graphpass.passes import hoist_loop_invariants, place_and_sink
from graphpass.testing import assert_equivalent, make_model

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _tracking(host_op_reads_state: bool):
    """A tracking loop: each frame's state is updated by a device op; a host op (a cubic Resize, AI CPU on
    Ascend) either resizes the fixed template (invariant: can leave) or the loop-carried state."""
    resize_in = "state_in" if host_op_reads_state else "template"
    body = helper.make_graph(
        [helper.make_node("Resize", [resize_in, "", "scales"], ["big"], mode="cubic", name="resize"),
         helper.make_node("ReduceMean", ["big"], ["m"], axes=[2, 3], keepdims=1, name="pool"),
         helper.make_node("Add", ["state_in", "m"], ["s1"], name="update"),
         helper.make_node("Relu", ["s1"], ["state_out"], name="relu"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "frame",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("state_in", F, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("state_out", F, [1, 4, 8, 8])],
        # onnx cannot infer a Resize whose scales live in the outer graph: the shapes a converter writes
        value_info=[helper.make_tensor_value_info("big", F, [1, 4, 16, 16]), helper.make_tensor_value_info("m", F, [1, 4, 1, 1])],
    )
    return make_model([helper.make_node("Loop", ["frames", "", "x"], ["y"], body=body, name="track")],
                      {"x": [1, 4, 8, 8], "template": [1, 4, 8, 8]}, {"y": [1, 4, 8, 8]},
                      initializers={"frames": np.array(10, np.int64), "scales": np.array([1, 1, 2, 2], np.float32)})


def test_invariant_host_op_leaves_and_the_loop_sinks():
    model = _tracking(host_op_reads_state=False)
    graph = gp.load(model).graph
    before = create().estimate(graph).total_us
    assert hoist_loop_invariants(graph).stats["hoisted"] >= 2  # Resize of the template, and its pooling
    ctx = PassContext(target="ascend910a")
    result = place_and_sink(graph, ctx)
    loop = next(n for n in graph.nodes if n.op == "Loop")
    assert result.stats["sunk"] == 1 and A.get(loop, A.SINK) == "device"
    resize = next(n for n in graph.nodes if n.op == "Resize")
    assert A.get_engine(resize) == "AICPU"
    assert any("runs on AICPU" in e.reason for e in ctx.explanations)
    assert create().estimate(graph).total_us < before
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_host_op_on_the_loop_state_blocks_sinking_and_is_named():
    graph = gp.load(_tracking(host_op_reads_state=True)).graph
    hoist_loop_invariants(graph)
    ctx = PassContext(target="ascend910a")
    result = place_and_sink(graph, ctx)
    assert result.stats["not_sunk"] == 1
    assert any("cannot sink: Resize 'resize' runs on AICPU" in e.reason for e in ctx.explanations)
    assert A.get(graph.nodes[-1], A.SINK) is None


def test_siammask_tracking_example_hoists_sinks_and_stays_equal():
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
    import siammask_tracking

    from graphpass.check import verify as V

    model = siammask_tracking.build()
    result = gp.optimize(model)
    loop = next(n for n in result.graph.nodes if n.op == "Loop")
    assert A.get(loop, A.SINK) == "device"
    assert "Resize" in {n.op for n in result.graph.nodes}  # the template's resize left the body
    # the original cannot run in onnxruntime (a TF op); the same pipeline without hoisting can
    reference = gp.optimize(model, disable=["hoist_loop_invariants", "place_and_sink"])
    report = V.verify_models(gp.to_proto(reference.graph), gp.to_proto(result.graph), rtol=1e-5, atol=1e-6)
    assert report.ok
    assert create().estimate(result.graph).total_us < create().estimate(reference.graph).total_us


# --- issue 16: a loop sinks only when every shape in its body is static -----------------------------

def _topk_loop(state_shape=(8,)):
    """Each iteration sums the i+1 largest values of the state: TopK's output shape follows i (data)."""
    body = helper.make_graph(
        [helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", I64, [], [1])),
         helper.make_node("Constant", [], ["shape1"], value=helper.make_tensor("shape1", I64, [1], [1])),
         helper.make_node("Add", ["i", "one"], ["i1"], name="next_k"),
         helper.make_node("Reshape", ["i1", "shape1"], ["k"], name="k"),
         helper.make_node("TopK", ["state_in", "k"], ["top", "idx"], axis=-1, name="topk"),
         helper.make_node("ReduceSum", ["top"], ["s"], keepdims=1, name="sum"),
         helper.make_node("Add", ["state_in", "s"], ["state_out"], name="update"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, []),
                 helper.make_tensor_value_info("state_in", F, list(state_shape))],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("state_out", F, list(state_shape))])
    return make_model([helper.make_node("Loop", ["n", "", "x"], ["y"], body=body, name="loop")],
                      {"x": [8]}, {"y": [8]}, initializers={"n": np.array(4, np.int64)})


def test_a_data_dependent_shape_in_the_body_blocks_sinking():
    model = _topk_loop()
    graph = gp.load(model).graph
    topk = next(n for n in graph.nodes[-1].attrs["body"].nodes if n.op == "TopK")
    # 910B2: the body's int64 counter Add (i + 1) has an AI Core kernel there (on 910A it is AI CPU,
    # op_limits.toml [int64.Add], and would block the loop first)
    ctx = PassContext(target="ascend910b2")
    result = place_and_sink(graph, ctx)
    assert A.get_engine(topk) in (None, "AICORE")  # every node is on AI Core: only the shape blocks
    assert result.stats["not_sunk"] == 1 and result.stats["sunk"] == 0
    assert A.get(graph.nodes[-1], A.SINK) is None
    assert any("cannot sink: the shape of 'top'" in e.reason and "not static" in e.reason for e in ctx.explanations)


def test_an_int64_counter_add_runs_on_ai_cpu_on_910a_and_blocks_sinking():
    """TBE's Add takes no int64 on 910A (op_limits.toml [int64.Add]): the body's `i + 1` is AI CPU."""
    graph = gp.load(_topk_loop()).graph
    ctx = PassContext(target="ascend910a")
    assert place_and_sink(graph, ctx).stats["sunk"] == 0
    assert any("cannot sink: Add 'next_k' runs on AICPU" in e.reason for e in ctx.explanations)
    assert any("int64 Add has no AI Core kernel on ascend910a" in e.reason for e in ctx.explanations)


def test_a_symbolic_loop_carried_shape_blocks_sinking():
    model = _topk_loop()
    body = model.graph.node[0].attribute[0].g
    for n in list(body.node):
        if n.op_type in ("TopK", "ReduceSum"):
            body.node.remove(n)
    next(n for n in body.node if n.name == "update").input[1] = "state_in"
    body.input[2].type.tensor_type.shape.dim[0].dim_param = "L"
    body.output[1].type.tensor_type.shape.dim[0].dim_param = "L"
    graph = gp.load(model).graph
    ctx = PassContext(target="ascend910b2")  # the int64 counter Add runs on AI Core there (see above)
    assert place_and_sink(graph, ctx).stats["sunk"] == 0
    assert any("the shape of 'state_in' is not static" in e.reason for e in ctx.explanations)


def test_annotations_only_outputs_bit_for_bit_on_special_values():
    model = _tracking(host_op_reads_state=False)
    graph = gp.load(model).graph
    place_and_sink(graph, PassContext(target="ascend910a"))
    f = np.finfo(np.float32)
    pool = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, f.smallest_subnormal, f.max, -f.max, 1.0], np.float32)
    rng = np.random.default_rng(0)
    from graphpass.testing import ort_run

    feeds = {"x": rng.choice(pool, (1, 4, 8, 8)), "template": rng.choice(pool, (1, 4, 8, 8))}
    ref, got = ort_run(model, feeds), ort_run(gp.to_proto(graph), feeds)
    assert ref["y"].tobytes() == got["y"].tobytes() and np.isnan(ref["y"]).any()


def test_without_a_target_it_raises_instead_of_assuming_a_chip():
    # it used to build its own 910A cost model when the context had none, and place every node
    for ctx in (None, PassContext(), PassContext(target="none")):
        graph = gp.load(_tracking(host_op_reads_state=False)).graph
        with pytest.raises(gp.UsageError, match=r"^pass 'place_and_sink' needs a hardware target and the target is 'none'"):
            place_and_sink(graph) if ctx is None else place_and_sink(graph, ctx)
        assert not any(A.get_engine(n) for n in graph.nodes)


def test_a_pipeline_under_target_none_places_nothing_and_says_why():
    res = gp.optimize(_tracking(host_op_reads_state=False), target="none")
    assert "place_and_sink" not in [r.name for r in res.report.passes]
    assert "place_and_sink skipped: needs a hardware target (target 'none' has none)" in res.report.notes
    assert not any(A.get_engine(n) or A.get(n, A.SINK) for n in res.graph.nodes)
    placed = gp.optimize(_tracking(host_op_reads_state=False), target="ascend910b2")
    assert any(A.get_engine(n) for n in placed.graph.nodes)


def test_placement_reads_the_context_targets_op_table():
    import dataclasses

    from graphpass.cost_model import AscendCostModel, Target
    from graphpass.cost_model.op_info import OpTable

    base = Target.load("ascend910a")
    ops = dict(base.op_table.ops)
    ops["Resize"] = dataclasses.replace(ops["Resize"], engine="AICORE", modes=())  # a chip with an AI Core Resize in every mode
    table = OpTable(ops, base.op_table.path)
    model = AscendCostModel(base.profile, table)
    other = dataclasses.replace(base, name="test_chip", op_table=table, cost_model=model, _hardware=model)
    for target, engine in ((base, "AICPU"), (other, "AICORE")):
        graph = gp.load(_tracking(host_op_reads_state=True)).graph
        place_and_sink(graph, PassContext(target=target))
        resize = next(n for n in graph.nodes[-1].attrs["body"].nodes if n.op == "Resize")
        assert A.get_engine(resize) == engine


def test_modified_and_counts_follow_what_the_pass_changed():
    # first run: engines and the sink are new (modified); a second run changes nothing
    model = _tracking(host_op_reads_state=False)
    graph = gp.load(model).graph
    hoist_loop_invariants(graph)
    first = place_and_sink(graph, PassContext(target="ascend910a"))
    assert first.modified
    n_nodes = sum(1 for g in gp.ir.graph.iter_graphs(graph) for n in g.nodes
                  if A.get_engine(n) is not None)
    assert first.stats["AICORE"] + first.stats["AICPU"] + first.stats.get("HOST", 0) == n_nodes
    assert first.stats["AICPU"] == 1 and first.stats["HOST"] == 0  # the hoisted Resize
    assert first.stats["sunk"] == 1 and first.stats["not_sunk"] == 0
    assert first.stats["crossings"] == len(create().placement(graph)[1].crossings)
    second = place_and_sink(graph, PassContext(target="ascend910a"))
    assert not second.modified and second.stats["sunk"] == 1
    # only the sink annotation lost: setting it again is a change
    loop = next(n for n in graph.nodes if n.op == "Loop")
    A.set(loop, A.SINK, None)
    third = place_and_sink(graph, PassContext(target="ascend910a"))
    assert third.modified and A.get(loop, A.SINK) == "device"


def test_a_graph_without_loops_is_modified_by_its_engines_alone():
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], {"x": [1, 4]}, {"y": [1, 4]})
    graph = gp.load(model).graph
    result = place_and_sink(graph, PassContext(target="ascend910a"))
    assert result.modified and result.stats["AICORE"] == 1 and result.stats["sunk"] == 0
    assert A.get_engine(graph.nodes[0]) == "AICORE"
    assert not place_and_sink(graph, PassContext(target="ascend910a")).modified



def test_the_explanation_gives_the_op_tables_reason_when_there_is_one():
    # an op the op-info table does not know runs on AI CPU "unknown op"; a Relu has a kernel
    model = make_model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                        helper.make_node("Mystery", ["r"], ["y"], name="mystery", domain="com.example")],
                       {"x": [1, 4, 8, 8]}, {"y": [1, 4, 8, 8]}, extra_opsets={"com.example": 1})
    graph = gp.load(model).graph
    ctx = PassContext(target="ascend910a")
    result = place_and_sink(graph, ctx)
    assert result.stats["AICPU"] == 1 and result.stats["AICORE"] == 1
    assert [(e.node, e.reason) for e in ctx.explanations] == [("mystery", "runs on AICPU: unknown op: costed as AI CPU")]


# --- issue 22: the cost veto's walk is shared with place_and_sink -----------------------------

def _probe_pass(seen):
    """A scored pass that records ctx.placement against a fresh placement of the graph it runs on."""
    from graphpass.passes.framework import PassKind, PassResult
    from graphpass.passes.framework.pass_base import Pass

    class Probe(Pass):
        name = "probe_placement"
        kind = PassKind.PLACEMENT
        scored = True

        def run(self, graph, ctx):
            fresh, report = ctx.target.placement(graph, precision_mode=ctx.cost_options.get("precision_mode"))
            seen.append((ctx.placement, fresh, report.total_us))
            return PassResult(modified=False)

    return Probe()


def test_the_veto_hands_a_scored_pass_the_placement_of_the_graph_it_runs_on(monkeypatch):
    """After rewrites (a Loop hoisted, Identity removed) and in every round, ctx.placement is
    exactly what a fresh placement of the graph gives, and it is not there for unscored passes."""
    from graphpass.passes.framework.instruments import CostVeto
    from graphpass.passes.framework.manager import PassManager
    from graphpass.passes.framework.registry import get_pass

    seen = []
    graph = gp.load(_tracking(False)).graph
    ctx = PassContext(target="ascend910a")
    passes = [get_pass("eliminate_identity")(), get_pass("hoist_loop_invariants")(), _probe_pass(seen),
              get_pass("place_and_sink")(), _probe_pass(seen)]
    PassManager(passes, instruments=[CostVeto()])(graph, ctx)
    assert seen and all(shared is not None for shared, _, _ in seen)
    for (engines, report), fresh, total in seen:
        assert engines == fresh and report.total_us == pytest.approx(total, rel=0, abs=0)
    assert ctx.placement is None  # cleared after every application


def test_place_and_sink_in_a_pipeline_does_not_walk_the_graph_again(monkeypatch):
    """In optimize's pipeline place_and_sink takes the veto's engines (no placement walk of its
    own), and writes the same model as when it walks the graph itself (a veto given its target
    explicitly shares nothing)."""
    from graphpass.cost_model.target import Target
    from graphpass.passes.framework.instruments import CostVeto
    from graphpass.passes.framework.manager import PassManager
    from graphpass.passes.framework.registry import get_pass

    calls = []
    real = Target.placement

    def counting(self, graph, *a, **k):
        calls.append(1)
        return real(self, graph, *a, **k)

    monkeypatch.setattr(Target, "placement", counting)
    monkeypatch.setenv("GRAPHPASS_CHECK_SHARED_PLACEMENT", "0")
    shared = gp.optimize(_tracking(False), passes=["hoist_loop_invariants", "place_and_sink"], target="ascend910a")
    assert calls == [] and any(r.name == "place_and_sink" and r.modified for r in shared.report.passes)
    graph = gp.load(_tracking(False)).graph
    PassManager([get_pass("hoist_loop_invariants")(), get_pass("place_and_sink")()],
                instruments=[CostVeto(target="ascend910a")])(graph, PassContext(target="ascend910a"))
    assert calls, "with nothing shared place_and_sink walks the graph itself"
    assert gp.to_proto(shared.model, emit="device").SerializeToString() == gp.to_proto(graph, emit="device").SerializeToString()
