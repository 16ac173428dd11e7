"""ONNX node conformance cases: where onnxruntime reproduces the expected outputs on the
original model, it still does on the optimized one, and no case crashes the optimizer.

CI runs one case per op type (the first, by name); ``benchmarks/conformance.py`` runs all.
"""

import collections

import numpy as np
import onnx
import pytest
from onnx.backend.test.case.node import collect_testcases

import graphpass as gp
from graphpass.conformance import run_case

_ALL = collect_testcases(None)
_BY_OP = collections.OrderedDict()
for case in sorted(_ALL, key=lambda c: c.name):
    op = case.model.graph.node[0].op_type if case.model.graph.node else "?"
    _BY_OP.setdefault(op, case)
SUBSET = list(_BY_OP.values())


def test_subset_covers_every_op_type():
    ops = {c.model.graph.node[0].op_type for c in _ALL if c.model.graph.node}
    assert ops == set(_BY_OP) and len(SUBSET) > 150


@pytest.mark.parametrize("case", SUBSET, ids=[c.name for c in SUBSET])
def test_conformance_case(case):
    outcome = run_case(case)
    assert outcome.status in ("pass", "ort-fails-original", "ort-cannot-load", "ort-mismatch"), outcome.detail


_BY_NAME = {c.name: c for c in _ALL}


@pytest.mark.parametrize("name", ["test_identity_opt", "test_if_opt", "test_loop16_seq_none"])
def test_optional_and_type_proto_attributes_survive(name):
    """gs cannot export optional types or TYPE_PROTO attributes; the IR layer restores them."""
    outcome = run_case(_BY_NAME[name])
    assert outcome.status == "pass", outcome.detail


@pytest.mark.parametrize("name", ["light_squeezenet", "light_shufflenet"])
def test_light_model_reproduces_its_shipped_output_after_optimizing(name):
    from graphpass.conformance import light_models, run_light_model

    path = next(p for p in light_models() if p.endswith(f"{name}.onnx"))
    outcome = run_light_model(path)
    assert outcome.status == "pass", outcome.detail


@pytest.mark.parametrize("name", ["test_clip_example", "test_blackmanwindow", "test_cast_FLOAT_to_FLOAT8E4M3FN",
                                  "test_sequence_insert_at_back"])
def test_cases_fed_as_onnxruntime_takes_them_are_run(name):
    """numpy scalars (Clip's bounds, a window size), TensorProto expectations (float8) and
    sequences used to be filed as "onnxruntime fails the original" and never checked."""
    outcome = run_case(_BY_NAME[name])
    assert outcome.status == "pass", (outcome.status, outcome.detail)


def test_a_case_the_optimizer_breaks_is_reported_as_failing(monkeypatch):
    """The check can fail: an optimizer that perturbs the output is caught."""
    import graphpass.conformance as C

    real = C.gp.to_proto

    def perturbed(graph, *a, **k):
        m = real(graph, *a, **k)
        out = m.graph.output[0].name
        m.graph.node[-1].output[0] = out + "_raw"
        m.graph.node.append(onnx.helper.make_node("Neg", [out + "_raw"], [out]))
        return m

    monkeypatch.setattr(C.gp, "to_proto", perturbed)
    outcome = run_case(_BY_NAME["test_clip_example"])
    assert outcome.status == "fail", outcome
