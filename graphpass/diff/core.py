"""``graphpass diff``: what changed between two models, grouped into the rewrites that did it.

After matching (``match.py``) every before-node is matched or *removed*, every after-node
matched or *added*. Removed and added nodes are grouped into rewrites by union-find:

* two removed nodes that share a tensor (one feeds the other), likewise two added nodes;
* an added node whose ``graphpass.fused_from`` names a removed node (provenance);
* an added node without provenance (a model graphpass did not write) and a removed node that
  read or feed the same matched tensor — unless that tensor fans out to more than ``_FANOUT``
  nodes (the network input would otherwise glue every rewrite that touches it into one).
Added nodes are joined by connectivity only when the same pass made them.

What counts as a change (``GraphDiff.equivalent`` is False): a removed, added or rewired node,
an attribute (schema defaults written out are not), a weight's content (full hash of its values,
whatever the storage: inline or external, raw_data or typed fields), a graph input or output added,
removed, renamed, retyped or carrying another tensor (outputs are matched by the tensor they carry,
so two swapped outputs are a change), an opset, a model-local function (body diffed like a graph),
a subgraph body; and anything the diff cannot compare (sparse initializers, training info), which
is listed in ``uncompared`` rather than taken as equal.

A group's label is its op multiset before → after ("Reshape×2+Transpose → Gather"), its pass
the ``graphpass.pass`` of its added nodes (or of the matched nodes it rewired); groups with the
same label and pass are listed once with their sites. Each group's estimated cost delta is the
sum of the cost model's per-node estimates of its added minus its removed nodes.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from typing import Any

import onnx

from graphpass.cost_model.target import DEFAULT_TARGET
from graphpass.diff.match import Matching, match
from graphpass.reporting import Report
from graphpass.diff.views import GraphView, function_graph, largest_difference

__all__ = ["GraphDiff", "Rewrite", "diff_graphs", "diff_models", "COST_MAX_NODES"]

#: The schema id of ``GraphDiff.to_dict()`` (documented in ``graphpass.diff.render``).
SCHEMA = "graphpass.diff/1"
_FANOUT = 4
#: Above this many nodes the per-node cost estimates are skipped (each costs a graph import).
COST_MAX_NODES = 20_000
_TD = "graphpass.ascend::TransData"


@dataclasses.dataclass
class Rewrite:
    """One kind of rewrite: removed ops -> added ops, by one pass, at one or more sites."""

    label: str
    pass_name: str
    sites: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    cost_delta_us: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "pass": self.pass_name, "count": len(self.sites), "sites": self.sites,
                "cost_delta_us": None if self.cost_delta_us is None else round(self.cost_delta_us, 3)}


@dataclasses.dataclass
class GraphDiff(Report):
    """The difference of two graphs (``subgraphs`` holds the bodies' own diffs); rendered by
    ``graphpass.diff.render`` (``to_table`` is its plain text)."""

    SCHEMA = SCHEMA

    before: GraphView
    after: GraphView
    matching: Matching
    removed: list[int]
    added: list[int]
    rewired: list[int]  # after-nodes matched but reading other tensors
    attribute_changes: list[dict[str, Any]]
    rewrites: list[Rewrite]
    groups: list[tuple[list[int], list[int]]]  # (removed before-nodes, added after-nodes) per site
    inputs: dict[str, list]
    outputs: dict[str, list]
    weights: dict[str, Any]
    subgraphs: list[dict[str, Any]]
    ops: dict[str, tuple[int, int]]
    transdata: dict[str, Any]
    cost: dict[str, Any] | None = None
    opsets: dict[str, Any] | None = None
    names: dict[str, str] = dataclasses.field(default_factory=dict)
    functions: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # model-local functions that differ
    uncompared: list[str] = dataclasses.field(default_factory=list)  # what could not be compared (never equal)

    @property
    def equivalent(self) -> bool:
        return not (self.removed or self.added or self.rewired or self.attribute_changes
                    or any(self.inputs.values()) or any(self.outputs.values())
                    or self.weights["removed"] or self.weights["added"] or self.weights["changed"]
                    or any(not s["diff"].equivalent for s in self.subgraphs)
                    or self.functions or self.uncompared
                    or (self.opsets and self.opsets["before"] != self.opsets["after"]))

    def to_dict(self) -> dict[str, Any]:
        from graphpass.diff import render

        return render.to_dict(self)

    def to_markdown(self) -> str:
        from graphpass.diff import render

        return render.to_markdown(self)

    def to_table(self) -> str:
        from graphpass.diff import render

        return render.to_text(self)


def _op_counts(g: onnx.GraphProto, out: collections.Counter | None = None) -> collections.Counter:
    from graphpass.diff.views import op_label

    out = out if out is not None else collections.Counter()
    for n in g.node:
        out[op_label(n.op_type, n.domain)] += 1
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _op_counts(a.g, out)
            for sub in a.graphs:
                _op_counts(sub, out)
    return out


def _shape(dt_shape) -> dict:
    dtype, shape = dt_shape
    return {"dtype": dtype, "shape": list(shape) if shape is not None else None}


def _io_changes(a: list, b: list, pairs: dict[str, str], positional: bool,
                carried: dict[str, str | None] | None = None) -> dict[str, list]:
    """Changes of graph inputs or outputs, given ``pairs`` (after name -> before name).

    ``renamed`` (top-level graphs only: a body's or function's parameters are positional, their
    names private) lists pairs under other names, ``reordered`` the after-order when the pairs
    come in another order; ``rewired`` outputs that now carry another
    tensor than the one they are paired with (``carried``: after output -> the before tensor it
    carries, when known)."""
    ta, tb = dict(a), dict(b)
    matched_a = set(pairs.values())
    changed, renamed, rewired = [], [], []
    names_a = set(ta)
    for nb, na in pairs.items():
        if ta[na] != tb[nb]:
            entry = {"name": nb, "before": _shape(ta[na]), "after": _shape(tb[nb])}
            if na != nb:
                entry["renamed_from"] = na
            changed.append(entry)
        if na != nb and not positional:
            renamed.append({"before": na, "after": nb, "swapped": nb in names_a})
        c = (carried or {}).get(nb)
        if c is not None and c != na:
            rewired.append({"name": nb, "before": na, "carries": c})
    out = {"removed": [n for n, _ in a if n not in matched_a], "added": [n for n, _ in b if n not in pairs],
           "changed": changed, "renamed": renamed}
    if not positional:  # the same inputs or outputs in another order: a caller reading them by position sees it
        kept = [n for n, _ in b if pairs.get(n) == n]
        kept_set = set(kept)
        out["reordered"] = kept if kept != [n for n, _ in a if n in kept_set] else []
    if carried is not None:
        out["rewired"] = rewired
    return out


def _output_pairs(a: GraphView, b: GraphView, m: Matching, positional: bool) -> tuple[dict, dict]:
    """Pairs of graph outputs (after -> before): by the tensor they carry (the matched producer),
    then by name, then by position among the rest; bodies and functions by position."""
    a_names = [n for n, _ in a.outputs]
    b_names = [n for n, _ in b.outputs]
    carried = {nb: m.tensor.get(nb) for nb in b_names}
    if positional:
        return dict(zip(b_names, a_names)), carried
    a_set, used, pairs = set(a_names), set(), {}
    for nb in b_names:
        c = carried[nb]
        if c in a_set and c not in used:
            pairs[nb] = c
            used.add(c)
    for nb in b_names:
        if nb not in pairs and nb in a_set and nb not in used:
            pairs[nb] = nb
            used.add(nb)
    pairs.update(zip([n for n in b_names if n not in pairs], [n for n in a_names if n not in used]))
    return pairs, carried


def _dtype_name(t: onnx.TensorProto) -> str:
    try:
        return onnx.TensorProto.DataType.Name(t.data_type).lower()
    except ValueError:
        return f"data_type {t.data_type}"


def _weight_changes(a: GraphView, b: GraphView, m: Matching) -> dict[str, Any]:
    wa = set(a.initializers)
    matched_w = set(m.weights.values())
    changed = sorted(nb for nb, na in m.weights.items() if a.digest[na] != b.digest[nb])
    details = []
    for nb in changed:
        na = m.weights[nb]
        ta, tb = a.initializers[na], b.initializers[nb]
        if ta.data_type == tb.data_type and list(ta.dims) == list(tb.dims):
            entry = {"name": nb, "dtype": _dtype_name(tb), "shape": list(tb.dims)}
            diff = largest_difference(ta, tb)
            entry.update(diff if diff is not None else {"max_abs_diff": None})
        else:
            entry = {"name": nb, "before": {"dtype": _dtype_name(ta), "shape": list(ta.dims)},
                     "after": {"dtype": _dtype_name(tb), "shape": list(tb.dims)}}
        if na != nb:
            entry["before_name"] = na
        details.append(entry)
    return {
        "removed": sorted(n for n in wa if n not in matched_w),
        "added": sorted(n for n in b.initializers if n not in m.weights),
        "changed": changed,
        "details": details,
        "count": [len(a.initializers), len(b.initializers)],
        "bytes": [sum(a.nbytes.values()), sum(b.nbytes.values())],
    }


class _UF:
    def __init__(self):
        self.parent: dict = {}

    def find(self, x):
        p = self.parent.setdefault(x, x)
        while p != self.parent[p]:
            self.parent[p] = self.parent[self.parent[p]]
            p = self.parent[p]
        self.parent[x] = p
        return p

    def union(self, x, y):
        rx, ry = self.find(x), self.find(y)
        if rx != ry:
            self.parent[ry] = rx


def _multiset(ops: list[str]) -> str:
    if not ops:
        return "∅"
    c = collections.Counter(ops)
    return "+".join(f"{op}×{k}" if k > 1 else op for op, k in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def diff_graphs(a_proto: onnx.GraphProto, b_proto: onnx.GraphProto,
                costs: tuple[dict[str, float], dict[str, float]] | None = None,
                outer: dict[str, str] | None = None,
                opsets: tuple[dict[str, int], dict[str, int]] | None = None,
                positional: bool = False) -> GraphDiff:
    """Diff two graphs. ``costs``: per-node estimates keyed by first output name (before, after);
    ``outer``: the enclosing graphs' tensor matching, for a subgraph body; ``opsets``: each side's
    domain -> version (for the ops' default attributes); ``positional``: inputs and outputs are
    parameters matched by position (a body's, a function's), their names not compared."""
    oa, ob = opsets or ({}, {})
    a, b = GraphView(a_proto, oa), GraphView(b_proto, ob)
    m = match(a, b, outer=outer, positional=positional)
    removed = [i for i in range(len(a.nodes)) if i not in m.b_of_a]
    added = [i for i in range(len(b.nodes)) if i not in m.a_of_b]
    rewired, attr_changes, subgraphs = [], [], []
    for ib, ia in sorted(m.a_of_b.items()):
        na, nb = a.nodes[ia], b.nodes[ib]
        mapped = [m.tensor.get(t, "\0" + t) for t in nb.inputs]
        if len(na.inputs) != len(nb.inputs) or na.operands(na.inputs) != nb.operands(mapped):
            rewired.append(ib)
        if na.key[1] != nb.key[1]:
            attr_changes.append({"node": nb.label, "op": nb.op, "attribute": "(outputs)",
                                 "before": na.key[1], "after": nb.key[1]})
        if na.attrs != nb.attrs:
            for k in sorted(set(na.attrs) | set(nb.attrs)):
                va, vb = na.attrs.get(k), nb.attrs.get(k)
                if va != vb and not (k in na.subgraphs and k in nb.subgraphs):
                    change = {"node": nb.label, "op": nb.op, "attribute": k, "before": _show(va), "after": _show(vb)}
                    if isinstance(va, tuple) and isinstance(vb, tuple) and va[:1] == vb[:1] == ("tensor",):
                        change.update(_tensor_attr_difference(a_proto.node[ia], b_proto.node[ib], k))
                    attr_changes.append(change)
        for k in sorted(set(na.subgraphs) & set(nb.subgraphs)):
            sub = diff_graphs(na.subgraphs[k], nb.subgraphs[k], costs, outer=m.tensor, opsets=opsets, positional=True)
            if not sub.equivalent:
                subgraphs.append({"node": nb.label, "op": nb.op, "attribute": k, "diff": sub})
    groups = _group(a, b, m, removed, added, rewired)
    rewrites = _rewrites(a, b, m, groups, costs)
    ops_a, ops_b = _op_counts(a_proto), _op_counts(b_proto)
    ops = {op: (ops_a.get(op, 0), ops_b.get(op, 0)) for op in sorted(set(ops_a) | set(ops_b)) if ops_a.get(op, 0) != ops_b.get(op, 0)}
    weights = _weight_changes(a, b, m)
    td = {"before": ops_a.get(_TD, 0), "after": ops_b.get(_TD, 0)}
    out_pairs, carried = _output_pairs(a, b, m, positional)
    d = GraphDiff(a, b, m, removed, added, rewired, attr_changes, rewrites, groups,
                  _io_changes(a.inputs, b.inputs, m.inputs, positional),
                  _io_changes(a.outputs, b.outputs, out_pairs, positional, carried),
                  weights, subgraphs, ops, td)
    for side, g in (("before", a), ("after", b)):
        d.uncompared += [f"sparse initializer '{n}' ({side}): sparse tensors are not compared" for n in g.sparse]
        d.uncompared += [f"{u} ({side})" for u in g.uncompared]
    return d


def _tensor_attr_difference(na: onnx.NodeProto, nb: onnx.NodeProto, name: str) -> dict[str, Any]:
    """A changed tensor attribute (a Constant's value) described as a changed weight is."""
    ta = next(x.t for x in na.attribute if x.name == name)
    tb = next(x.t for x in nb.attribute if x.name == name)
    if ta.data_type != tb.data_type or list(ta.dims) != list(tb.dims):
        return {"before": f"{_dtype_name(ta)}{list(ta.dims)}", "after": f"{_dtype_name(tb)}{list(tb.dims)}"}
    diff = largest_difference(ta, tb)
    return diff if diff is not None else {}


def _show(v) -> Any:
    if isinstance(v, tuple) and v and v[0] in ("tensor", "tensors", "graph", "graphs", "proto"):
        return f"<{v[0]}>"
    if isinstance(v, tuple) and len(v) == 2 and v[0] == "ref":
        return f"<ref {v[1]}>"
    if isinstance(v, tuple):
        return list(v)
    return v


def _group(a: GraphView, b: GraphView, m: Matching, removed: list[int], added: list[int],
           rewired: list[int]) -> list[tuple[list[int], list[int]]]:
    uf = _UF()
    rem, add = set(removed), set(added)
    for i in removed:
        uf.find(("a", i))
    for i in added:
        uf.find(("b", i))
    # within a side: removed (added) nodes that feed each other; added nodes only when the same
    # pass made both (a TransData next to a fused Conv is another rewrite)
    def made_by(i: int):
        return b.nodes[i].meta.get("graphpass.pass")

    # provenance: an added node made from removed ones claims them
    a_by_name = {n.name: n.index for n in a.nodes if n.name}
    claimed: set[int] = set()
    for i in added:
        raw = b.nodes[i].meta.get("graphpass.fused_from")
        if raw:
            try:
                names = json.loads(raw)
            except ValueError:
                names = []
            for name in names:
                j = a_by_name.get(name)
                if j is not None and j in rem:
                    uf.union(("b", i), ("a", j))
                    claimed.add(j)
    # removed nodes that fed each other (two nodes claimed by different rewrites stay apart)
    for i in rem:
        for t in a.nodes[i].inputs:
            p = a.producer.get(t)
            if p is not None and p[0] in rem and not (i in claimed and p[0] in claimed):
                uf.union(("a", i), ("a", p[0]))
    for i in add:
        for t in b.nodes[i].inputs:
            p = b.producer.get(t)
            if p is not None and p[0] in add and made_by(i) == made_by(p[0]):
                uf.union(("b", i), ("b", p[0]))
    # a removed and an added node at the same matched tensor (small fan-out only)
    touch: dict[str, list] = collections.defaultdict(list)
    for i in removed:
        n = a.nodes[i]
        for t in n.inputs + n.outputs:
            if t and len(a.consumers.get(t, ())) <= _FANOUT:
                touch[t].append(("a", i))
    b2a = m.tensor
    for i in added:
        if made_by(i):  # graphpass wrote it: provenance says what it replaced
            continue
        n = b.nodes[i]
        for t in n.inputs + n.outputs:
            ta = b2a.get(t)
            if ta and len(b.consumers.get(t, ())) <= _FANOUT:
                touch[ta].append(("b", i))
    # outputs of removed nodes that matched nodes read: the after-side reader is rewired to an added node
    for ib in rewired:
        ia = m.a_of_b[ib]
        for ta, tb in zip(a.nodes[ia].inputs, b.nodes[ib].inputs):
            pa, pb = a.producer.get(ta), b.producer.get(tb)
            if pa and pb and pa[0] in rem and pb[0] in add and not made_by(pb[0]):
                uf.union(("a", pa[0]), ("b", pb[0]))
    for items in touch.values():
        sides = {s for s, _ in items}
        if len(sides) == 2:
            for it in items[1:]:
                uf.union(items[0], it)
    comps: dict = collections.defaultdict(lambda: ([], []))
    for i in removed:
        comps[uf.find(("a", i))][0].append(i)
    for i in added:
        comps[uf.find(("b", i))][1].append(i)
    return [(sorted(r), sorted(ad)) for r, ad in comps.values()]


def _rewrites(a: GraphView, b: GraphView, m: Matching, groups, costs) -> list[Rewrite]:
    out: dict[tuple[str, str], Rewrite] = {}
    for rem, add in groups:
        label = f"{_multiset([a.nodes[i].op for i in rem])} → {_multiset([b.nodes[i].op for i in add])}"
        passes = collections.Counter(b.nodes[i].meta.get("graphpass.pass") for i in add if b.nodes[i].meta.get("graphpass.pass"))
        if not passes:  # pure removals: the pass that rewired the survivors, if recorded
            for i in rem:
                for t in a.nodes[i].outputs:
                    for c in a.consumers.get(t, ()):
                        ib = m.b_of_a.get(c)
                        if ib is not None and b.nodes[ib].meta.get("graphpass.pass"):
                            passes[b.nodes[ib].meta["graphpass.pass"]] += 1
        pass_name = passes.most_common(1)[0][0] if passes else "-"
        site = {"removed": [a.nodes[i].label for i in rem], "added": [b.nodes[i].label for i in add]}
        delta = None
        if costs is not None:
            ca, cb = costs
            delta = sum(cb.get(b.nodes[i].outputs[0], 0.0) for i in add if b.nodes[i].outputs) - \
                sum(ca.get(a.nodes[i].outputs[0], 0.0) for i in rem if a.nodes[i].outputs)
            site["cost_delta_us"] = round(delta, 3)
        r = out.setdefault((label, pass_name), Rewrite(label, pass_name, cost_delta_us=0.0 if costs is not None else None))
        r.sites.append(site)
        if delta is not None:
            r.cost_delta_us += delta
    return sorted(out.values(), key=lambda r: (-len(r.sites), r.label))


# -- models ------------------------------------------------------------------------------------

def _load(source, label: str) -> onnx.ModelProto:
    """The model as stored, checked as ``graphpass load`` checks it (external data files must exist
    and lie in the model's folder; they stay on disk and are hashed in chunks). A ModelProto is
    copied and a Model exported (portable, as ``save`` writes it): neither is changed."""
    from graphpass.errors import BadModelError
    from graphpass.ir.model import as_proto

    where = f"'{source}'" if isinstance(source, (str, os.PathLike)) else "<model>"
    try:
        return as_proto(source, stored=True, where=where)
    except BadModelError as e:
        raise BadModelError(f"{label} model {e}") from None


def _node_costs(model: onnx.ModelProto, target: str) -> tuple[dict[str, float], Any] | None:
    from graphpass.cost_model import get_target
    from graphpass.ir import model_io

    t = get_target(target)
    if not t.estimates:
        return None
    cm = t.cost_model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # from_proto changes the proto it imports
    try:
        graph = model_io.from_proto(copy)
    except Exception:  # noqa: BLE001 - a model the IR cannot take is still diffed, without costs
        return None
    from graphpass.passes.shape_proof import annotate, prove_shapes

    proof = prove_shapes(graph)  # the estimate of the shapes ATC would prove (open dims assumed, said so)
    per_node, report = cm.node_costs(proof.graph)
    return per_node, annotate(report, proof)


def diff_models(before, after, target: str = DEFAULT_TARGET, names: tuple[str, str] | None = None) -> GraphDiff:
    """Diff two models, each a path, bytes, an ``onnx.ModelProto`` or a :class:`graphpass.Model`
    (a Model is compared in the form ``save`` writes, portable); neither is changed. Unreadable
    or invalid models raise BadModelError naming them."""
    ma, mb = _load(before, "before"), _load(after, "after")
    n_nodes = max(len(ma.graph.node), len(mb.graph.node))
    costs = None
    cost_info: dict[str, Any] | None = None
    if target != "none" and n_nodes <= COST_MAX_NODES:
        ca, cb = _node_costs(ma, target), _node_costs(mb, target)
        if ca is not None and cb is not None:
            costs = (ca[0], cb[0])
            ra, rb = ca[1], cb[1]
            cost_info = {"target": target, "before_us": round(ra.total_us, 3), "after_us": round(rb.total_us, 3),
                         "transdata_before": ra.transdata, "transdata_after": rb.transdata,
                         "note": "cost-model estimates, not measurements"}
            if ra.assumed_dims or rb.assumed_dims:  # symbolic dims the estimates took a value for
                cost_info["assumed_dims"] = {"before": dict(ra.assumed_dims), "after": dict(rb.assumed_dims)}
    elif target != "none":
        cost_info = {"target": target, "skipped": f"graphs over {COST_MAX_NODES:,} nodes: per-node estimates skipped"}
    oa = {o.domain or "ai.onnx": o.version for o in ma.opset_import}
    ob = {o.domain or "ai.onnx": o.version for o in mb.opset_import}
    d = diff_graphs(ma.graph, mb.graph, costs, opsets=(oa, ob))
    d.functions = _function_changes(ma, mb, oa, ob)
    for side, mp in (("before", ma), ("after", mb)):
        if len(mp.training_info):
            d.uncompared.append(f"training info ({side}): not compared")
    d.cost = cost_info
    if cost_info and "transdata_before" in cost_info:
        ta, tb = cost_info.pop("transdata_before"), cost_info.pop("transdata_after")
        d.transdata.update({"implicit_before": ta.get("implicit", 0), "implicit_after": tb.get("implicit", 0),
                            "us_before": round(ta.get("us", 0.0), 3), "us_after": round(tb.get("us", 0.0), 3)})
    d.opsets = {"before": oa, "after": ob}
    d.names = {"before": names[0] if names else str(before if isinstance(before, (str, os.PathLike)) else "before"),
               "after": names[1] if names else str(after if isinstance(after, (str, os.PathLike)) else "after")}
    return d



def _function_changes(ma: onnx.ModelProto, mb: onnx.ModelProto, oa: dict, ob: dict) -> list[dict[str, Any]]:
    """Model-local functions (they define the ``graphpass.ascend`` device ops): added, removed, with
    another signature (attributes and their defaults, opsets), or a body that differs, diffed like a
    graph (parameters by position)."""
    def key(f):
        return (f.domain, f.name, f.overload)

    def label(f):
        return f"{f.domain}::{f.name}" + (f":{f.overload}" if f.overload else "")

    fa, fb = {key(f): f for f in ma.functions}, {key(f): f for f in mb.functions}
    out: list[dict[str, Any]] = []
    for k, f in fa.items():
        if k not in fb:
            out.append({"function": label(f), "change": "removed"})
    for k, g in fb.items():
        f = fa.get(k)
        if f is None:
            out.append({"function": label(g), "change": "added"})
            continue
        sig_a = (len(f.input), len(f.output), list(f.attribute), [a.SerializeToString() for a in f.attribute_proto],
                 sorted((o.domain or "ai.onnx", o.version) for o in f.opset_import))
        sig_b = (len(g.input), len(g.output), list(g.attribute), [a.SerializeToString() for a in g.attribute_proto],
                 sorted((o.domain or "ai.onnx", o.version) for o in g.opset_import))
        fo_a = {**oa, **{o.domain or "ai.onnx": o.version for o in f.opset_import}}
        fo_b = {**ob, **{o.domain or "ai.onnx": o.version for o in g.opset_import}}
        body = diff_graphs(function_graph(f), function_graph(g), opsets=(fo_a, fo_b), positional=True)
        if sig_a != sig_b:
            out.append({"function": label(g), "change": "signature", "diff": body})
        elif not body.equivalent:
            out.append({"function": label(g), "change": "body", "diff": body})
    return out
