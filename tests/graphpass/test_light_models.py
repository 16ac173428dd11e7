"""The model-zoo architectures shipped with onnx: optimize, full check, same outputs, not bigger.

The zoo fills every weight with 0.02, so the numeric check runs on a copy whose fills are
replaced by seeded random weights (see conftest.randomize_light_weights).
"""

import numpy as np
import onnx
import pytest

import graphpass as gp
from graphpass.check import verify as V
from graphpass.ir.graph import count_nodes

from conftest import LIGHT_MODELS, randomize_light_weights, LIGHT_DIR
import os


@pytest.mark.parametrize("name", LIGHT_MODELS)
@pytest.mark.parametrize("weights", ["zoo", "random"])
def test_light_model_optimizes_to_an_equivalent_model(name, weights):
    original = onnx.load(os.path.join(LIGHT_DIR, name))
    if weights == "random":
        original = randomize_light_weights(original)
    result = gp.optimize(original)
    assert count_nodes(result.graph) == result.report.nodes_after
    device = gp.to_proto(result.graph)  # TransData nodes stay: they are what the device runs
    portable = gp.to_proto(result.graph, emit="portable")  # TransData is Identity: dropped
    assert len(portable.graph.node) <= len(original.graph.node)
    s0 = V.session(original)
    feeds = V.random_inputs(s0, seed=1)
    ref = V.run(s0, feeds)
    for optimized in (device, portable):
        onnx.checker.check_model(optimized, full_check=True)
        got = V.run(V.session(optimized), feeds)
        for k in ref:
            scale = max(float(np.abs(ref[k]).max()), 1e-12)
            assert float(np.abs(ref[k] - got[k]).max()) <= 1e-4 * scale, k
