"""Precision passes."""

from graphpass.passes.precision.mixed_precision import MixedPrecision

__all__ = ["MixedPrecision"]
