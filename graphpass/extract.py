"""``graphpass extract``: the subgraph between named tensors, as a model of its own.

The subgraph holds exactly the nodes the named outputs need, walking back from them until a
named input, a constant or a weight stops the walk. A node that reads a tensor of an enclosing
scope through a subgraph (an If branch, a Loop body) needs that tensor too. The named inputs
become the new graph's inputs, with the dtype and shape shape inference gave them at load; the
weights stay lazy (read from the model's external data one at a time when the result is written,
and written as external data again when the source had it), so a big model extracts in about the
memory of the part it keeps.

Refused, with one line naming the tensor (exit 2 in the CLI):
- a name that is no tensor of the main graph (or a weight given as an input);
- an output that needs a graph input not among the named inputs ("not reachable");
- a named input whose producer the outputs need for another of its outputs (two producers);
- an input or output whose dtype shape inference could not tell (the new graph must declare it).

Like onnx.utils.extract_model, but without loading the weights and with the checks above.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import onnx_graphsurgeon as gs

from graphpass.errors import UsageError
from graphpass.ir.graph import node_dependencies
from graphpass.ir.model import Model, as_model

__all__ = ["extract", "extract_file"]


def _names(arg: Sequence[str] | str, what: str) -> list[str]:
    names = [n.strip() for n in (arg.split(",") if isinstance(arg, str) else arg)]
    names = [n for n in names if n]
    if not names:
        raise UsageError(f"extract needs at least one {what} name")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"{what} '{dup[0]}' is named twice")
    return names


def extract(model: "Model | str | Path", input_names: Sequence[str] | str, output_names: Sequence[str] | str,
            max_memory: int | str | None = None) -> Model:
    """The subgraph of ``model`` from ``input_names`` to ``output_names`` as a new :class:`Model`
    (a path is loaded with ``max_memory``; a Model passed in is changed: pass a copy to keep it)."""
    ins, outs = _names(input_names, "input"), _names(output_names, "output")
    m = as_model(model, max_memory=max_memory)
    g = m.graph
    tensors = g.tensors()
    for name in ins + outs:
        if name not in tensors:
            raise UsageError(f"no tensor named '{name}' in the model's main graph")
    for name in ins:
        if isinstance(tensors[name], gs.Constant):
            raise UsageError(f"'{name}' is a weight (a constant), not a tensor the model computes: it cannot be an input")
    both = set(ins) & set(outs)
    if both:
        name = sorted(both)[0]
        raise UsageError(f"'{name}' is named both as an input and as an output")
    given = {id(tensors[n]) for n in ins}
    producer: dict[int, gs.Node] = {}
    for node in g.nodes:
        for t in node.outputs:
            producer[id(t)] = node
    needed: set[int] = set()  # ids of the nodes kept
    seen: set[int] = set(given)
    stack = [tensors[n] for n in outs]
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if isinstance(t, gs.Constant):
            continue
        node = producer.get(id(t))
        if node is None:
            raise UsageError(f"output(s) {','.join(outs)} need '{t.name}', a graph input that is not among the inputs: "
                             f"add it to input_names", option="input_names")
        if id(node) in needed:
            continue
        needed.add(id(node))
        for o in node.outputs:
            if id(o) in given:
                raise UsageError(f"input '{o.name}' is computed by node '{node.name or node.op}', which the outputs need "
                                 f"for another of its outputs: name that node's inputs instead")
        stack.extend(node_dependencies(node))
    for name in ins + outs:
        t = tensors[name]
        if t.dtype is None:
            raise UsageError(f"shape inference could not tell the dtype of '{name}': the extracted model must declare it")
    g.nodes = [n for n in g.nodes if id(n) in needed]
    new_inputs = []
    for name in ins:
        t = tensors[name]
        t.inputs.clear()  # its producer is not in the subgraph: a graph input now
        new_inputs.append(t)
    g.inputs = new_inputs
    g.outputs = [tensors[n] for n in outs]
    unused = [n for n in ins if not any(n == i.name for node in g.nodes for i in node_dependencies(node))
              and n not in outs]
    if unused:
        m.meta.setdefault("extract_notes", []).append(
            f"input(s) {', '.join(unused)} are not needed by the outputs (kept as inputs)")
    return m


def extract_file(source: str | Path, output: str | Path, input_names: Sequence[str] | str,
                 output_names: Sequence[str] | str, max_memory: int | str | None = None) -> Model:
    """:func:`extract` from a file, written to ``output`` (atomically, checked; external data as
    the source had it)."""
    from graphpass.ir import serialize

    m = extract(Path(source), input_names, output_names, max_memory=max_memory)
    serialize.save(m.graph, output)
    return m
