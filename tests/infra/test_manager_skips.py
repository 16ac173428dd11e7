"""The pass manager's declared skips: an idempotent pass is not run on a version only it made; a
pass whose finding of nothing survives an edit (``PassResult.survives``) is not run after a pass
made only that edit (``PassResult.edit``). Each skip may only leave out an application that would
have changed nothing: GRAPHPASS_CHECK_SKIPS runs them anyway and raises when one changes the graph,
and the written models are byte-identical with and without the skips."""

import sys
from pathlib import Path

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from onnx import helper

import graphpass as gp
from graphpass.ir.graph import fingerprint
from graphpass.passes.cleanup.eliminate_common_subexpressions import EliminateCommonSubexpressions
from graphpass.passes.cleanup.eliminate_dead_nodes import EliminateDeadNodes
from graphpass.passes.framework import Pass, PassContext, PassKind, PassManager, PassResult
from graphpass.passes.framework.pass_base import MERGE_EQUAL_CONSTANTS, PassContractError
from graphpass.passes.framework.registry import all_passes
from graphpass.testing import make_model
from toy_passes import chain_model

EXPORTERS = Path(__file__).resolve().parents[1] / "data" / "exporters"


@pytest.fixture(autouse=True)
def _no_check(monkeypatch):
    """The toy passes count their runs: the suite's check of every skip (which runs the pass) is
    off here but where a test turns it on."""
    monkeypatch.setenv("GRAPHPASS_CHECK_SKIPS", "0")


def _counting(name, *, changes=(), edit=None, survives=frozenset(), idempotent=False, runs=None):
    """A pass that renames the first node on the runs numbered in ``changes`` (1-based)."""

    class Counting(Pass):
        summary = "records its runs"
        kind = PassKind.CLEANUP
        seen = 0

        def run(self, graph, ctx):
            type(self).seen += 1
            runs.append(self.name)
            if type(self).seen in changes:
                graph.nodes[0].name += "x"
                return PassResult(True, edit=edit)
            return PassResult(False, survives=survives)

    Counting.name = name
    Counting.idempotent = idempotent
    return Counting


def test_an_idempotent_pass_is_not_run_on_the_version_it_made():
    runs: list[str] = []
    graph = gp.load(chain_model()).graph
    # a changes on its first run; idempotent, it is not run again on what it made: one round only
    records = PassManager([_counting("a", changes=(1,), idempotent=True, runs=runs),
                           _counting("b", runs=runs)], max_rounds=4)(graph).records
    assert runs == ["a", "b"] and [r.round for r in records] == [1, 1]
    runs.clear()
    # the same pass not declared idempotent runs again in round 2 (and changes nothing)
    graph = gp.load(chain_model()).graph
    PassManager([_counting("a", changes=(1,), runs=runs), _counting("b", runs=runs)], max_rounds=4)(graph)
    assert runs == ["a", "b", "a"]


def test_a_finding_of_nothing_that_survives_an_edit_is_not_redone_after_it():
    runs: list[str] = []
    graph = gp.load(chain_model()).graph
    # a finds nothing and survives a merge of equal constants; b makes only that edit (once)
    PassManager([_counting("a", survives=frozenset({MERGE_EQUAL_CONSTANTS}), runs=runs),
                 _counting("b", changes=(1,), edit=MERGE_EQUAL_CONSTANTS, runs=runs)], max_rounds=4)(graph)
    assert runs == ["a", "b", "b"]  # round 2: a skipped, b runs on the version it made (not idempotent)


@pytest.mark.parametrize("edit, survives", [(None, {MERGE_EQUAL_CONSTANTS}), (MERGE_EQUAL_CONSTANTS, set()),
                                            ("some_other_edit", {MERGE_EQUAL_CONSTANTS})])
def test_any_other_edit_or_no_claim_runs_the_pass_again(edit, survives):
    runs: list[str] = []
    graph = gp.load(chain_model()).graph
    PassManager([_counting("a", survives=frozenset(survives), runs=runs),
                 _counting("b", changes=(1,), edit=edit, runs=runs)], max_rounds=4)(graph)
    assert runs == ["a", "b", "a", "b"]


def test_check_skips_catches_a_false_claim(monkeypatch):
    """A pass claiming to survive an edit that in fact enables it: GRAPHPASS_CHECK_SKIPS runs it
    where the manager skips it, and the change it makes is a PassContractError naming the claim."""

    class Enabled(Pass):  # fires once a node is named "ready", says it survives anything
        name = "enabled"
        summary = "claims too much"
        kind = PassKind.CLEANUP

        def run(self, graph, ctx):
            hit = [n for n in graph.nodes if n.name == "ready"]
            for n in hit:
                n.name = "done"
            return PassResult(bool(hit), survives=frozenset({MERGE_EQUAL_CONSTANTS}))

    class Namer(Pass):  # says its edit is a merge of equal constants: it is not
        name = "namer"
        summary = "misnames its edit"
        kind = PassKind.CLEANUP
        idempotent = True

        def run(self, graph, ctx):
            if graph.nodes[0].name == "ready" or graph.nodes[0].name == "done":
                return PassResult(False)
            graph.nodes[0].name = "ready"
            return PassResult(True, edit=MERGE_EQUAL_CONSTANTS)

    monkeypatch.setenv("GRAPHPASS_CHECK_SKIPS", "0")
    graph = gp.load(chain_model()).graph
    PassManager([Enabled, Namer], max_rounds=4)(graph)
    assert graph.nodes[0].name == "ready"  # skipped on the false claim: the rewrite was missed
    monkeypatch.setenv("GRAPHPASS_CHECK_SKIPS", "1")
    graph = gp.load(chain_model()).graph
    with pytest.raises(PassContractError, match="'enabled' changed a graph the pass manager skipped it on"):
        PassManager([Enabled, Namer], max_rounds=4)(graph)


def test_a_shape_refresh_ends_every_claim():
    """The manager's own shape refresh between rounds makes a new version no claim covers."""
    from graphpass.passes.framework import manager as M

    runs: list[str] = []
    graph = gp.load(chain_model()).graph
    graph.nodes[-1].outputs[0].shape = None  # an unresolved shape: the round's end refreshes it
    for n in graph.nodes:
        for t in n.outputs:
            t.shape = None
    mgr = PassManager([_counting("a", survives=frozenset({MERGE_EQUAL_CONSTANTS}), runs=runs),
                       _counting("b", changes=(1,), edit=MERGE_EQUAL_CONSTANTS, idempotent=True, runs=runs)],
                      max_rounds=4)
    assert M.count_unresolved(graph)
    mgr(graph)
    assert runs == ["a", "b", "a", "b"]  # round 2 ran after the refresh (round 1 changed, shapes were stale)


def _equal_constants_model():
    """Two Adds of equal (but distinct) constants, one of an unequal one (+0.0 against -0.0),
    then duplicate Muls of the Adds: CSE's both cases, in a chain."""
    f32 = np.float32
    inits = {"c1": np.array([1.0, -0.0, 2.0], f32), "c2": np.array([1.0, -0.0, 2.0], f32),
             "c3": np.array([1.0, 0.0, 2.0], f32)}
    nodes = [helper.make_node("Add", ["x", "c1"], ["a"]), helper.make_node("Add", ["x", "c2"], ["b"]),
             helper.make_node("Add", ["x", "c3"], ["c"]), helper.make_node("Mul", ["a", "a"], ["m1"]),
             helper.make_node("Mul", ["b", "b"], ["m2"]), helper.make_node("Sum", ["m1", "m2", "c"], ["y"])]
    return make_model(nodes, {"x": [3]}, {"y": [3]}, initializers=inits)


def test_cse_is_idempotent_and_names_no_edit_when_it_merged_nodes():
    graph = gp.load(_equal_constants_model()).graph
    first = EliminateCommonSubexpressions()(graph)
    assert first.modified and first.stats == {"constants_merged": 1, "nodes_merged": 2}
    assert first.edit is None  # nodes merged too: not a constants-only edit
    before = fingerprint(graph)
    again = EliminateCommonSubexpressions()(graph)
    assert not again.modified and fingerprint(graph) == before


def test_cse_names_the_edit_when_it_only_merged_constants():
    inits = {"c1": np.array([1.0, 2.0], np.float32), "c2": np.array([1.0, 2.0], np.float32)}
    model = make_model([helper.make_node("Add", ["x", "c1"], ["a"]), helper.make_node("Mul", ["x", "c2"], ["b"]),
                        helper.make_node("Sub", ["a", "b"], ["y"])], {"x": [2]}, {"y": [2]}, initializers=inits)
    graph = gp.load(model).graph
    result = EliminateCommonSubexpressions()(graph)
    assert result.stats == {"constants_merged": 1, "nodes_merged": 0} and result.edit == MERGE_EQUAL_CONSTANTS
    assert graph.nodes[0].inputs[1] is graph.nodes[1].inputs[1]


def test_the_cleanups_claims_after_nothing_found():
    """fold_constants, simplify_shapes, eliminate_identity and eliminate_dead_nodes, having found
    nothing, say they survive a merge of equal constants; fold_constants not when a node it could
    fold was there (refused: a merge may give it room to fold)."""
    from graphpass.passes.cleanup.eliminate_identity import EliminateIdentity
    from graphpass.passes.cleanup.fold_constants import FoldConstants
    from graphpass.passes.cleanup.simplify_shapes import SimplifyShapes

    inits = {"c1": np.array([1.0, 2.0], np.float32), "c2": np.array([1.0, 2.0], np.float32)}
    model = make_model([helper.make_node("Add", ["x", "c1"], ["a"]), helper.make_node("Mul", ["a", "c2"], ["y"])],
                       {"x": [2]}, {"y": [2]}, initializers=inits)
    graph = gp.load(model).graph
    for cls in (FoldConstants, SimplifyShapes, EliminateIdentity, EliminateDeadNodes):
        p = cls()
        result = p(graph)
        assert not result.modified and p.survives_edits(result) == {MERGE_EQUAL_CONSTANTS}, cls.name
    # a foldable node refused by the size policy: no claim
    big = {"c": np.arange(4096, dtype=np.float32).reshape(64, 64)}
    model = make_model([helper.make_node("Tile", ["c", "r"], ["t"]), helper.make_node("Add", ["x", "t"], ["y"])],
                       {"x": [128, 128]}, {"y": [128, 128]}, initializers={**big, "r": np.array([2, 2], np.int64)})
    graph = gp.load(model).graph
    result = FoldConstants()(graph)
    assert not result.modified and result.stats["would_grow"] and result.survives == frozenset()
    # an Identity refused (kept: it writes a graph output from a graph input): no claim
    graph = gp.load(make_model([helper.make_node("Identity", ["x"], ["y"])], {"x": [2]}, {"y": [2]})).graph
    p = EliminateIdentity()
    result = p(graph)
    assert not result.modified and p.survives_edits(result) == frozenset()


@pytest.mark.parametrize("path", sorted(EXPORTERS.glob("*.onnx")), ids=lambda p: p.stem)
def test_idempotent_cleanups_change_nothing_run_twice(path):
    """The passes that declare ``idempotent`` (CSE, dead nodes), on every exporter model, raw and
    after fold_batchnorm (which makes equal constants): the second run changes nothing."""
    graph = gp.load(path).graph
    ctx = PassContext()
    for stage in ([], ["fold_constants", "fold_batchnorm", "fuse_conv_activation"]):
        for name in stage:
            all_passes()[name]()(graph, ctx)
        for cls in (EliminateCommonSubexpressions, EliminateDeadNodes):
            assert cls.idempotent
            cls()(graph, ctx)
            before = fingerprint(graph)
            again = cls()(graph, ctx)
            assert not again.modified and fingerprint(graph) == before, (cls.name, again.stats)


def _no_declared_skips(monkeypatch):
    """No pass idempotent, no finding of nothing surviving an edit: every application runs."""
    monkeypatch.setenv("GRAPHPASS_CHECK_SKIPS", "0")
    monkeypatch.setattr(Pass, "survives_edits", lambda self, result: frozenset())
    for cls in all_passes().values():
        monkeypatch.setattr(cls, "idempotent", False)
        if "survives_edits" in cls.__dict__:
            monkeypatch.setattr(cls, "survives_edits", lambda self, result: frozenset())


def _optimize(src, out):
    result = gp.optimize(gp.load(src))
    gp.save(result.model, out)
    return [(r.round, r.name) for r in result.report.passes], out.read_bytes()


@pytest.mark.parametrize("name, fewer", [("resnet18.torchscript", False), ("vit.dynamo", False),
                                         ("vad_control_flow.dynamo", True), ("nms_detector.dynamo", True),
                                         ("whisper.dynamo", True)])
def test_declared_skips_leave_the_output_byte_identical(name, fewer, tmp_path, monkeypatch):
    """The default pipeline with the declared skips (checked: GRAPHPASS_CHECK_SKIPS) and without
    any writes the same bytes; where said, the skips left out some applications."""
    src = EXPORTERS / f"{name}.onnx"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.setenv("GRAPHPASS_CHECK_SKIPS", "1")
    skipped_runs, skipped = _optimize(src, tmp_path / "a" / "m.onnx")  # one name: external data is named after it
    _no_declared_skips(monkeypatch)
    full_runs, full = _optimize(src, tmp_path / "b" / "m.onnx")
    assert skipped == full
    assert set(skipped_runs) <= set(full_runs)
    assert (len(skipped_runs) < len(full_runs)) == fewer


def test_a_cnn_whose_folds_make_equal_constants_needs_no_third_round(tmp_path, monkeypatch):
    """The scaling benchmark's CNN: round 2's CSE merges the equal biases fold_batchnorm made;
    nothing before it can act on that (their findings survive it) and CSE is idempotent, so no
    third round runs; the written model is the one a run of every application writes."""
    sys.path.insert(0, str(EXPORTERS.parents[2] / "benchmarks"))
    try:
        from _synthetic import residual_stack
    finally:
        sys.path.pop(0)
    model = residual_stack(150, channels=8, hw=8, weight_scale=0.01)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.setenv("GRAPHPASS_CHECK_SKIPS", "1")
    skipped_runs, skipped = _optimize(model, tmp_path / "a" / "m.onnx")
    _no_declared_skips(monkeypatch)
    full_runs, full = _optimize(model, tmp_path / "b" / "m.onnx")
    assert skipped == full
    assert max(r for r, _ in skipped_runs) == 2
    assert [n for r, n in full_runs if r == 3] == ["fold_constants", "simplify_shapes", "eliminate_identity",
                                                   "eliminate_common_subexpressions"]
    assert [x for x in full_runs if x[0] < 3] == skipped_runs


@pytest.mark.parametrize("name", ["resnet18.torchscript", "vad_control_flow.dynamo", "vad_control_flow.torchscript",
                                  "llama.dynamo", "nms_detector.dynamo"])
def test_the_managers_walk_lists_the_graphs_and_op_types_all_graphs_does(name):
    """One walk of the main graph (op types and domains) when no node of it may hold a body: the
    same graphs, in the same order, and the same op types as all_graphs + op_types; after
    fusions made local functions too."""
    from graphpass.ir.graph import op_types
    from graphpass.ir.journal import all_graphs
    from graphpass.passes.framework.manager import _graphs_and_op_types

    graph = gp.load(EXPORTERS / f"{name}.onnx").graph
    for stage in ([], ["fold_batchnorm", "fuse_conv_activation", "fuse_attention", "fuse_layer_norm"]):
        for p in stage:
            all_passes()[p]()(graph, PassContext())
        graphs, ops = _graphs_and_op_types(graph)
        expected = all_graphs(graph)
        assert [id(g) for g in graphs] == [id(g) for g in expected]
        assert ops == op_types(graph, expected)
    if name == "resnet18.torchscript":
        assert graph.functions  # (FusedConvRelu's body: the functions' part of the walk ran)
