"""The collector policy around big graphs (issue 22): a freeze taken by the pass manager must
outlive the estimates and passes nested in it, or every generation-2 sweep walks the whole
graph again (a 100k-node pipeline ran ~1.8x slower)."""

import gc

from graphpass.ir.serialize import gc_frozen


def test_a_nested_freeze_keeps_the_outer_one():
    before = gc.get_freeze_count()
    with gc_frozen():
        held = [[i] for i in range(1000)]  # container objects alive when the outer freeze starts
        with gc_frozen():
            frozen_inside = gc.get_freeze_count()
        after_inner = gc.get_freeze_count()
        assert frozen_inside > before + 999 and after_inner > before + 999, (before, frozen_inside, after_inner)
    assert gc.get_freeze_count() == before
    del held


def test_an_outer_freeze_of_someone_else_is_left_alone():
    gc.freeze()
    try:
        theirs = gc.get_freeze_count()
        with gc_frozen():
            pass
        assert gc.get_freeze_count() >= theirs
    finally:
        gc.unfreeze()


def test_the_pipelines_full_collection_only_for_a_big_graph(monkeypatch):
    """gc_batched's closing full collection walks the caller's whole heap: worth it for a big
    graph's removed nodes (the export's peak), not for each of thousands of small pipelines."""
    import graphpass.ir.serialize as S

    calls = []
    monkeypatch.setattr(S.gc, "collect", lambda *a: calls.append(a) or 0)
    with S.gc_batched(nodes=100):
        pass
    assert calls == []
    with S.gc_batched(nodes=50_000):
        pass
    assert len(calls) == 1


def test_a_load_leaves_its_objects_in_the_oldest_generation_and_collectable(tmp_path):
    """graphpass.load builds with the collector paused and settles what it built in the oldest
    generation (no young sweep walks the new graph); nothing is left frozen, the collector is
    on again, and a dropped model's cycles are still freed."""
    import weakref

    import numpy as np
    import onnx
    from onnx import helper

    from graphpass.ir import serialize as S

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    w = onnx.numpy_helper.from_array(np.ones(2, np.float32), "w")
    nodes = [helper.make_node("Add", ["x", "w"], ["t0"])]
    nodes += [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"]) for i in range(300)]
    nodes.append(helper.make_node("Identity", ["t300"], ["y"]))
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]))
    gc.collect()
    frozen = gc.get_freeze_count()
    graph = S.load(model.SerializeToString())
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    young = gc.get_objects(generation=0)
    assert len(young) < 300, len(young)  # the ~2,000 objects built moved on without a sweep
    assert not any(o is graph.nodes[5] for o in young + gc.get_objects(generation=1))
    del young
    node = weakref.ref(graph.nodes[0])
    del graph
    gc.collect()
    assert node() is None

    gc.disable()  # a caller's own pause is kept
    try:
        S.load(model.SerializeToString())
        assert not gc.isenabled()
    finally:
        gc.enable()
    gc.freeze()  # and a caller's own freeze is left alone: no splice, nothing unfrozen
    try:
        theirs = gc.get_freeze_count()
        S.load(model.SerializeToString())
        assert gc.get_freeze_count() == theirs
    finally:
        gc.unfreeze()
