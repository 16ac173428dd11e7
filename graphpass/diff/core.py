"""``graphpass diff``: what changed between two models, grouped into the rewrites that did it.

After matching (``match.py``) every before-node is matched or *removed*, every after-node
matched or *added*. Removed and added nodes are grouped into rewrites by union-find:

* two removed nodes that share a tensor (one feeds the other), likewise two added nodes;
* an added node whose ``graphpass.fused_from`` names a removed node (provenance);
* an added node without provenance (a model graphpass did not write) and a removed node that
  read or feed the same matched tensor — unless that tensor fans out to more than ``_FANOUT``
  nodes (the network input would otherwise glue every rewrite that touches it into one).
Added nodes are joined by connectivity only when the same pass made them.

A group's label is its op multiset before → after ("Reshape×2+Transpose → Gather"), its pass
the ``graphpass.pass`` of its added nodes (or of the matched nodes it rewired); groups with the
same label and pass are listed once with their sites. Each group's estimated cost delta is the
sum of the cost model's per-node estimates of its added minus its removed nodes.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path
from typing import Any

import onnx

from graphpass.diff.match import Matching, match
from graphpass.diff.views import GraphView

__all__ = ["GraphDiff", "Rewrite", "diff_graphs", "diff_models", "COST_MAX_NODES"]

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
class GraphDiff:
    """The difference of two graphs (``subgraphs`` holds the bodies' own diffs)."""

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

    @property
    def equivalent(self) -> bool:
        return not (self.removed or self.added or self.rewired or self.attribute_changes
                    or any(self.inputs.values()) or any(self.outputs.values())
                    or self.weights["removed"] or self.weights["added"] or self.weights["changed"]
                    or any(not s["diff"].equivalent for s in self.subgraphs)
                    or (self.opsets and self.opsets["before"] != self.opsets["after"]))


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


def _io_changes(a: list, b: list, inputs_map: dict[str, str] | None) -> dict[str, list]:
    ta = dict(a)
    tb = dict(b)
    if inputs_map is None:  # outputs: by name, then by position among the rest
        inputs_map = {n: n for n in tb if n in ta}
        rest_b = [n for n, _ in b if n not in ta]
        rest_a = [n for n, _ in a if n not in tb]
        inputs_map.update(zip(rest_b, rest_a))
    matched_a = set(inputs_map.values())
    changed = []
    for nb, na in inputs_map.items():
        (da, sa), (db, sb) = ta[na], tb[nb]
        if da != db or sa != sb or na != nb:
            entry = {"name": nb, "before": {"dtype": da, "shape": list(sa) if sa is not None else None},
                     "after": {"dtype": db, "shape": list(sb) if sb is not None else None}}
            if na != nb:
                entry["renamed_from"] = na
            if da != db or sa != sb:
                changed.append(entry)
    return {"removed": [n for n, _ in a if n not in matched_a], "added": [n for n, _ in b if n not in inputs_map],
            "changed": changed}


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
                outer: dict[str, str] | None = None) -> GraphDiff:
    """Diff two graphs. ``costs``: per-node estimates keyed by first output name (before, after);
    ``outer``: the enclosing graphs' tensor matching, for a subgraph body."""
    a, b = GraphView(a_proto), GraphView(b_proto)
    m = match(a, b, outer=outer)
    removed = [i for i in range(len(a.nodes)) if i not in m.b_of_a]
    added = [i for i in range(len(b.nodes)) if i not in m.a_of_b]
    rewired, attr_changes, subgraphs = [], [], []
    for ib, ia in sorted(m.a_of_b.items()):
        na, nb = a.nodes[ia], b.nodes[ib]
        if any(m.tensor.get(tb) != ta for ta, tb in zip(na.inputs, nb.inputs)) or len(na.inputs) != len(nb.inputs):
            rewired.append(ib)
        if na.attrs != nb.attrs:
            for k in sorted(set(na.attrs) | set(nb.attrs)):
                va, vb = na.attrs.get(k), nb.attrs.get(k)
                if va != vb and not (k in na.subgraphs and k in nb.subgraphs):
                    attr_changes.append({"node": nb.label, "op": nb.op, "attribute": k,
                                         "before": _show(va), "after": _show(vb)})
        for k in sorted(set(na.subgraphs) & set(nb.subgraphs)):
            sub = diff_graphs(na.subgraphs[k], nb.subgraphs[k], costs, outer=m.tensor)
            if not sub.equivalent:
                subgraphs.append({"node": nb.label, "op": nb.op, "attribute": k, "diff": sub})
    groups = _group(a, b, m, removed, added, rewired)
    rewrites = _rewrites(a, b, m, groups, costs)
    ops_a, ops_b = _op_counts(a_proto), _op_counts(b_proto)
    ops = {op: (ops_a.get(op, 0), ops_b.get(op, 0)) for op in sorted(set(ops_a) | set(ops_b)) if ops_a.get(op, 0) != ops_b.get(op, 0)}
    wa = set(a.initializers)
    matched_w = set(m.weights.values())
    weights = {
        "removed": sorted(n for n in wa if n not in matched_w),
        "added": sorted(n for n in b.initializers if n not in m.weights),
        "changed": sorted(nb for nb, na in m.weights.items() if a.digest[na] != b.digest[nb]),
        "count": [len(a.initializers), len(b.initializers)],
        "bytes": [sum(a.nbytes.values()), sum(b.nbytes.values())],
    }
    td = {"before": ops_a.get(_TD, 0), "after": ops_b.get(_TD, 0)}
    return GraphDiff(a, b, m, removed, added, rewired, attr_changes, rewrites, groups,
                     _io_changes(a.inputs, b.inputs, m.inputs), _io_changes(a.outputs, b.outputs, None),
                     weights, subgraphs, ops, td)


def _show(v) -> Any:
    if isinstance(v, tuple) and v and v[0] in ("tensor", "tensors", "graph", "graphs", "proto", "ref"):
        return f"<{v[0]}>"
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

def _load(path_or_model, label: str) -> onnx.ModelProto:
    from graphpass.errors import BadModelError

    if isinstance(path_or_model, onnx.ModelProto):
        return path_or_model
    from graphpass.ir import model_io

    p = Path(path_or_model)
    if p.exists() and not p.is_file() and not p.is_dir():
        raise BadModelError(f"{label} model '{p}': not a regular file (a device, FIFO or socket)")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except FileNotFoundError:
        raise BadModelError(f"{label} model '{p}': no such file") from None
    except IsADirectoryError:
        raise BadModelError(f"{label} model '{p}': is a folder, not an ONNX file") from None
    except Exception as e:  # noqa: BLE001 - protobuf raises several types on bad bytes
        raise BadModelError(f"{label} model '{p}': not a readable ONNX model ({type(e).__name__})") from None
    if model.ir_version <= 0 or not model.HasField("graph"):  # an empty file parses as an empty ModelProto
        raise BadModelError(f"{label} model '{p}': not an ONNX model (" + ("empty file" if p.stat().st_size == 0
                                                                            else "no ir_version or no graph") + ")")
    try:
        model_io.validate(model)  # the structural checks of graphpass load
    except BadModelError as e:
        raise BadModelError(f"{label} model '{p}': {e}") from None
    return model


def _node_costs(model: onnx.ModelProto, target: str) -> tuple[dict[str, float], Any] | None:
    from graphpass.cost_model import create
    from graphpass.ir import model_io

    cm = create(target)
    if not getattr(cm, "active", False):
        return None
    try:
        graph = model_io.from_proto(model)
    except Exception:  # noqa: BLE001 - a model the IR cannot take is still diffed, without costs
        return None
    per_node, report = cm.node_costs(graph)
    return per_node, report


def diff_models(before, after, target: str = "ascend910a", names: tuple[str, str] | None = None) -> GraphDiff:
    """Diff two models (paths or ModelProtos). Unreadable files raise BadModelError naming them."""
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
    elif target != "none":
        cost_info = {"target": target, "skipped": f"graphs over {COST_MAX_NODES:,} nodes: per-node estimates skipped"}
    d = diff_graphs(ma.graph, mb.graph, costs)
    d.cost = cost_info
    if cost_info and "transdata_before" in cost_info:
        ta, tb = cost_info.pop("transdata_before"), cost_info.pop("transdata_after")
        d.transdata.update({"implicit_before": ta.get("implicit", 0), "implicit_after": tb.get("implicit", 0),
                            "us_before": round(ta.get("us", 0.0), 3), "us_after": round(tb.get("us", 0.0), 3)})
    oa = {o.domain or "ai.onnx": o.version for o in ma.opset_import}
    ob = {o.domain or "ai.onnx": o.version for o in mb.opset_import}
    d.opsets = {"before": oa, "after": ob}
    d.names = {"before": names[0] if names else str(before if not isinstance(before, onnx.ModelProto) else "before"),
               "after": names[1] if names else str(after if not isinstance(after, onnx.ModelProto) else "after")}
    return d

