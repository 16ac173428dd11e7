"""The cost veto's estimate of the input graph in a forked child (issue 22): the same report,
records, statistics and output model as the estimate made in the process; when it forks and
when not; a child that fails, prints or is not waited for."""

import os
import sys
import threading
from pathlib import Path

import onnx
import pytest

import graphpass as gp
from graphpass.cost_model.target import Target
from graphpass.passes.framework import forked_estimate as F, instruments as I

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(F.fork_blocker(I.ESTIMATE_EACH_MAX_NODES + 1, checks=False) is not None,
                                reason="no fork here (not Linux, or one CPU)")


def _synthetic(family: str, nodes: int) -> onnx.ModelProto:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import _synthetic
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return (_synthetic.residual_stack if family == "cnn" else _synthetic.transformer_stack)(nodes)


@pytest.fixture(scope="module")
def models():
    return {**{f: _synthetic(f, 6000) for f in ("cnn", "transformer")}, "cnn10k": _synthetic("cnn", 10_000)}


@pytest.fixture
def vetoes(monkeypatch):
    """Every CostVeto that exits, after its exit; the suite's checks of the veto kept (kept cost
    on, the incremental check off: that one keeps the input graph's state and never forks); the
    test process's threads (onnxruntime's pools, idle) taken as known, so that it forks."""
    seen = []
    orig = I.CostVeto.exit

    def exit_(self, manager, graph, ctx):
        orig(self, manager, graph, ctx)
        seen.append(self)

    monkeypatch.setattr(I.CostVeto, "exit", exit_)
    monkeypatch.setenv("GRAPHPASS_CHECK_INCREMENTAL", "0")
    monkeypatch.setenv("GRAPHPASS_CHECK_KEPT_COST", "1")
    monkeypatch.delenv("GRAPHPASS_NO_FORK", raising=False)
    monkeypatch.setattr(F, "_KNOWN_TASKS", F._tasks())
    monkeypatch.setattr(F, "_busy_cpus", lambda: 0.0)  # (the suite's machine may be busy)
    return seen


def _run(model, monkeypatch, vetoes, fork: bool, **kw):
    monkeypatch.setenv("GRAPHPASS_NO_FORK", "0" if fork else "1")
    result = gp.optimize(onnx.ModelProto.FromString(model.SerializeToString()), **kw)
    veto = vetoes[-1]
    assert veto.forked is fork
    report = result.report.to_dict()
    for key in ("seconds",):
        report.pop(key, None)
    for p in report.get("passes", []):
        p.pop("seconds", None)
    return (result.model.to_proto().SerializeToString(), report, veto.incremental_stats,
            [(r.name, r.cost_before_us, r.cost_after_us, r.rolled_back, r.note) for r in result.report.passes],
            veto.initial_report.to_dict(), veto.final_report.to_dict())


@pytest.mark.parametrize("family", ["cnn", "transformer"])
def test_forked_and_inline_runs_are_identical(family, models, monkeypatch, vetoes):
    forked = _run(models[family], monkeypatch, vetoes, True)
    inline = _run(models[family], monkeypatch, vetoes, False)
    assert forked[0] == inline[0]  # the output model, byte for byte
    assert forked[1] == inline[1]  # the optimize report (costs before and after, layout, passes)
    assert forked[2] == inline[2]  # how the estimates were made (the child's counted as the first full one)
    assert forked[3] == inline[3]  # each application's costs, rollbacks and notes
    assert forked[4] == inline[4] and forked[5] == inline[5]
    assert all(isinstance(c, (float, type(None))) for r in forked[3] for c in r[1:3])  # none left awaited
    assert forked[2]["full"] >= 2


@pytest.fixture
def forks(monkeypatch):
    """The pids of the children forked (each one an estimate)."""
    pids = []
    orig = F._ChildEstimate.__init__

    def init(self, *a):
        orig(self, *a)
        pids.append(self.pid)

    monkeypatch.setattr(F._ChildEstimate, "__init__", init)
    return pids


def test_the_catch_up_estimate_is_forked_too(models, monkeypatch, vetoes, forks):
    """The 10k CNN: the input graph's estimate, then the catch-up before the first scored
    application (after the cleanups, ~6k nodes); neither read before a scored application
    changes the graph."""
    forked = _run(models["cnn10k"], monkeypatch, vetoes, True)
    assert len(forks) == 2
    assert forked == _run(models["cnn10k"], monkeypatch, vetoes, False)
    assert len(forks) == 2


def test_a_pass_reading_the_placement_waits_for_the_child(models, monkeypatch, vetoes, forks):
    """place_and_sink takes the veto's engines and report (ctx.placement) of the catch-up
    estimate a child makes: unpacked, they are waited for (the suite's shared-placement check
    compares them with a fresh placement)."""
    monkeypatch.setenv("GRAPHPASS_CHECK_SHARED_PLACEMENT", "1")
    kw = dict(passes=["strip_debug_info", "fold_constants", "eliminate_identity", "place_and_sink"])
    forked = _run(models["cnn10k"], monkeypatch, vetoes, True, **kw)
    assert len(forks) == 2
    assert forked == _run(models["cnn10k"], monkeypatch, vetoes, False, **kw)
    seen = []
    orig = I.CostVeto._resolve

    def resolve(self, child=None):
        seen.append((child, self._child is not None and child is None, self._journal is not None))
        orig(self, child)

    monkeypatch.setattr(I.CostVeto, "_resolve", resolve)
    _run(models["cnn10k"], monkeypatch, vetoes, True, **kw)
    assert seen[0][1] and seen[0][2]  # the first read: the awaited estimate, inside the pass (its journal open)


def test_first_application_scored_waits_for_the_child(models, monkeypatch, vetoes):
    """A scored application before any change is judged against the input graph's estimate (and
    gets its engines, ctx.placement): the child's, waited for."""
    kw = dict(passes=["fold_batchnorm", "fuse_conv_activation", "place_and_sink"])
    forked = _run(models["cnn"], monkeypatch, vetoes, True, **kw)
    inline = _run(models["cnn"], monkeypatch, vetoes, False, **kw)
    assert forked == inline
    assert forked[3][0][1] == forked[1]["estimated_cost_us"]["before"]


def test_constant_swaps_before_any_estimate_keep_the_childs_figures(models, monkeypatch, vetoes):
    """eliminate_common_subexpressions first: its merging of equal weights cannot change the
    estimate, so the input graph's (the child's, not read yet) stands for the next application."""
    kw = dict(passes=["eliminate_common_subexpressions", "fold_batchnorm"])
    assert _run(models["cnn"], monkeypatch, vetoes, True, **kw) == _run(models["cnn"], monkeypatch, vetoes, False, **kw)


def test_fork_blocker_reasons(monkeypatch):
    monkeypatch.delenv("GRAPHPASS_NO_FORK", raising=False)
    monkeypatch.setattr(F, "_KNOWN_TASKS", F._tasks())
    monkeypatch.setattr(F, "_busy_cpus", lambda: 0.0)
    n = I.ESTIMATE_EACH_MAX_NODES + 1
    assert F.fork_blocker(n) is None
    cpus = len(os.sched_getaffinity(0))
    monkeypatch.setattr(F, "_busy_cpus", lambda: cpus - 0.4)  # every CPU busy: the child would only take turns
    assert "no idle CPU" in F.fork_blocker(n)
    assert F.fork_blocker(n, checks=False) is None
    monkeypatch.setattr(F, "_busy_cpus", lambda: cpus - 0.6)
    assert F.fork_blocker(n) is None
    assert "at most" in F.fork_blocker(I.ESTIMATE_EACH_MAX_NODES)  # every application estimated anyway
    assert "more than" in F.fork_blocker(F.FORK_MAX_NODES + 1)  # copy-on-write memory
    monkeypatch.setenv("GRAPHPASS_NO_FORK", "1")
    assert "GRAPHPASS_NO_FORK" in F.fork_blocker(n)
    monkeypatch.setenv("GRAPHPASS_NO_FORK", "0")
    assert F.fork_blocker(n) is None
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert "Python thread" in F.fork_blocker(n)
        assert F.fork_blocker(n, checks=False) is None
    finally:
        stop.set()
        t.join()
    # a thread threading does not list (as onnxruntime's pools, started by C++ code)
    import _thread

    started, stop = threading.Event(), threading.Event()
    _thread.start_new_thread(lambda: (started.set(), stop.wait()), ())
    started.wait()
    try:
        assert threading.active_count() == 1
        assert "native thread" in F.fork_blocker(n)
    finally:
        stop.set()


def test_known_native_threads_exclude_onnxruntime():
    """In a fresh process the threads known at import are numpy's (OpenBLAS) only; onnxruntime
    imported first (its pool) leaves none known but the main thread."""
    import subprocess

    code = ("import os, sys; {}; from graphpass.passes.framework import forked_estimate as F, instruments as I; "
            "print(len(F._KNOWN_TASKS), len(os.listdir('/proc/self/task')), "
            "F.fork_blocker(I.ESTIMATE_EACH_MAX_NODES + 1))")
    env = {**os.environ, "GRAPHPASS_NO_FORK": "0"}
    plain = subprocess.run([sys.executable, "-c", code.format("pass")], capture_output=True, text=True, env=env)
    assert plain.stdout.split()[-1] == "None" or "no idle CPU" in plain.stdout, plain.stderr  # forks (if a CPU idles)
    first = subprocess.run([sys.executable, "-c", code.format("import onnxruntime")], capture_output=True, text=True,
                           env=env)
    known, tasks = first.stdout.split()[:2]
    assert known == "1" and int(tasks) > 1 and "native thread" in first.stdout, first.stderr


def test_the_veto_forks_only_for_its_own_estimates(models, monkeypatch, vetoes):
    """A check of every update keeps the input graph's state: inline."""
    monkeypatch.setenv("GRAPHPASS_CHECK_INCREMENTAL", "1")
    gp.optimize(onnx.ModelProto.FromString(models["cnn"].SerializeToString()), passes=["fold_batchnorm"])
    assert vetoes[-1].forked is False
    monkeypatch.setenv("GRAPHPASS_CHECK_INCREMENTAL", "0")
    gp.optimize(onnx.ModelProto.FromString(models["cnn"].SerializeToString()), passes=["fold_batchnorm"])
    assert vetoes[-1].forked is True


def test_a_child_that_raises_raises_in_the_run(models, monkeypatch, vetoes):
    def boom(self, graph, **kw):  # runs in the child only: the forked parent never calls it
        raise ValueError("boom in the estimate")

    monkeypatch.setattr(Target, "incremental_estimate", boom)
    with pytest.raises(ValueError, match="boom in the estimate"):
        gp.optimize(onnx.ModelProto.FromString(models["cnn"].SerializeToString()))


def test_a_child_killed_is_an_error_not_a_wrong_report(models, monkeypatch, vetoes):
    import signal

    def killed(self, graph, **kw):
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(Target, "incremental_estimate", killed)
    with pytest.raises(RuntimeError, match="killed by signal 9"):
        gp.optimize(onnx.ModelProto.FromString(models["cnn"].SerializeToString()))


def test_the_child_writes_nothing(models, monkeypatch, vetoes, capfd):
    orig = Target.incremental_estimate

    def chatty(self, graph, **kw):
        print("child stdout")
        print("child stderr", file=sys.stderr)
        os.write(1, b"child fd 1\n")
        return orig(self, graph, **kw)

    monkeypatch.setattr(Target, "incremental_estimate", chatty)
    gp.optimize(onnx.ModelProto.FromString(models["cnn"].SerializeToString()))
    assert vetoes[-1].forked
    out, err = capfd.readouterr()
    assert "child" not in out and "child" not in err


def test_a_run_that_fails_kills_and_reaps_the_child(models, monkeypatch, vetoes):
    from graphpass.errors import PassError

    pids = []
    orig = F._ChildEstimate.__init__

    def init(self, *a):
        orig(self, *a)
        pids.append(self.pid)

    monkeypatch.setattr(F._ChildEstimate, "__init__", init)

    class _Raises(gp.Pass):
        name = "raises_at_once"
        summary = "raises"
        kind = gp.PassKind.CLEANUP

        def run(self, graph, ctx):
            raise ZeroDivisionError("pass failed")

    from graphpass.passes.framework import CostVeto, PassContext, PassManager

    graph = gp.as_model(onnx.ModelProto.FromString(models["cnn"].SerializeToString())).graph
    veto = CostVeto()
    with pytest.raises(PassError):
        PassManager([_Raises()], instruments=[veto]).run(graph, PassContext(target=Target.load()))
    assert veto.forked and pids
    with pytest.raises(ChildProcessError):  # reaped: no zombie left
        os.waitpid(pids[0], os.WNOHANG)


@pytest.mark.parametrize("engine", ["AICORE", "AICPU"])
def test_an_annotation_edit_before_any_estimate(engine, models, monkeypatch, vetoes):
    """An unscored application that only writes an engine annotation is judged by the engines of
    the child's estimate (read for it): the engine the estimate chose (AICORE: the kept estimate
    stands) or not (AICPU: left to the next estimate)."""
    from graphpass.ir import annotations as A
    from graphpass.passes.framework import CostVeto, PassContext, PassManager, get_pass

    class _Annotate(gp.Pass):
        name = "annotate_one_relu"
        summary = "an engine annotation on one Relu"
        kind = gp.PassKind.CLEANUP

        def run(self, graph, ctx):
            A.set_engine(next(n for n in graph.nodes if n.op == "Relu"), engine)
            return gp.PassResult(True, {})

    def run(fork):
        graph = gp.as_model(onnx.ModelProto.FromString(models["cnn"].SerializeToString())).graph
        veto = CostVeto(fork=fork)
        out = PassManager([_Annotate(), get_pass("fold_batchnorm")()], instruments=[veto]).run(
            graph, PassContext(target=Target.load()))
        assert veto.forked is fork
        return ([(r.name, r.cost_before_us, r.cost_after_us, r.modified, r.rolled_back) for r in out.records],
                veto.initial_cost, veto.final_cost, veto.incremental_stats)

    assert run(True) == run(False)
