import os

import numpy as np
import onnx
import pytest

# every pass-manager run of the suite checks that a vetoed pass's rollback restores the exported
# model byte for byte (passes.framework.instruments.CostVeto)
os.environ.setdefault("GRAPHPASS_CHECK_ROLLBACK", "1")
# ... and that what the cost veto hands a pass of the graph it starts on (ctx.placement: engines and
# report from the veto's own walk) equals a fresh placement of that graph (place_and_sink)
os.environ.setdefault("GRAPHPASS_CHECK_SHARED_PLACEMENT", "1")
# the cost veto's estimate, kept through a run, equals a fresh estimate of the final graph
os.environ.setdefault("GRAPHPASS_CHECK_KEPT_COST", "1")
# ... and that its incremental estimate after every application equals a fresh one, to the last bit
os.environ.setdefault("GRAPHPASS_CHECK_INCREMENTAL", "1")
# every application the pass manager skips on a declaration (idempotent, an edit a finding of
# nothing survives) is run anyway and must change nothing (passes.framework.manager)
os.environ.setdefault("GRAPHPASS_CHECK_SKIPS", "1")

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = sorted(f for f in os.listdir(LIGHT_DIR) if f.endswith(".onnx"))
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples")


def randomize_light_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Replace the model zoo's ConstantOfShape(0.02) weight fills by seeded random initializers.

    All channels of a light model's layer are alike, so a wrong channel permutation or fold
    could leave the outputs unchanged; random weights make such a bug visible. BatchNorm
    variances are kept positive.
    """
    rng = np.random.default_rng(seed)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    shapes = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    keep, inits = [], {t.name: t for t in m.graph.initializer}
    for node in m.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in shapes:
            shape = [int(d) for d in shapes[node.input[0]]]
            name = node.output[0]
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            if any(s in name for s in ("riv", "var", "_s_", "scale")):
                arr = rng.uniform(0.5, 1.5, shape)
            else:
                arr = rng.standard_normal(shape) * np.sqrt(1.0 / max(fan_in, 1))
            m.graph.initializer.append(onnx.numpy_helper.from_array(arr.astype(np.float32), name))
            m.graph.input.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape))
        else:
            keep.append(node)
    del m.graph.node[:]
    m.graph.node.extend(keep)
    used = {i for n in m.graph.node for i in n.input}
    dead = [n for n in inits if n not in used]
    for name in dead:
        m.graph.initializer.remove(inits[name])
    live_inputs = [i for i in m.graph.input if i.name not in dead]
    del m.graph.input[:]
    m.graph.input.extend(live_inputs)
    return m


@pytest.fixture
def light_path():
    return lambda name: os.path.join(LIGHT_DIR, name)
