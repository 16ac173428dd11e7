"""``graphpass concat``: two models joined into one, outputs of the first feeding inputs of the second.

What auto_optimizer's ``concat_graph`` and ``onnx.compose.merge_models`` do, on graphpass's own
model (weights stay lazy: two big models concatenate in about the memory of their graphs):

- ``io_map`` pairs ``(output of the first, input of the second)``; each named input of the second
  is replaced by that output (same element type; static dims that disagree are refused);
- inputs: the first's, then the second's that ``io_map`` does not feed; outputs: the second's,
  then the first's that ``io_map`` does not consume (``keep_outputs``: these too);
- a name of the second model (tensor, node, function) that the first uses too gets ``prefix``
  (default ``b/``), everywhere, its subgraphs included; the result has one name per value;
- opset imports: one version per domain (two different versions of a domain are refused: convert
  one model first), functions of both (two different bodies under one name are refused).

Refused, with one line naming the thing (exit 2 in the CLI): a name in ``io_map`` that is not an
output of the first or an input of the second, an input fed twice, a type mismatch, an opset
conflict, a name still clashing after the prefix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import onnx_graphsurgeon as gs

from graphpass.errors import UsageError
from graphpass.ir.graph import iter_graphs, replace_uses
from graphpass.ir.model import Model, as_model

__all__ = ["concat", "concat_files", "parse_io_map"]


def parse_io_map(spec: str | Sequence[str] | Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """``"a:x,b:y"`` (or a list of ``"a:x"`` or of pairs) -> ``[("a", "x"), ("b", "y")]``."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    pairs = []
    for item in items:
        if isinstance(item, (tuple, list)):
            pair = tuple(item)
        else:
            item = item.strip()
            if not item:
                continue
            if item.count(":") != 1:
                raise UsageError(f"io map entry '{item}' is not OUTPUT:INPUT", option="io_map")
            pair = tuple(s.strip() for s in item.split(":"))
        if len(pair) != 2 or not all(pair):
            raise UsageError(f"io map entry {item!r} is not an (output, input) pair", option="io_map")
        pairs.append(pair)
    if not pairs:
        raise UsageError("concat needs at least one OUTPUT:INPUT pair to connect the models", option="io_map")
    return pairs


def _all_names(m: Model) -> tuple[set[str], set[str]]:
    """(tensor names, node names) of every graph of ``m``."""
    tensors, nodes = set(), set()
    for g in iter_graphs(m.graph):
        for n in g.nodes:
            if n.name:
                nodes.add(n.name)
            tensors.update(t.name for t in list(n.inputs) + list(n.outputs) if t.name)
        tensors.update(t.name for t in list(g.inputs) + list(g.outputs) if t.name)
    return tensors, nodes


def _elem(dtype) -> int | None:
    from graphpass.ir.device_ops import elem_type

    try:
        return elem_type(dtype) if dtype is not None else None
    except (TypeError, ValueError):
        return None


def _elem_name(elem: int) -> str:
    from onnx import TensorProto, helper

    try:
        return str(np.dtype(helper.tensor_dtype_to_np_dtype(elem)))
    except (TypeError, ValueError, KeyError):
        return TensorProto.DataType.Name(elem).lower()


def _dims_clash(a, b) -> bool:
    if a is None or b is None:
        return False
    if len(a) != len(b):
        return True
    return any(isinstance(x, (int, np.integer)) and isinstance(y, (int, np.integer)) and x >= 0 and y >= 0 and x != y
               for x, y in zip(a, b))


def concat(first: "Model | str | Path", second: "Model | str | Path", io_map, *, prefix: str = "b/",
           keep_outputs: bool = False, max_memory: int | str | None = None) -> Model:
    """The model of ``first`` then ``second`` joined along ``io_map`` (see the module docstring).
    Models passed in are changed (their graphs are moved into the result): pass copies to keep them."""
    pairs = parse_io_map(io_map)
    a = as_model(first, max_memory=max_memory)
    b = as_model(second, max_memory=max_memory)
    a.budget.require(b.budget.held, "the two models together")  # one join, one budget
    ga, gb = a.graph, b.graph
    outs_a = {t.name: t for t in ga.outputs}
    ins_b = {t.name: t for t in gb.inputs}
    fed: dict[str, str] = {}
    for out, inp in pairs:
        if out not in outs_a:
            raise UsageError(f"'{out}' is not an output of the first model (its outputs: "
                             f"{', '.join(sorted(outs_a)) or 'none'})", option="io_map")
        if inp not in ins_b:
            raise UsageError(f"'{inp}' is not an input of the second model (its inputs: "
                             f"{', '.join(sorted(ins_b)) or 'none'})", option="io_map")
        if inp in fed:
            raise UsageError(f"input '{inp}' of the second model is fed twice ('{fed[inp]}' and '{out}')", option="io_map")
        fed[inp] = out
        ta, tb = outs_a[out], ins_b[inp]
        kind_a, kind_b = getattr(ta, "type", "tensor"), getattr(tb, "type", "tensor")
        if kind_a != kind_b:
            raise UsageError(f"'{out}' is a {kind_a} but '{inp}' takes a {kind_b}")
        ea, eb = _elem(ta.dtype), _elem(tb.dtype)
        if ea is not None and eb is not None and ea != eb:
            raise UsageError(f"'{out}' is {_elem_name(ea)} but '{inp}' takes {_elem_name(eb)}")
        if _dims_clash(ta.shape, tb.shape):
            raise UsageError(f"'{out}' has shape {list(ta.shape)} but '{inp}' takes {list(tb.shape)}")
        if any(o is tb for o in gb.outputs):
            raise UsageError(f"input '{inp}' of the second model is also its output: feeding it would leave an "
                             f"output nothing computes", option="io_map")
    imports = _merged_imports(a, b)
    # names of the second that the first uses too get the prefix, everywhere
    names_a, nodes_a = _all_names(a)
    names_b0, _ = _all_names(b)
    connected = {id(ins_b[i]) for i in fed}
    renamed = 0
    defaults = {}
    for g in iter_graphs(gb):
        for t in list(g.tensors().values()):
            if id(t) in connected or not t.name or t.name not in names_a:
                continue
            new = prefix + t.name
            if new in names_a or new in names_b0:
                raise UsageError(f"'{t.name}' of the second model would become '{new}', a name already taken: choose "
                                 f"another prefix", option="prefix")
            if t.name in b.input_defaults:
                defaults[new] = b.input_defaults[t.name]
            t.name = new
            renamed += 1
        for n in g.nodes:
            if n.name and n.name in nodes_a:
                n.name = prefix + n.name
    names_b, _ = _all_names(b)
    clash = sorted((names_b - {n for n in fed}) & names_a)
    if clash:
        raise UsageError(f"name '{clash[0]}' is in both models even with the prefix '{prefix}': choose another prefix",
                         option="prefix")
    # join: each fed input of the second reads the first's output
    for inp, out in fed.items():
        replace_uses(ins_b[inp], outs_a[out])
    for g in iter_graphs(gb):  # a body of the second reading a fed input by name reads the output now
        for n in g.nodes:
            n.inputs = [outs_a[fed[t.name]] if id(t) in connected else t for t in n.inputs]
    consumed = set(fed.values())
    ga.nodes = list(ga.nodes) + list(gb.nodes)
    ga.inputs = list(ga.inputs) + [t for t in gb.inputs if id(t) not in connected]
    ga.outputs = list(gb.outputs) + [t for t in outs_a.values() if keep_outputs or t.name not in consumed]
    ga.functions = _merged_functions(ga.functions, gb.functions)
    ga.opset = imports.get("", ga.opset)
    a.opset_imports = imports
    a.ir_version = max(a.ir_version or 0, b.ir_version or 0) or a.ir_version
    # an input of the second with an initializer default keeps it (unless the first feeds it)
    for name, value in b.input_defaults.items():
        if name in fed:
            continue
        a.input_defaults.setdefault(name, value)
    a.input_defaults.update(defaults)
    for k in [k for k in a.input_defaults if k in defaults and k not in {t.name for t in ga.inputs}]:
        del a.input_defaults[k]
    for k, v in b.metadata_props.items():
        a.metadata_props.setdefault(k, v)
    from graphpass.ir.serialize import EXTERNAL_LAYOUT

    if a.meta.get(EXTERNAL_LAYOUT) is None and b.meta.get(EXTERNAL_LAYOUT) is not None:
        a.meta[EXTERNAL_LAYOUT] = b.meta[EXTERNAL_LAYOUT]  # external data where either model had it
    ga.name = f"{ga.name or 'first'}_{gb.name or 'second'}"
    a.meta.setdefault("concat_notes", []).append(
        f"{len(fed)} connection(s); {renamed} name(s) of the second model prefixed with '{prefix}'")
    return a


def _merged_imports(a: Model, b: Model) -> dict[str, int]:
    def norm(d: dict[str, int]) -> dict[str, int]:
        return {("" if k == "ai.onnx" else k): v for k, v in d.items()}

    out = norm(a.opset_imports)
    for domain, version in norm(b.opset_imports).items():
        have = out.get(domain)
        if have is not None and have != version:
            which = "the default domain" if domain in ("", "ai.onnx") else f"domain '{domain}'"
            raise UsageError(f"the models import {which} at opset {have} and {version}: convert one first "
                             f"(onnx.version_converter) so both use one version")
        out[domain] = version
    return out


def _merged_functions(fa, fb) -> list:
    out = list(fa)
    seen = {(f.domain, f.name): f for f in fa}
    for f in fb:
        key = (f.domain, f.name)
        if key in seen:
            if _fn_key(seen[key]) != _fn_key(f):
                raise UsageError(f"both models define function '{f.domain}::{f.name}', with different bodies")
            continue
        out.append(f)
        seen[key] = f
    return out


def _fn_key(f) -> tuple:
    """A function as two models can share it: its interface, attributes and every node's op,
    domain, wiring (by name) and attributes."""
    def attrs(n) -> tuple:
        return tuple(sorted((k, repr(v)) for k, v in n.attrs.items()))

    return (tuple(t.name for t in f.inputs), tuple(t.name for t in f.outputs), tuple(getattr(f, "attrs", {}) or {}),
            tuple((n.op, n.domain or "", tuple(t.name for t in n.inputs), tuple(t.name for t in n.outputs), attrs(n))
                  for n in f.nodes),
            getattr(f, "doc_string", "") or "")


def concat_files(first: str | Path, second: str | Path, output: str | Path, io_map, *, prefix: str = "b/",
                 keep_outputs: bool = False, max_memory: int | str | None = None) -> Model:
    """:func:`concat` of two files, written to ``output`` (atomically, checked; external data
    where either model had it)."""
    from graphpass.ir import serialize

    m = concat(Path(first), Path(second), io_map, prefix=prefix, keep_outputs=keep_outputs, max_memory=max_memory)
    serialize.save(m.graph, output)
    return m
