import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

import graphpass as gp
from graphpass.cost_model import CostModel, CostReport
from graphpass.errors import PassError, UsageError, VerificationError
from graphpass.passes.framework import ContractCheck, CostVeto, DumpIR, Pass, PassContext, PassKind, PassManager, PassResult, VerifyEach
from graphpass.passes.framework.pass_base import PassContractError
from graphpass.ir.graph import count_nodes
from graphpass.testing import assert_equivalent, make_model, ops
from toy_passes import BreakRelu, Liar, chain_model


class _Crash(Pass):
    name = "crash"
    summary = "raises"
    kind = PassKind.CLEANUP

    def run(self, graph, ctx):
        raise ValueError("boom")


def test_fixed_point_and_records():
    graph = gp.load(chain_model()).graph
    records = PassManager(["eliminate_dead_nodes", "eliminate_identity", "merge_transposes"])(graph).records
    assert ops(graph) == ["Relu", "Neg"]
    # round 2 changed nothing, so the loop stopped (only eliminate_dead_nodes ran in it: no
    # Identity or Transpose is left for the other two)
    assert [(r.name, r.round) for r in records if r.round == 2] == [("eliminate_dead_nodes", 2)]
    assert all(r.seconds >= 0 for r in records)
    changed = [r for r in records if r.modified]
    assert {r.name for r in changed} == {"eliminate_identity", "merge_transposes"}
    assert sum(r.nodes_before - r.nodes_after for r in records) == 3


def test_max_rounds_bounds_the_loop():
    class Toggle(Pass):
        name = "toggle"
        summary = "always changes something"
        kind = PassKind.CLEANUP

        def run(self, graph, ctx):
            n = graph.nodes[0]
            n.inputs[0], = [n.inputs[0]]
            graph.nodes = list(reversed(graph.nodes)) if len(graph.nodes) > 1 else graph.nodes
            return PassResult(True)

    graph = gp.load(chain_model()).graph
    records = PassManager([Toggle], max_rounds=3)(graph).records
    assert len(records) == 3


def test_a_pass_that_changed_nothing_is_not_run_again_on_the_same_graph():
    """The last round stops running passes at the one that saw the final graph already: a pass
    that changed nothing is run again only after something changed the graph."""
    runs: list[str] = []

    def counting(name, changes_in_round):
        class Counting(Pass):
            summary = "records its runs"
            kind = PassKind.CLEANUP
            rounds_seen = 0

            def run(self, graph, ctx):
                type(self).rounds_seen += 1
                runs.append(self.name)
                if type(self).rounds_seen in changes_in_round:
                    graph.nodes[0].name += "x"
                    return PassResult(True)
                return PassResult(False)

        Counting.name = name
        return Counting

    graph = gp.load(chain_model()).graph
    # a: never changes; b: changes on its first two runs; c: never changes
    records = PassManager([counting("a", ()), counting("b", (1, 2)), counting("c", ())], max_rounds=5)(graph).records
    # round 1: a b(change) c; round 2: a b(change) c; round 3: a b -- c already saw this graph
    assert runs == ["a", "b", "c", "a", "b", "c", "a", "b"]
    assert [r.round for r in records] == [1, 1, 1, 2, 2, 2, 3, 3]


def test_disabled_passes_are_skipped():
    graph = gp.load(chain_model()).graph
    mgr = PassManager(["eliminate_identity", "merge_transposes"], disabled={"merge_transposes"})
    assert mgr(graph).skipped == ["merge_transposes"] and ops(graph).count("Transpose") == 2


def test_unknown_pass_names_the_known_ones():
    with pytest.raises(UsageError, match="known passes: .*fold_constants"):
        PassManager(["fold_constantz"])


def test_exception_names_pass_and_history():
    graph = gp.load(chain_model()).graph
    with pytest.raises(PassError, match=r"pass 'crash' failed: ValueError: boom .*eliminate_identity"):
        PassManager(["eliminate_identity", _Crash])(graph)


def test_contract_modified_must_be_honest():
    graph = gp.load(chain_model()).graph
    with pytest.raises(PassError, match="modified=False"):
        PassManager([Liar], instruments=[ContractCheck()])(graph)
    with pytest.raises(PassContractError):
        Liar().apply(gp.load(chain_model()).graph, PassContext())


def test_verify_each_names_the_first_bad_pass():
    graph = gp.load(chain_model()).graph
    with pytest.raises(VerificationError, match="after pass 'break_relu'"):
        PassManager(["eliminate_identity", BreakRelu, "merge_transposes"], instruments=[VerifyEach()])(graph)


def test_dump_dir_numbers_changed_graphs(tmp_path):
    graph = gp.load(chain_model()).graph
    PassManager(["eliminate_identity", "fold_constants", "merge_transposes"], instruments=[DumpIR(tmp_path)])(graph)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["001_eliminate_identity.onnx", "002_merge_transposes.onnx"]


class _CountingModel(CostModel):
    """Cost = number of Neg nodes * 10 + number of nodes: makes Relu->Neg look worse."""

    target = "test"

    def estimate(self, graph, **kw):
        return CostReport("test", float(sum(10 for n in graph.nodes if n.op == "Neg") + count_nodes(graph)))


def test_cost_model_rolls_back_a_worse_rewrite_unless_required():
    model = chain_model()
    graph = gp.load(model).graph
    records = PassManager([BreakRelu, "eliminate_identity"], instruments=[CostVeto(_CountingModel())])(graph).records
    first = records[0]
    assert first.rolled_back and "rolled back" in first.note and first.cost_after_us > first.cost_before_us
    assert "Relu" in ops(graph)
    assert_equivalent(model, gp.to_proto(graph), exact=True)

    class RequiredBreak(BreakRelu):
        name = "required_break"
        required = True

    graph = gp.load(model).graph
    records = PassManager([RequiredBreak], instruments=[CostVeto(_CountingModel())])(graph).records
    assert not records[0].rolled_back and "Relu" not in ops(graph)

    class CleanupBreak(BreakRelu):  # cleanup passes are estimated but never vetoed
        name = "cleanup_break"
        kind = PassKind.CLEANUP

    graph = gp.load(model).graph
    records = PassManager([CleanupBreak], instruments=[CostVeto(_CountingModel())])(graph).records
    assert not records[0].rolled_back and records[0].cost_after_us > records[0].cost_before_us


def test_optimize_report_carries_ascend_estimates():
    import os

    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "models", "shufflenet_v2_x0_5.onnx")
    result = gp.optimize(example, target="ascend910a", input_shapes={"input": [1, 3, 224, 224]})
    rep = result.report
    assert rep.cost_before_us > rep.cost_after_us > 0  # the folded shape chains were runtime kernels
    applied = [r for r in rep.passes if r.modified]
    assert applied and all(r.cost_after_us is not None for r in applied)
    assert "estimated cost (cost model, not measured)" in rep.to_table()


def test_choose_picks_the_cheaper_alternative():
    from graphpass.cost_model import create

    cheap = gp.load(make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [1, 16, 8, 8]}, {"y": [1, 16, 8, 8]})).graph
    # two kernels that cannot UB-fuse (ATC would fuse a plain Relu -> Relu chain: issue 21)
    dear = gp.load(make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Transpose", ["a"], ["y"], perm=[0, 1, 3, 2])],
                              {"x": [1, 16, 8, 8]}, {"y": [1, 16, 8, 8]})).graph
    assert create("ascend910a").choose([dear, cheap]) == 1
    assert create("none").choose([dear, cheap]) == 0


def test_every_pass_is_a_plain_function():
    from graphpass import passes

    for name in gp.all_passes():
        fn = getattr(passes, name)
        assert callable(fn) and fn.__name__ == name
        assert name in passes.__all__


# -- property: the cleanup pipeline never changes what a graph computes -------------------

_UNARY = ["Relu", "Neg", "Exp", "Sigmoid", "Identity", "Abs"]


@st.composite
def _random_graph(draw):
    n = draw(st.integers(2, 12))
    nodes, avail = [], ["x"]
    inits = {}
    for i in range(n):
        kind = draw(st.sampled_from(["unary", "binary", "const_binary", "transpose_pair", "cast_pair", "dup"]))
        src = draw(st.sampled_from(avail))
        out = f"t{i}"
        if kind == "unary":
            nodes.append(helper.make_node(draw(st.sampled_from(_UNARY)), [src], [out]))
        elif kind == "binary":
            nodes.append(helper.make_node(draw(st.sampled_from(["Add", "Mul", "Sub"])), [src, draw(st.sampled_from(avail))], [out]))
        elif kind == "const_binary":
            c = f"c{i}"
            inits[c] = np.full((2, 3), draw(st.floats(-2, 2, width=32)), np.float32)
            nodes.append(helper.make_node("Add", [c, c], [f"{c}_sum"]))
            nodes.append(helper.make_node("Mul", [src, f"{c}_sum"], [out]))
        elif kind == "transpose_pair":
            nodes.append(helper.make_node("Transpose", [src], [f"{out}_t"], perm=[1, 0]))
            nodes.append(helper.make_node("Transpose", [f"{out}_t"], [out], perm=[1, 0]))
        elif kind == "cast_pair":
            to = draw(st.sampled_from([10, 11]))  # fp16 (lossy) or double (exact)
            nodes.append(helper.make_node("Cast", [src], [f"{out}_c"], to=to))
            nodes.append(helper.make_node("Cast", [f"{out}_c"], [out], to=1))
        else:
            nodes.append(helper.make_node("Sigmoid", [src], [f"{out}_a"]))
            nodes.append(helper.make_node("Sigmoid", [src], [f"{out}_b"]))
            nodes.append(helper.make_node("Add", [f"{out}_a", f"{out}_b"], [out]))
        avail.append(out)
    outs = draw(st.lists(st.sampled_from(avail[1:]), min_size=1, max_size=3, unique=True))
    return make_model(nodes, {"x": [2, 3]}, {o: [2, 3] for o in outs}, initializers=inits)


@settings(max_examples=60, deadline=None)
@given(_random_graph())
def test_cleanup_pipeline_preserves_outputs(model):
    before = count_nodes(gp.load(model).graph)
    result = gp.optimize(model)
    after = gp.to_proto(result.graph)
    assert count_nodes(result.graph) <= before
    assert_equivalent(model, after, rtol=1e-6, atol=1e-6)
    # idempotent: a second run changes nothing
    again = gp.optimize(result.graph)
    assert not any(r.modified for r in again.report.passes)


def test_optimize_report_has_the_iterations_per_loop_table(light_path):
    rep = gp.optimize(light_path("light_squeezenet.onnx")).report
    table = rep.iterations_per_loop
    assert list(table) == [1, 10, 100, 1000] and table[1000] < table[100] < table[10] < table[1]
    assert "iterations_per_loop (estimate per step)" in rep.to_table()
    assert "| iterations_per_loop |" in rep.to_markdown()


@pytest.mark.parametrize("name", ["resnet18.torchscript", "vit.dynamo", "vad_control_flow.torchscript"])
def test_passes_skipped_by_op_types_change_nothing(name, tmp_path, monkeypatch):
    """The manager skips a pass whose anchors (rules' anchor ops, ``anchor_ops``) are in no graph,
    body or function of the model: the output is byte-identical to running every pass, and some
    passes were in fact skipped."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "data" / "exporters" / f"{name}.onnx"

    def run(out):
        runs = []
        result = gp.optimize(gp.load(src), on_pass=lambda name, *rest: runs.append(name))
        gp.save(result.model, out)
        return runs, out.read_bytes()

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    skipped_runs, skipped = run(tmp_path / "a" / "m.onnx")  # one name: external data is named after it
    monkeypatch.setattr(Pass, "can_act", lambda self, ops, ctx: True)
    full_runs, full = run(tmp_path / "b" / "m.onnx")
    assert skipped == full
    assert len(skipped_runs) < len(full_runs) and set(skipped_runs) <= set(full_runs)
