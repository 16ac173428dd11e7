"""Pass instruments: hook order, and each of CostVeto, VerifyEach, DumpIR, PassTiming,
Progress, ApplicationLimit, ContractCheck; the manager never writes the caller's context."""

import time

import pytest

import graphpass as gp
from graphpass.cost_model import create
from graphpass.errors import PassError, VerificationError
from graphpass.passes.framework import (
    ApplicationLimit,
    ContractCheck,
    CostVeto,
    DumpIR,
    Pass,
    PassContext,
    PassInstrument,
    PassKind,
    PassManager,
    PassResult,
    PassTiming,
    Progress,
    VerifyEach,
    standard_instruments,
)
from graphpass.passes.framework import instruments as I
from graphpass.passes.framework import cost_veto
from graphpass.passes.framework.cost_veto import _same_constant
from graphpass.ir.graph import count_nodes
from graphpass.testing import assert_equivalent, ops
from toy_passes import BreakRelu, Liar, NegCost, chain_model


class _Explains(Pass):
    name = "explains"
    summary = "refuses every node, with a reason"
    kind = PassKind.CLEANUP

    def run(self, graph, ctx):
        for n in graph.nodes:
            ctx.explain(self.name, n, "never")
        return PassResult(False)


class _Log(PassInstrument):
    def __init__(self, tag, log, skip=()):
        self.tag, self.log, self.skip = tag, log, set(skip)

    def enter(self, manager, graph, ctx):
        self.log.append((self.tag, "enter"))

    def should_run(self, pass_, graph, ctx):
        return pass_.name not in self.skip

    def before(self, pass_, graph, ctx, record):
        self.log.append((self.tag, "before", pass_.name))

    def after(self, pass_, graph, ctx, result, record):
        self.log.append((self.tag, "after", pass_.name, result.modified))

    def exit(self, manager, graph, ctx):
        self.log.append((self.tag, "exit"))


def test_hooks_nest_like_context_managers():
    log = []
    graph = gp.load(chain_model()).graph
    res = PassManager(["eliminate_identity", "merge_transposes"], max_rounds=1,
                      instruments=[_Log("a", log), _Log("b", log, skip={"merge_transposes"})])(graph)
    assert log == [("a", "enter"), ("b", "enter"),
                   ("a", "before", "eliminate_identity"), ("b", "before", "eliminate_identity"),
                   ("b", "after", "eliminate_identity", True), ("a", "after", "eliminate_identity", True),
                   ("a", "exit"), ("b", "exit")]
    # should_run=False from any instrument skips the application: no record, no hook
    assert [r.name for r in res.records] == ["eliminate_identity"] and ops(graph).count("Transpose") == 2


def test_exit_is_not_called_when_the_run_raises():
    log = []
    with pytest.raises(PassError):
        PassManager([Liar], instruments=[_Log("a", log), ContractCheck()])(gp.load(chain_model()))
    assert ("a", "exit") not in log and ("a", "enter") in log


def test_cost_veto_rolls_back_into_the_callers_graph_and_reports_costs():
    model = chain_model()
    graph = gp.load(model).graph
    veto = CostVeto(NegCost())
    res = PassManager([BreakRelu, "eliminate_identity"], instruments=[veto])(graph)
    first = res.records[0]
    assert first.rolled_back and not first.modified and first.application == 0
    assert first.cost_before_us == 5 + 10 and first.cost_after_us == 5 + 20
    assert "Relu" in ops(graph)  # the same graph object holds the restored contents
    assert veto.initial_cost == 15 and veto.final_cost == 14  # eliminate_identity removed one node
    assert veto.initial_report.total_us == 15
    assert_equivalent(model, gp.to_proto(graph), exact=True)


def test_cost_veto_without_an_active_cost_model_does_nothing():
    graph = gp.load(chain_model()).graph
    veto = CostVeto(create("none"))
    res = PassManager([BreakRelu], instruments=[veto])(graph)
    assert res.records[0].modified and veto.initial_cost is None and veto.final_cost is None
    assert res.records[0].cost_before_us is None and "Relu" not in ops(graph)


def test_verify_each_only_sees_applications_the_veto_kept():
    # outside CostVeto (earlier in the list), VerifyEach never sees the rolled-back Relu -> Neg
    graph = gp.load(chain_model()).graph
    res = PassManager([BreakRelu, "eliminate_identity"],
                      instruments=[VerifyEach(), CostVeto(NegCost())])(graph)
    assert res.records[0].rolled_back and res.records[1].modified
    with pytest.raises(VerificationError, match="after pass 'break_relu'"):
        PassManager(["eliminate_identity", BreakRelu], instruments=[VerifyEach()])(gp.load(chain_model()))


def test_dump_ir_writes_kept_applications_only(tmp_path):
    graph = gp.load(chain_model()).graph
    PassManager(["eliminate_identity", BreakRelu, "merge_transposes"],
                instruments=[DumpIR(tmp_path), CostVeto(NegCost())])(graph)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["001_eliminate_identity.onnx", "002_merge_transposes.onnx"]
    assert ops(gp.load(str(tmp_path / "002_merge_transposes.onnx"))) == ["Relu", "Neg"]


def test_pass_timing_times_each_application():
    class Slow(Pass):
        name = "slow"
        summary = "sleeps"
        kind = PassKind.CLEANUP

        def run(self, graph, ctx):
            time.sleep(0.02)
            return PassResult(False)

    timing = PassTiming()
    res = PassManager([Slow, "eliminate_identity"], instruments=[timing])(gp.load(chain_model()))
    slow = [r for r in res.records if r.name == "slow"]
    assert len(slow) == 2 and all(r.seconds >= 0.02 for r in slow)  # round 2 ran: identity changed the graph
    assert timing.totals["slow"] == pytest.approx(sum(r.seconds for r in slow))
    assert set(timing.totals) == {"slow", "eliminate_identity"}
    # without the instrument nothing is timed
    assert all(r.seconds == 0.0 for r in PassManager([Slow])(gp.load(chain_model())).records)


def test_progress_reports_name_round_index_total():
    calls = []
    PassManager(["eliminate_dead_nodes", "eliminate_identity", "merge_transposes"],
                instruments=[Progress(lambda *a: calls.append(a))])(gp.load(chain_model()))
    assert calls[:3] == [("eliminate_dead_nodes", 1, 0, 3), ("eliminate_identity", 1, 1, 3), ("merge_transposes", 1, 2, 3)]
    # round 2: the graph changed after eliminate_dead_nodes ran; no Identity or Transpose is left,
    # so the two rule passes are skipped (nothing they rewrite is in the graph)
    assert calls[3:] == [("eliminate_dead_nodes", 2, 0, 3)]


def test_application_limit_stops_after_n_changes_and_ignores_rollbacks():
    graph = gp.load(chain_model()).graph
    res = PassManager(["eliminate_identity", "merge_transposes", "eliminate_dead_nodes"],
                      instruments=[ApplicationLimit(1)])(graph)
    assert [(r.name, r.application) for r in res.records] == [("eliminate_identity", 1)]
    assert ops(graph).count("Transpose") == 2
    assert PassManager(["eliminate_identity"], instruments=[ApplicationLimit(0)])(gp.load(chain_model())).records == []
    # a rolled-back application does not count towards the limit
    graph = gp.load(chain_model()).graph
    res = PassManager([BreakRelu, "eliminate_identity", "merge_transposes"],
                      instruments=[ApplicationLimit(1), CostVeto(NegCost())])(graph)
    assert [(r.name, r.rolled_back, r.application) for r in res.records] == [
        ("break_relu", True, 0), ("eliminate_identity", False, 1)]


def test_contract_check_catches_a_liar_and_can_be_switched_off(monkeypatch):
    with pytest.raises(PassError, match="modified=False"):
        PassManager([Liar], instruments=[ContractCheck()])(gp.load(chain_model()))
    graph = gp.load(chain_model()).graph
    PassManager([Liar], max_rounds=1, instruments=[ContractCheck(enabled=False)])(graph)
    assert count_nodes(graph) == 4  # not checked: the lie goes through
    monkeypatch.setattr(I, "CONTRACT_CHECK_MAX_NODES", 3)  # auto: off above the size limit
    check = ContractCheck()
    PassManager([Liar], max_rounds=1, instruments=[check])(gp.load(chain_model()))
    assert check.on is False


def test_the_callers_context_is_only_read():
    ctx = PassContext(seed=3, input_shapes={"x": [2, 3]})
    before = {k: getattr(ctx, k) for k in ctx.__slots__}
    res = PassManager([_Explains, "eliminate_identity"],
                      instruments=standard_instruments(verify_each=True, seed=3))(gp.load(chain_model()), ctx)
    assert ctx.explanations == [] and {k: getattr(ctx, k) for k in ctx.__slots__} == before
    assert {e.reason for e in res.explanations} == {"never"} and len(res.explanations) >= 5
    with pytest.raises(AttributeError, match="constructor arguments"):
        ctx.options = {"fold_constants": {}}  # pass options are constructor arguments now
    with pytest.raises(AttributeError, match="constructor arguments"):
        ctx.options
    with pytest.raises(AttributeError):
        ctx.verify_each = True  # the manager's jobs are instruments: no silent, ignored field


def test_optimize_builds_the_standard_instruments():
    calls = []
    res = gp.optimize(chain_model(), on_pass=lambda *a: calls.append(a), max_applications=1, target="none")
    applied = [r for r in res.report.passes if r.application]
    assert len(applied) == 1 and calls and calls[0][1:] == (1, 0, calls[0][3])
    kinds = [type(i).__name__ for i in standard_instruments(target=None, verify_each=True, dump_dir=".",
                                                             on_pass=print, max_applications=2)]
    assert kinds == ["Progress", "ApplicationLimit", "DumpIR", "VerifyEach", "CostVeto", "ContractCheck", "PassTiming"]


def test_one_progress_shared_by_nested_managers():
    # the inner manager's enter replaced the pass list the outer one indexes: StopIteration
    # (a PassError blaming 'pass_manager') as soon as the outer manager ran its next pass
    calls = []
    progress = Progress(lambda *a: calls.append(a))
    inner = PassManager(["eliminate_identity"], max_rounds=1, instruments=[progress])
    PassManager([inner, "eliminate_dead_nodes"], max_rounds=1, instruments=[progress])(gp.load(chain_model()))
    assert calls == [("pass_manager", 1, 0, 2), ("eliminate_identity", 1, 0, 1), ("eliminate_dead_nodes", 1, 1, 2)]


def test_the_cost_kept_through_a_run_is_a_fresh_estimate_after_a_shape_refresh(monkeypatch):
    """The pass manager re-infers shapes between rounds (outside any pass): the cost veto's kept
    estimate must follow (a refresh renames or resolves dims; the report's assumptions and the
    next scored application's 'before' are of the graph as it is). vit.dynamo's refresh names
    new symbolic dims after the passes."""
    from pathlib import Path

    from graphpass.passes.framework import CostVeto

    monkeypatch.delenv("GRAPHPASS_CHECK_KEPT_COST", raising=False)  # compared here, not by the check
    src = Path(__file__).resolve().parents[1] / "data" / "exporters" / "vit.dynamo.onnx"
    model = gp.load(src)
    veto = CostVeto()
    PassManager(_default_names(), instruments=[veto])(model, PassContext(target="ascend910a"))
    fresh = veto.target.estimate(model.graph)
    assert veto.final_cost == fresh.total_us
    assert veto.final_report.assumptions == fresh.assumptions
    assert veto.final_report.assumed_dims == fresh.assumed_dims


def _default_names():
    from graphpass.passes import pipelines

    return pipelines.build(None, None, set(), set())


# -- engine annotations the estimate already chose: no estimate (issue 22) ----------------------

class _WritesEngines(Pass):
    """Scored; writes an engine annotation on every node: the estimate's own choice
    (``ctx.placement``, as place_and_sink) or, with ``other``, AI CPU everywhere."""

    name = "writes_engines"
    summary = "engine annotations only"
    kind = PassKind.PLACEMENT
    scored = True
    other = False
    extra = False

    def run(self, graph, ctx):
        from graphpass.ir import annotations as A

        engines = ctx.placement[0]
        changed = 0
        for n in graph.nodes:
            engine = "AICPU" if self.other else engines[id(n)][0]
            if A.get_engine(n) != engine:
                A.set_engine(n, engine)
                changed += 1
            if self.extra and A.get(n, A.REASON) is None:
                A.set(n, A.REASON, "and another annotation")
                changed += 1
        return PassResult(changed > 0)


class _WritesOther(_WritesEngines):
    name = "writes_other_engines"
    other = True


class _WritesMore(_WritesEngines):
    name = "writes_more_annotations"
    extra = True


def _count_estimates(monkeypatch):
    from graphpass.cost_model.ascend import AscendCostModel

    monkeypatch.delenv("GRAPHPASS_CHECK_KEPT_COST", raising=False)  # its fresh estimate at the end is not counted
    calls = []
    real = AscendCostModel._estimate
    monkeypatch.setattr(AscendCostModel, "_estimate", lambda self, g, **k: calls.append(len(g.nodes)) or real(self, g, **k))
    return calls


@pytest.mark.parametrize("incremental", [True, False])
def test_engine_annotations_the_estimate_chose_need_no_estimate(monkeypatch, incremental):
    calls = _count_estimates(monkeypatch)
    graph = gp.load(chain_model()).graph
    veto = CostVeto(check_incremental=False, incremental=incremental)
    res = PassManager([_WritesEngines], instruments=[veto])(graph, PassContext(target="ascend910a"))
    rec = res.records[0]
    assert rec.modified and not rec.rolled_back
    assert len(calls) == 1  # the initial estimate only
    assert rec.cost_after_us == rec.cost_before_us == veto.final_cost
    fresh = veto.target.estimate(graph)
    assert fresh.total_us == veto.final_cost


@pytest.mark.parametrize("pass_", [_WritesOther, _WritesMore])
def test_any_other_annotation_is_estimated(monkeypatch, pass_):
    calls = _count_estimates(monkeypatch)
    graph = gp.load(chain_model()).graph
    veto = CostVeto(check_incremental=False)
    res = PassManager([pass_], instruments=[veto])(graph, PassContext(target="ascend910a"))
    assert len(calls) == 2  # the initial estimate, and one after the application
    rec = res.records[0]
    if pass_ is _WritesOther:  # AI CPU everywhere costs more: vetoed
        assert rec.rolled_back and rec.cost_after_us > rec.cost_before_us


def test_the_skip_is_checked_against_a_fresh_estimate_in_the_suite(monkeypatch):
    """GRAPHPASS_CHECK_INCREMENTAL (set by the suite) compares the kept estimate with a fresh one."""
    calls = _count_estimates(monkeypatch)
    graph = gp.load(chain_model()).graph
    veto = CostVeto(check_incremental=True)
    PassManager([_WritesEngines], instruments=[veto])(graph, PassContext(target="ascend910a"))
    assert len(calls) == 2  # the initial one and the check's


# -- a Constant input swapped for an equal one: no estimate (issue 22) --------------------------

def _two_adds():
    import numpy as np
    from onnx import helper

    from graphpass.testing import make_model

    c = np.arange(6, dtype=np.float32).reshape(2, 3)
    return make_model([helper.make_node("Add", ["x", "c1"], ["a"]), helper.make_node("Add", ["a", "c2"], ["y"])],
                      {"x": [2, 3]}, {"y": [2, 3]}, initializers={"c1": c, "c2": c.copy()})


class _SwapsConstant(Pass):
    """Scored; makes the second Add read the first Add's constant (equal: CSE's merge), or with
    ``other`` a constant of other values."""

    name = "swaps_constant"
    summary = "a Constant input replaced"
    kind = PassKind.FUSION
    scored = True
    other = None

    def run(self, graph, ctx):
        first, second = graph.nodes
        if second.inputs[1] is first.inputs[1] or second.inputs[1].name == "c3":
            return PassResult(False)
        second.inputs[1] = self.other if self.other is not None else first.inputs[1]
        return PassResult(True)


def test_a_constant_swapped_for_an_equal_one_needs_no_estimate(monkeypatch):
    calls = _count_estimates(monkeypatch)
    graph = gp.load(_two_adds()).graph
    veto = CostVeto(check_incremental=False)
    res = PassManager([_SwapsConstant], instruments=[veto])(graph, PassContext(target="ascend910a"))
    assert res.records[0].modified and len(calls) == 1
    assert veto.final_cost == veto.target.estimate(graph).total_us


def test_an_unscored_swap_leaves_no_catch_up_estimate(monkeypatch):
    calls = _count_estimates(monkeypatch)
    monkeypatch.setattr(cost_veto, "ESTIMATE_EACH_MAX_NODES", 0)  # unscored applications are not estimated
    unscored = type("_Unscored", (_SwapsConstant,), {"name": "swaps_unscored", "kind": PassKind.CLEANUP,
                                                     "scored": None})
    graph = gp.load(_two_adds()).graph
    veto = CostVeto(check_incremental=False)
    res = PassManager([unscored, _WritesEngines], instruments=[veto])(graph, PassContext(target="ascend910a"))
    assert [r.modified for r in res.records[:2]] == [True, True]
    assert len(calls) == 1  # neither the scored application after it nor the final report estimated again
    assert veto.final_cost == veto.target.estimate(graph).total_us


@pytest.mark.parametrize("other", ["values", "shape", "dtype", "annotation"])
def test_a_constant_swapped_for_another_is_estimated(monkeypatch, other):
    import numpy as np
    import onnx_graphsurgeon as gs

    from graphpass.ir import annotations as A

    values = {"values": np.ones((2, 3), np.float32), "shape": np.arange(3, dtype=np.float32),
              "dtype": np.arange(6, dtype=np.float64).reshape(2, 3),
              "annotation": np.arange(6, dtype=np.float32).reshape(2, 3)}[other]
    c3 = gs.Constant("c3", values)
    if other == "annotation":
        A.set_format(c3, "NC1HWC0")
    calls = _count_estimates(monkeypatch)
    graph = gp.load(_two_adds()).graph
    veto = CostVeto(check_incremental=False)
    swap = type("_SwapsOther", (_SwapsConstant,), {"other": c3})
    PassManager([swap], instruments=[veto])(graph, PassContext(target="ascend910a"))
    assert len(calls) == 2


def test_a_constant_of_more_than_64_elements_is_compared_by_shape_and_dtype_only():
    import numpy as np
    import onnx_graphsurgeon as gs

    a = gs.Constant("a", np.zeros((8, 9), np.float32))
    assert _same_constant(a, gs.Constant("b", np.ones((8, 9), np.float32)))  # the estimate never reads them
    assert not _same_constant(a, gs.Constant("b", np.ones((9, 8), np.float32)))
    small = gs.Constant("s", np.zeros(64, np.float32))
    assert not _same_constant(small, gs.Constant("t", np.ones(64, np.float32)))  # small: values compared
    ints = gs.Constant("i", np.zeros(100, np.int64))  # (the estimate folds integer tables of at most 64)
    assert _same_constant(ints, gs.Constant("j", np.ones(100, np.int64)))
    table = gs.Constant("t", np.zeros(8, np.int64))
    assert not _same_constant(table, gs.Constant("u", np.ones(8, np.int64)))
    assert _same_constant(table, gs.Constant("v", np.zeros(8, np.int64)))
