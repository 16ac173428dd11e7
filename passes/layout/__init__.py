"""Layout: storage formats for every tensor, and the TransData between them."""

from graphpass.passes.layout.eliminate_transdata import EliminateTransData
from graphpass.passes.layout.propagate_layout import PropagateLayout

__all__ = ["EliminateTransData", "PropagateLayout"]
