"""The pass contract: ``pass_(model, ctx) -> PassResult(modified, stats, model)``, requires /
ensures, analysis passes, typed constructor options and the function form's signature."""

import inspect
import json

import numpy as np
import onnx
import pytest
from onnx import helper

import graphpass as gp
from graphpass.errors import PassError, UnsupportedError, UsageError
from graphpass.passes.framework import (
    Pass,
    PassContext,
    PassContractError,
    PassKind,
    PassManager,
    PassPostconditionError,
    PassPreconditionError,
    PassResult,
)
from graphpass.testing import make_model, ops


def _relu_model():
    return make_model([helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                      {"x": [2, 3]}, {"y": [2, 3]})


def _const_model():
    """y = x + (c + c): the constant Add folds unless the size limit forbids it."""
    c = np.ones((4, 4), np.float32)
    return make_model([helper.make_node("Add", ["c", "c"], ["cc"]), helper.make_node("Add", ["x", "cc"], ["y"])],
                      {"x": [4, 4]}, {"y": [4, 4]}, initializers={"c": c})


def _growing_model():
    """y = x + (c + c), z = x * c: c stays (z reads it), so folding c + c adds 256 bytes to the
    file: only with fold_growing, and only up to the size limit."""
    c = np.ones((8, 8), np.float32)
    return make_model([helper.make_node("Add", ["c", "c"], ["cc"]), helper.make_node("Add", ["x", "cc"], ["y"]),
                       helper.make_node("Mul", ["x", "c"], ["z"])],
                      {"x": [8, 8]}, {"y": [8, 8], "z": [8, 8]}, initializers={"c": c})


class _Holder:
    """Stands in for graphpass.ir.model.Model: anything with a ``graph`` attribute."""

    def __init__(self, graph):
        self.graph = graph


class _NeedsRelu(Pass):
    name = "needs_relu"
    summary = "refuses graphs without a Relu"
    kind = PassKind.CLEANUP
    ran = 0

    def requires(self, model):
        if "Relu" not in ops(model.graph if hasattr(model, "graph") else model):
            raise PassPreconditionError("needs_relu: the graph has no Relu")

    def run(self, graph, ctx):
        type(self).ran += 1
        return PassResult(False, {"seen": len(graph.nodes)})


class _LeavesIdentity(Pass):
    name = "leaves_identity"
    summary = "promises no Identity afterwards, but does nothing"
    kind = PassKind.CLEANUP

    def ensures(self, model):
        if "Identity" in ops(model.graph if hasattr(model, "graph") else model):
            raise PassPostconditionError("leaves_identity: an Identity is left")

    def run(self, graph, ctx):
        return PassResult(False)


def test_call_returns_the_result_with_the_model_it_was_given():
    graph = gp.load(_relu_model()).graph
    res = gp.get_pass("eliminate_identity")()(graph)
    assert isinstance(res, PassResult) and res.modified and res.model is graph
    assert ops(graph) == ["Relu"]
    holder = gp.load(_relu_model())  # a Model: the pass works on model.graph, in place
    res = gp.get_pass("eliminate_identity")()(holder, PassContext())
    assert res.model is holder and ops(holder.graph) == ["Relu"]


def test_call_refuses_what_is_not_a_model():
    with pytest.raises(TypeError, match="graphpass Model or an onnx_graphsurgeon Graph, not ModelProto"):
        gp.get_pass("eliminate_identity")()(_relu_model())


def test_old_positional_pass_result_still_works():
    res = PassResult(True, {"n": 1})
    assert res.modified and res.stats == {"n": 1} and res.model is None


def test_requires_refuses_before_run_with_an_unsupported_error():
    _NeedsRelu.ran = 0
    graph = gp.load(make_model([helper.make_node("Neg", ["x"], ["y"])], {"x": [2]}, {"y": [2]})).graph
    with pytest.raises(PassPreconditionError, match="has no Relu") as e:
        _NeedsRelu()(graph)
    assert isinstance(e.value, UnsupportedError) and e.value.exit_code == 2
    assert _NeedsRelu.ran == 0
    assert _NeedsRelu()(gp.load(_relu_model())).stats == {"seen": 2} and _NeedsRelu.ran == 1
    # through the manager: a GraphpassError, passed through unchanged (exit 2, not a PassError)
    with pytest.raises(PassPreconditionError):
        PassManager([_NeedsRelu])(graph)


def test_ensures_checks_after_run():
    with pytest.raises(PassPostconditionError, match="an Identity is left"):
        _LeavesIdentity()(gp.load(_relu_model()))
    graph = gp.load(_relu_model()).graph
    assert not _LeavesIdentity()(gp.load(make_model([helper.make_node("Neg", ["x"], ["y"])], {"x": [2]},
                                                    {"y": [2]}))).modified
    # in a manager, a broken post-condition is the pass's bug: PassError (exit 3)
    with pytest.raises(PassError, match="leaves_identity"):
        PassManager([_LeavesIdentity])(graph)
    assert PassManager(["eliminate_identity", _LeavesIdentity])(graph).modified


def test_analysis_passes_only_read():
    class Count(Pass):
        name = "count_ops"
        summary = "counts nodes"
        kind = PassKind.ANALYSIS

        def run(self, graph, ctx):
            return PassResult(False, {"nodes": len(graph.nodes)})

    class Sneaky(Count):
        name = "sneaky_analysis"

        def run(self, graph, ctx):
            graph.nodes.pop()
            return PassResult(True)

    graph = gp.load(_relu_model()).graph
    assert Count()(graph).stats == {"nodes": 2}
    assert not Count.is_scored()
    with pytest.raises(PassContractError, match="analysis pass 'sneaky_analysis' changed the graph"):
        Sneaky()(graph)


def test_modified_must_be_honest_when_called():
    from toy_passes import Liar

    with pytest.raises(PassContractError, match="modified=False"):
        Liar()(gp.load(_relu_model()))


def test_run_must_return_a_pass_result():
    class Bad(Pass):
        name = "bad_result"
        summary = "returns a bool"
        kind = PassKind.CLEANUP

        def run(self, graph, ctx):
            return True

    with pytest.raises(PassContractError, match="returned bool, not PassResult"):
        Bad()(gp.load(_relu_model()))


# -- typed options ------------------------------------------------------------------------


def test_a_misspelled_option_is_a_type_error_naming_the_valid_ones():
    FoldConstants = gp.get_pass("fold_constants")
    with pytest.raises(TypeError, match=r"'fold_constants' has no option 'size_limt'; its options: size_limit, "
                                        r"fold_growing, max_iterations, max_single_retries"):
        FoldConstants(size_limt=1)
    assert FoldConstants(size_limit=7).size_limit == 7
    with pytest.raises(TypeError, match="'fold_pad' has no option 'size_limit'; its options: none"):
        gp.get_pass("fold_pad")(size_limit=1)
    assert FoldConstants.option_names() == ["size_limit", "fold_growing", "max_iterations", "max_single_retries"]
    assert gp.get_pass("fold_pad").option_names() == []


def test_optimize_rejects_a_misspelled_option_and_an_unknown_pass():
    with pytest.raises(TypeError, match="has no option 'size_limt'; its options: size_limit"):
        gp.optimize(_const_model(), options={"fold_constants": {"size_limt": 1}})
    with pytest.raises(UsageError, match="options for unknown pass 'fold_constant'"):
        gp.optimize(_const_model(), options={"fold_constant": {"size_limit": 1}})
    # checked even for a pass the pipeline does not run
    with pytest.raises(TypeError, match="'mixed_precision' has no option 'mood'"):
        gp.optimize(_const_model(), options={"mixed_precision": {"mood": "force_fp16"}})


def test_options_reach_the_pass():
    def folded(**opts):
        rep = gp.optimize(_const_model(), passes=["fold_constants"], target="none",
                          options={"fold_constants": opts} if opts else None).report
        return rep.passes[0].stats

    assert folded()["folded"] >= 1 and folded()["too_large"] == 0

    def grown(**opts):
        rep = gp.optimize(_growing_model(), passes=["fold_constants"], target="none",
                          options={"fold_constants": opts} if opts else None).report
        return rep.passes[0].stats

    assert grown()["folded"] == 0 and grown()["would_grow"] == 1
    assert grown(fold_growing=True)["folded"] == 1
    small = grown(fold_growing=True, size_limit=0)
    assert small["folded"] == 0 and small["too_large"] >= 1
    graph = gp.load(_growing_model()).graph
    assert gp.get_pass("fold_constants")(size_limit=0, fold_growing=True)(graph).stats["too_large"] >= 1
    assert "Add" in ops(graph) and len(graph.nodes) == 3


def test_option_values_are_checked_when_the_pass_is_built():
    with pytest.raises(UsageError, match="unknown layout mode 'gredy'"):
        gp.get_pass("propagate_layout")(mode="gredy")
    with pytest.raises(UsageError, match="mixed_precision: unknown mode 'fp8'"):
        gp.get_pass("mixed_precision")(mode="fp8")
    with pytest.raises(TypeError, match="keep_fp32 is a list"):
        gp.get_pass("mixed_precision")(keep_fp32="conv1")


def test_cli_option_flags_still_set_options(tmp_path):
    from graphpass.cli import main

    src = tmp_path / "m.onnx"
    onnx.save(_growing_model(), src)
    report = tmp_path / "r.json"
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "-q", "--passes", "fold_constants",
                 "--target", "none", "--fold-growing", "--fold-size-limit", "0", "--report", str(report)]) == 0
    stats = json.loads(report.read_text())["passes"][0]["stats"]
    assert stats["folded"] == 0 and stats["too_large"] >= 1
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "-q", "--passes", "fold_constants",
                 "--target", "none", "--fold-growing", "--report", str(report)]) == 0
    assert json.loads(report.read_text())["passes"][0]["stats"]["folded"] == 1


# -- the function form ----------------------------------------------------------------------


def test_function_form_has_the_pass_signature():
    from graphpass import passes
    from graphpass.passes.cleanup.fold_constants import DEFAULT_SIZE_LIMIT

    sig = inspect.signature(passes.fold_constants)
    assert list(sig.parameters) == ["model", "ctx", "size_limit", "fold_growing", "max_iterations", "max_single_retries"]
    assert sig.parameters["ctx"].default is None
    assert sig.parameters["size_limit"].kind is inspect.Parameter.KEYWORD_ONLY
    assert sig.parameters["size_limit"].default == DEFAULT_SIZE_LIMIT
    for name, cls in gp.all_passes().items():
        params = inspect.signature(getattr(passes, name)).parameters
        assert list(params)[:2] == ["model", "ctx"], name
        assert list(params)[2:] == cls.option_names(), name
        assert list(inspect.signature(cls).parameters) == cls.option_names(), name
    with pytest.raises(TypeError, match="has no option 'size_limt'"):
        passes.fold_constants(gp.load(_const_model()), size_limt=1)
    graph = gp.load(_growing_model()).graph
    assert passes.fold_constants(graph, size_limit=0, fold_growing=True).stats["too_large"] >= 1


def test_manager_is_a_pass():
    graph = gp.load(_relu_model()).graph
    inner = PassManager(["eliminate_identity"])
    assert isinstance(inner, Pass)
    res = PassManager([inner, "eliminate_dead_nodes"], max_rounds=2)(_Holder(graph))
    assert res.modified and ops(graph) == ["Relu"] and isinstance(res.model, _Holder)
    assert [r.name for r in res.records][:2] == ["pass_manager", "eliminate_dead_nodes"]
    assert PassManager(["eliminate_identity", "fold_batchnorm"]).promise.name == "reassociation"
    assert PassManager(["eliminate_identity"]).promise.exact


def test_the_readme_pass_example_runs():
    import pathlib
    import re

    from graphpass.passes.framework.registry import unregister
    from graphpass.testing import assert_equivalent

    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    code = re.search(r"```python\n(from graphpass import Pass, PassKind.*?)```", readme, re.S).group(1)
    model = make_model([helper.make_node("Dropout", ["x"], ["a"], name="drop1"), helper.make_node("Relu", ["a"], ["b"]),
                        helper.make_node("Dropout", ["b"], ["c"], name="drop3"), helper.make_node("Neg", ["c"], ["y"])],
                       {"x": [2, 3]}, {"y": [2, 3]})
    graph = gp.load(model).graph
    ns = {"graph": graph, "model": graph}
    try:
        exec(code, ns)  # registers drop_dropout and runs it with keep_named=("drop3",)
        assert ops(graph) == ["Relu", "Dropout", "Neg"]
        assert_equivalent(model, gp.to_proto(graph), exact=True)
        assert pipelines_build_places(ns["DropDropout"].name)
        with pytest.raises(PassPreconditionError, match="needs opset 12"):
            ns["DropDropout"]()(gp.load(make_model([helper.make_node("Dropout", ["x"], ["y"])], {"x": [2]}, {"y": [2]},
                                                  opset=11)))
        with pytest.raises(TypeError, match="its options: keep_named"):
            ns["DropDropout"](keep=("a",))
    finally:
        unregister("drop_dropout")


def pipelines_build_places(name):
    from graphpass.passes import pipelines

    names = pipelines.build("cleanup", enable={name})
    return names.index(name) < names.index("eliminate_dead_nodes")


def test_a_nested_manager_passes_its_explanations_up():
    # the inner manager's explanations (why its rules refused) were dropped by the outer run:
    # `--explain` of a pipeline holding a manager said nothing about the inner passes
    from graphpass.passes import RuleSet, rule, rule_pass

    refuser = rule_pass("refuse_every_relu", RuleSet(rule(("Relu",), lambda m: m.anchor.inputs[0],
                                                          check=lambda m: "never", name="r")), kind=PassKind.CLEANUP)
    model = gp.load(_relu_model())
    flat = PassManager([refuser()])(model)
    nested = PassManager([PassManager([refuser()])])(model)
    assert [e.reason for e in flat.explanations] == ["never"]
    assert [e.reason for e in nested.explanations] == ["never"]
