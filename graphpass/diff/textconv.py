"""``graphpass textconv MODEL``: a canonical, line-oriented text form of a model for git.

git shows it instead of "Binary files differ" once ``.gitattributes`` says ``*.onnx diff=onnx``
and ``diff.onnx.textconv`` names ``graphpass textconv`` (``graphpass install-git`` writes both).

The text is a function of the model alone, never of the order the exporter wrote it in:

* a header: ``ir_version``, producer, model domain/version, opsets (sorted), metadata (sorted),
  then the graph's inputs and outputs with dtype and shape (in the graph's order: the order is
  part of the signature);
* one node a line, in topological order; among the nodes ready at a step the one with the
  smallest key goes first: (first output name, op, domain, node name) by default, with
  ``canonical_names`` (op, domain, attributes, inputs) -- a key of structure alone. A line is
  ``Op "name" (in: dtype[shape], ...) -> (out: dtype[shape]) attr=value ...``; attributes equal
  to the schema's default are left out, as the diff engine leaves them out;
* each initializer as ``init name dtype[shape] blake2b:<hash>`` (a full hash of its canonical
  little-endian values, streamed: the same for raw_data, typed fields or external data); never
  the values. External data by location and the hash of its bytes (``hash unavailable`` with the
  reason when the file is not next to the model, as for git's temporary copies of old blobs);
* subgraph bodies (If/Loop/Scan) indented under their node, model-local functions in a
  ``function`` section with their bodies indented.

``canonical_names`` names tensors by structure: the k-th node of an op type in topological order
is ``conv3``; its outputs ``conv3`` (one) or ``conv3.0``, ``conv3.1``; an initializer is named
after its first consumer and slot (``conv3.w1``). Graph inputs and outputs keep their names (they
are the model's signature). A re-export that only renames inner tensors then prints the same
text; removing a node renumbers only the later nodes of its own op type.

Not shown (noise in review, or not part of what the model computes): doc strings, node
``metadata_props`` (graphpass provenance), value_info of tensors nobody reads.
Shapes are the stored ones, completed by onnx shape inference on a weightless copy where the
file has none.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import json
import os
import re
from pathlib import Path
from typing import Any

import onnx
from onnx import AttributeProto

from graphpass.errors import BadModelError
from graphpass.diff.views import _schema_defaults, _attr_value, _type_of, weight_digest

__all__ = ["textconv", "textconv_stub", "FORMAT", "MAX_DEPTH"]

#: The first line of every textconv text; bumped when the format changes.
FORMAT = "# graphpass textconv 1"
#: Subgraphs nested deeper than this are refused (a hostile file must not exhaust the stack).
MAX_DEPTH = 64


_PLAIN = re.compile(r"[A-Za-z0-9._/:\-\[\]#@]+")


@functools.lru_cache(maxsize=1 << 16)
def _q(s: str) -> str:
    """A name as text: bare when it is plain, JSON-quoted otherwise (spaces, quotes, newlines)."""
    return s if _PLAIN.fullmatch(s) else json.dumps(s, ensure_ascii=True)


def _type_text(t: tuple[str, tuple | None] | None) -> str:
    if t is None:
        return "?"
    dtype, dims = t
    if dims is None:
        return dtype
    return f"{dtype}[{','.join(str(d) for d in dims)}]"


@functools.lru_cache(maxsize=256)
def _tensor_dtype(data_type: int) -> str:
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(data_type).name
    except Exception:  # noqa: BLE001 - bfloat16/float8 map to a numpy type; unknown ones do not
        name = onnx.TensorProto.DataType.Name(data_type) if data_type in onnx.TensorProto.DataType.values() else None
        return name.lower() if name else f"elem_type {data_type}"


def _digest(t: onnx.TensorProto, external_ok: bool) -> str:
    is_ext = t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL
    if is_ext and not external_ok:
        return "hash unavailable"
    try:
        return "blake2b:" + weight_digest(t)[2]
    except (OSError, ValueError, KeyError) as e:
        return f"hash unavailable ({type(e).__name__})"


def _init_text(t: onnx.TensorProto, name: str, ext: dict[int, str], external_ok: bool) -> str:
    shape = f"{_tensor_dtype(t.data_type)}[{','.join(str(d) for d in t.dims)}]"
    where = f" external:{_q(ext[id(t)])}" if id(t) in ext else ""
    return f"init {_q(name)} {shape}{where} {_digest(t, external_ok)}"


def _attr_text(value: Any) -> str:
    if isinstance(value, tuple) and value and value[0] == "tensor":
        dt, dims, h = value[1]
        return f"tensor({_tensor_dtype(dt)}[{','.join(str(d) for d in dims)}] blake2b:{h})"
    if isinstance(value, tuple) and value and value[0] == "tensors":
        return "[" + ",".join(_attr_text(("tensor", v)) for v in value[1]) + "]"
    if isinstance(value, tuple) and value and value[0] in ("graph", "graphs"):
        return "<body>"
    if isinstance(value, tuple) and value and value[0] == "ref":
        return f"@{value[1]}"
    if isinstance(value, tuple) and value and value[0] == "proto":
        return "proto:" + hashlib.blake2b(value[1], digest_size=8).hexdigest()
    if isinstance(value, tuple):
        return "[" + ",".join(_attr_text(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=True)
    return str(value)


class _Printer:
    def __init__(self, model: onnx.ModelProto, canonical: bool, external_ok: bool, ext: dict[int, str],
                 inferred: dict[str, tuple]):
        self.model = model
        self.canonical = canonical
        self.external_ok = external_ok
        self.ext = ext
        self.inferred = inferred
        self.opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
        self.local_functions = {(f.domain, f.name) for f in model.functions}
        self.lines: list[str] = []

    # -- one graph -----------------------------------------------------------------------------
    def graph(self, g: onnx.GraphProto, indent: str, depth: int, outer_types: dict[str, tuple],
              outer_names: dict[str, str], opsets: dict[str, int] | None = None) -> None:
        if depth > MAX_DEPTH:
            raise BadModelError(f"subgraphs nested deeper than {MAX_DEPTH}")
        opsets = opsets or self.opsets
        out = self.lines
        inits = {t.name: t for t in g.initializer}
        types: dict[str, tuple] = dict(outer_types)
        if depth == 0:
            types.update(self.inferred)
        for vi in g.value_info:
            t = _type_of(vi)
            if t[0] != "unknown":
                types[vi.name] = t
        for vi in list(g.input) + list(g.output):
            types[vi.name] = _type_of(vi)
        for t in g.initializer:
            types[t.name] = (_tensor_dtype(t.data_type), tuple(t.dims))
        names: dict[str, str] = dict(outer_names)
        signature = {vi.name for vi in g.input} | {vi.name for vi in g.output}
        for vi in g.input:
            if vi.name not in inits:
                out.append(f"{indent}input {_q(vi.name)} {_type_text(types.get(vi.name))}")
        for vi in g.output:
            out.append(f"{indent}output {_q(vi.name)} {_type_text(types.get(vi.name))}")

        nodes = list(g.node)
        attrs = [self._attrs(n, opsets) for n in nodes]
        producer: dict[str, int] = {}
        for i, n in enumerate(nodes):
            for o in n.output:
                if o:
                    producer.setdefault(o, i)
        consumers: dict[str, list[int]] = {}
        waiting = [0] * len(nodes)
        for i, n in enumerate(nodes):
            deps = {producer[x] for x in self._reads(n) if x in producer and producer[x] != i}
            waiting[i] = len(deps)
            for p in deps:
                consumers.setdefault(p, []).append(i)

        def key(i: int) -> tuple:
            n = nodes[i]
            if not self.canonical:
                return (tuple(n.output), n.op_type, n.domain, n.name, b"" if n.output else n.SerializeToString())
            ins = tuple(names.get(x) or self._init_key(inits.get(x), x) for x in n.input)
            return (n.op_type, n.domain, repr(attrs[i]), ins, len(n.output))

        ready = [(key(i), i) for i in range(len(nodes)) if waiting[i] == 0]
        heapq.heapify(ready)
        order: list[int] = []
        done = [False] * len(nodes)
        counts: dict[str, int] = {}
        while True:
            while ready:
                _, i = heapq.heappop(ready)
                done[i] = True
                order.append(i)
                self._name_outputs(nodes[i], names, counts, signature)
                for c in consumers.get(i, ()):
                    waiting[c] -= 1
                    if waiting[c] == 0:
                        heapq.heappush(ready, (key(c), c))
            rest = [i for i in range(len(nodes)) if not done[i]]
            if not rest:
                break
            # a cycle (an invalid model): break it at the smallest key and go on
            out.append(f"{indent}# cycle: the next nodes are not in topological order")
            k = min(rest, key=key)
            waiting[k] = 0
            heapq.heappush(ready, (key(k), k))

        init_names: dict[str, str] = {}
        for i in order:
            n = nodes[i]
            for j, x in enumerate(n.input):
                if x in inits and x not in init_names and x not in names:
                    init_names[x] = f"{names.get(n.output[0], '') if n.output else ''}.w{j}" if self.canonical else x
        for x in inits:
            if x not in init_names:
                init_names[x] = x if not self.canonical else "unused:" + _digest(inits[x], self.external_ok)
        names.update({k: v for k, v in init_names.items() if k not in names})

        for i in order:
            n = nodes[i]
            out.append(indent + self._node_line(n, attrs[i], types, names))
            for aname, bodies in self._bodies(n):
                for label, body in bodies:
                    out.append(f"{indent}  graph {_q(aname)}{label}:")
                    self.graph(body, indent + "    ", depth + 1, types, names, opsets)
        for x in sorted(inits, key=lambda x: (names.get(x, x), x)):
            out.append(indent + _init_text(inits[x], names.get(x, x), self.ext, self.external_ok))
        for s in sorted(g.sparse_initializer, key=lambda s: s.values.name):
            out.append(f"{indent}sparse_init {_q(s.values.name)} dims={list(s.dims)} values "
                       f"{_digest(s.values, self.external_ok)} indices {_digest(s.indices, self.external_ok)}")

    @staticmethod
    def _reads(n: onnx.NodeProto) -> set[str]:
        """Tensors a node reads, those its bodies read from the enclosing scope included."""
        reads = {x for x in n.input if x}
        stack = [a.g for a in n.attribute if a.type == AttributeProto.GRAPH]
        stack += [g for a in n.attribute if a.type == AttributeProto.GRAPHS for g in a.graphs]
        seen = 0
        while stack and seen < 100_000:
            g = stack.pop()
            seen += 1
            for m in g.node:
                reads.update(x for x in m.input if x)
                stack += [a.g for a in m.attribute if a.type == AttributeProto.GRAPH]
                stack += [b for a in m.attribute if a.type == AttributeProto.GRAPHS for b in a.graphs]
        return reads

    def _init_key(self, t: onnx.TensorProto | None, name: str) -> str:
        if t is None:
            return "?" + name if name else ""  # an outer-scope or dangling name
        return f"w:{t.data_type}:{tuple(t.dims)}"

    def _name_outputs(self, n: onnx.NodeProto, names: dict[str, str], counts: dict[str, int],
                      signature: set[str]) -> None:
        if not self.canonical:
            for o in n.output:
                names.setdefault(o, o)
            return
        base = n.op_type.lower() if not n.domain or n.domain == "ai.onnx" else f"{n.domain}.{n.op_type}".lower()
        k = counts.get(base, 0)
        counts[base] = k + 1
        for j, o in enumerate(n.output):
            if not o:
                continue
            if o in signature:
                names[o] = o
            else:
                names[o] = f"{base}{k}" if len(n.output) == 1 else f"{base}{k}.{j}"

    def _attrs(self, n: onnx.NodeProto, opsets: dict[str, int]) -> list[tuple[str, Any]]:
        version = opsets.get(n.domain or "ai.onnx")
        defaults = _schema_defaults(n.op_type, n.domain, version) if version else {}
        out = []
        for a in n.attribute:
            try:
                v = _attr_value(a)
            except Exception:  # noqa: BLE001 - a malformed attribute: shown by the hash of its bytes
                v = ("proto", a.SerializeToString())
            if a.name in defaults and defaults[a.name] == v:
                continue
            out.append((a.name, v))
        return sorted(out, key=lambda kv: kv[0])

    @staticmethod
    def _bodies(n: onnx.NodeProto):
        for a in sorted(n.attribute, key=lambda a: a.name):
            if a.type == AttributeProto.GRAPH:
                yield a.name, [("", a.g)]
            elif a.type == AttributeProto.GRAPHS:
                yield a.name, [(f"[{k}]", g) for k, g in enumerate(a.graphs)]

    def _node_line(self, n: onnx.NodeProto, attrs, types, names) -> str:
        op = _q(n.op_type) if n.domain in ("", "ai.onnx") else f"{_q(n.domain)}::{_q(n.op_type)}"
        if (n.domain, n.op_type) in self.local_functions:
            op += " (function)"
        ins = ", ".join(f"{_q(names.get(x, x))}: {_type_text(types.get(x))}" if x else "-" for x in n.input)
        outs = ", ".join(f"{_q(names.get(x, x))}: {_type_text(types.get(x))}" if x else "-" for x in n.output)
        label = "" if self.canonical or not n.name else f" {_q(n.name)}"
        attr_text = "".join(f" {_q(k)}={_attr_text(v)}" for k, v in attrs)
        return f"{op}{label} ({ins}) -> ({outs}){attr_text}"

    # -- the model -----------------------------------------------------------------------------
    def model_text(self) -> str:
        m, out = self.model, self.lines
        out.append(FORMAT + (" (canonical names)" if self.canonical else ""))
        out.append(f"ir_version {m.ir_version}")
        if m.producer_name or m.producer_version:
            out.append(f"producer {json.dumps(m.producer_name)} {json.dumps(m.producer_version)}")
        if m.domain or m.model_version:
            out.append(f"model domain={json.dumps(m.domain)} version={m.model_version}")
        for domain, version in sorted(self.opsets.items()):
            out.append(f"opset {_q(domain)} {version}")
        for p in sorted(m.metadata_props, key=lambda p: (p.key, p.value)):
            out.append(f"metadata {json.dumps(p.key)} = {json.dumps(p.value)}")
        g = m.graph
        out.append(f"graph {_q(g.name)}: {len(g.node)} nodes, {len(g.initializer)} initializers")
        self.graph(g, "", 0, {}, {})
        for f in sorted(m.functions, key=lambda f: (f.domain, f.name, f.overload)):
            fname = f"{_q(f.domain)}::{_q(f.name)}" + (f":{_q(f.overload)}" if f.overload else "")
            out.append(f"function {fname}({', '.join(map(_q, f.input))}) -> ({', '.join(map(_q, f.output))})"
                       + (f" attributes={json.dumps(list(f.attribute))}" if len(f.attribute) else ""))
            fops = {**self.opsets, **{o.domain or "ai.onnx": o.version for o in f.opset_import}}
            body = onnx.helper.make_graph(list(f.node), f.name, [], [])
            self.graph(body, "  ", 1, {}, {x: x for x in f.input}, fops)
        if len(m.training_info):
            out.append(f"training_info {len(m.training_info)} (not shown)")
        return "\n".join(out) + "\n"


def _read(source) -> tuple[onnx.ModelProto, Path | None]:
    from graphpass.ir import limits
    from graphpass.ir.files import read_regular_file
    from graphpass.ir.validate import parse

    if isinstance(source, onnx.ModelProto):
        return source, None
    if isinstance(source, (bytes, bytearray)):
        return parse(bytes(source), "<bytes>"), None
    path = Path(source)
    return parse(read_regular_file(path, limits.resolve_max_memory(None), "model"), str(path)), path


def _sort_nodes(g: onnx.GraphProto) -> None:
    """``g``'s nodes in a topological order (Kahn, file order among the ready), in place; left as
    they are when they already are in one, or on a cycle."""
    nodes = list(g.node)
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps = [{producer[x] for x in _Printer._reads(n) if x in producer and producer[x] != i} for i, n in enumerate(nodes)]
    if all(d < i for i, ds in enumerate(deps) for d in ds):
        return
    users: dict[int, list[int]] = {}
    for i, ds in enumerate(deps):
        for d in ds:
            users.setdefault(d, []).append(i)
    waiting = [len(ds) for ds in deps]
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        return
    del g.node[:]
    g.node.extend(nodes[i] for i in order)


def textconv(source, canonical_names: bool = False) -> str:
    """The canonical text of a model (a path, bytes or ModelProto; never changed).

    Raises:
        BadModelError: ``source`` is not an ONNX model at all (one line saying why). A model that
            parses but is invalid is still printed, with a ``# warning:`` line saying why.
    """
    from graphpass.ir.external import _external_tensors, _load_external_data
    from graphpass.ir.inference import infer_shapes
    from graphpass.ir.validate import _validate_at

    model, path = _read(source)
    if isinstance(source, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        model = copy
    warnings: list[str] = []
    ext: dict[int, str] = {}
    for t in _external_tensors(model):
        ext[id(t)] = next((e.value for e in t.external_data if e.key == "location"), "")
    external_ok = True
    if ext:
        try:
            _load_external_data(model, path.resolve().parent if path else None, str(path or "model"), lazy=True)
        except BadModelError as e:
            external_ok = False
            warnings.append(f"external data not read, hashes unavailable: {str(e).split(': ', 1)[-1]}")
    try:
        _validate_at(model, "model")
    except BadModelError as e:
        warnings.append(f"invalid model: {str(e).split(': ', 1)[-1]}")
    except RecursionError:
        raise BadModelError("subgraphs nested too deeply to read") from None
    inferred: dict[str, tuple] = {}
    g = model.graph
    known = {vi.name for vi in list(g.input) + list(g.output) + list(g.value_info)} | {t.name for t in g.initializer}
    if not warnings and any(o and o not in known for n in g.node for o in n.output):
        import logging

        quiet = logging.getLogger("graphpass.ir.inference")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            _sort_nodes(g)  # onnx infers in file order: an exporter's shuffled order would leave shapes unknown
            result = infer_shapes(model)
            inferred = {vi.name: _type_of(vi) for vi in result.graph.value_info}
        except Exception:  # noqa: BLE001 - shapes are advisory here: '?' where unknown
            inferred = {}
        finally:
            quiet.setLevel(level)
    printer = _Printer(model, canonical_names, external_ok, ext, inferred)
    try:
        text = printer.model_text()
    except RecursionError:
        raise BadModelError("subgraphs nested too deeply to read") from None
    if warnings:
        head, _, rest = text.partition("\n")
        text = head + "\n" + "".join(f"# warning: {w}\n" for w in warnings) + rest
    return text


def textconv_stub(path: str | os.PathLike, reason: str) -> str:
    """What ``textconv --lenient`` prints for a file that is no model: the reason, its size and a
    hash of its bytes, so git still shows that (and how) it changed."""
    h = hashlib.blake2b(digest_size=16)
    size = 0
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
                size += len(block)
        what = f"{size} bytes blake2b:{h.hexdigest()}"
    except OSError as e:
        what = f"unreadable ({e.strerror})"
    return f"{FORMAT}\n# not an ONNX model: {reason}\nfile {what}\n"
