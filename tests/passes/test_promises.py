"""Every pass declares what it promises about outputs: exact, or a named float-rounding tolerance."""

import graphpass.passes as passes
from graphpass.passes.framework.pass_base import Pass, Promise


def _pass_classes():
    return [c for c in vars(passes).values() if isinstance(c, type) and issubclass(c, Pass)]


def test_every_pass_declares_its_own_promise():
    classes = _pass_classes()
    assert len(classes) >= 26
    for cls in classes:
        assert "promise" in vars(cls), f"{cls.__name__} inherits or lacks its promise"
        promise = cls.promise
        assert isinstance(promise, Promise), cls.__name__
        assert promise.kind in ("exact", "tolerance", "opt-in"), cls.__name__
        if not promise.bounded:  # only a precision change the user opts into may have no bound
            assert not cls.default_enabled and cls.kind.value == "precision", cls.__name__
        if promise.exact:
            assert promise.rtol == promise.atol == 0.0, cls.__name__
        else:
            assert promise.reason and promise.name != "exact", cls.__name__
            assert 0 < promise.rtol < 0.1 and 0 <= promise.atol < 0.01, cls.__name__


def test_structural_passes_are_exact():
    # Rewrites that only move, drop or re-lay-out values can never need a tolerance.
    for name in ("eliminate_identity", "eliminate_dead_nodes", "merge_transposes", "fuse_channel_shuffle",
                 "fuse_gather_split", "propagate_layout", "eliminate_transdata", "hoist_loop_invariants"):
        cls = next(c for c in _pass_classes() if c.name == name)
        assert cls.promise.exact, name
