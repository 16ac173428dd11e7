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
