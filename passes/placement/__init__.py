"""Placement and loop passes."""

from graphpass.passes.placement.hoist_loop_invariants import HoistLoopInvariants

__all__ = ["HoistLoopInvariants"]
