"""Every pass declares what it promises about outputs: exact, or a named float-rounding tolerance."""

import graphpass.passes as passes
from graphpass.passes.framework.pass_base import Pass, Promise


def _pass_classes():
    from graphpass.passes.framework.registry import all_passes

    return list(all_passes().values())


def test_every_pass_declares_its_own_promise():
    classes = _pass_classes()
    assert len(classes) >= 26
    for cls in classes:
        assert "promise" in vars(cls), f"{cls.__name__} inherits or lacks its promise"
        promise = cls.promise
        assert isinstance(promise, Promise), cls.__name__
        assert promise.kind in ("exact", "tolerance", "opt-in", "approximation"), cls.__name__
        if not promise.bounded:  # only a precision change or an approximation the user opts into has no bound
            assert not cls.default_enabled, cls.__name__
            assert cls.kind.value == "precision" or promise.approximate, cls.__name__
        if promise.approximate:  # claims no bound, loosens no check; says what it changes
            assert promise.rtol == promise.atol == 0.0 and promise.reason and promise.name != "exact", cls.__name__
        elif promise.exact:
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
