"""Placement and loop passes."""

from graphpass.passes.placement.hoist_loop_invariants import HoistLoopInvariants
from graphpass.passes.placement.place_and_sink import PlaceAndSink

__all__ = ["HoistLoopInvariants", "PlaceAndSink"]
