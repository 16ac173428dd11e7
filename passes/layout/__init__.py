"""Layout: storage formats for every tensor, and the TransData between them."""

from graphpass.passes.layout.propagate_layout import PropagateLayout

__all__ = ["PropagateLayout"]
