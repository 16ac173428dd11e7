"""The analytical Ascend cost model.

Per node (ascend_facts.md §9, the CANN estimator and the proposed defaults):

    time = launch + max(cube, vector, memory)
    cube   = cycles / min(cores, M-tiles x N-tiles x batch) / cube MHz
             Conv:   cycles = ceil(Ho*Wo/16) * K1 * N1 * N,  K1 = ceil(Cin_g/C0)*kh*kw, N1 = ceil(Cout_g/16)  (x groups)
             MatMul: cycles = m1 * k1 * n1 * batch  (16-wide fractals)          [FE-EST, P]
    vector = vector_ops * numel(out, padded) / elems_per_cycle / vector cores / MHz  (vector_ops = 3: FE-EST)
    memory = bytes(in + out, padded to the storage format) / (GM bandwidth x efficiency)

Storage formats: a tensor's ``graphpass.format`` annotation wins; otherwise the model assumes
what the Ascend graph engine does by default (GE-FMT, P): heavy ops take their preferred
format (Conv: NC1HWC0), format-agnostic ops keep their first input's format when the 5HD rule
allows (every input 4-D, C not broadcast), Reshape/Transpose/Gather are ND islands. Where a
consumer needs another format than its producer gives, an *implicit* TransData is charged once
per tensor and format. 5HD pads C to 16*ceil(C/16) (32 for 1-byte types); fractal formats pad
their last two dims. A C-axis Concat in 5HD is a no-task op when every input's C is a multiple
of C0 (GE-CNT, P) and a repacking kernel (read + write of every input again, E) when not; a
C-axis Split into unaligned parts repacks the same way (E).

Engines: from the op-info table, then by dtype and precision mode (ATC-PM, P): under
``must_keep_origin_dtype`` an fp32 op whose AI Core kernel is fp16-only falls back to AI CPU;
under ``force_fp16`` it runs in fp16 with a cast (E). An op missing from the table is costed
as AI CPU and listed as unknown. AI CPU ops pay ``aicpu_op_us``; a tensor crossing between AI
Core and AI CPU pays ``engine_sync_us``; one crossing to or from the host pays a PCIe copy and
a host synchronisation. An op with a data-dependent output shape (NonZero, TopK with a runtime
k, ...) makes every node after it host-scheduled: each pays ``host_dispatch_us`` instead of a
kernel launch, and the graph cannot be sunk (GE-DYN, P).

Control flow: a Loop costs its body x trip count (constant M, else ``loop_trips``); unless the
Loop is marked sunk (``graphpass.sink = device``) each iteration also pays a graph launch and a
host sync. Scan iterates over its scan axis; If costs its dearer branch. The step-level term
``(graph launch + input H2D + output D2H + sync) / iterations_per_loop`` is added once (§6).

Every number comes from the profile data files; none lives in this module.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from graphpass.cost_model.base import CostModel
from graphpass.cost_model.op_info import OpInfo, OpTable, load_op_table
from graphpass.cost_model.op_limits import load_op_limits
from graphpass.cost_model.profiles import PRECISION_MODES, HardwareProfile, load_profile
from graphpass.cost_model.report import CostReport
from graphpass.cost_model.target import DEFAULT_TARGET
from graphpass.errors import UsageError
from graphpass.ir import annotations as A
from graphpass.ir.graph import peek_values, subgraphs_of
from graphpass.ir.model_io import gc_frozen
from graphpass.ir.shapes import dim_hint, given_shapes

__all__ = ["AscendCostModel", "Fractal", "groups_per_fractal", "cube_cycles_conv", "cube_cycles_matmul", "vector_cycles", "padded_numel"]

_PLAIN = {"ND", "NCHW"}  # same bytes in the same order: converting between them is free
_Constant = gs.Constant
_META = A._KEY  # where a node's or tensor's annotations live (A.stored_meta, inline in the hot loop)
_F32 = np.dtype("float32")
_DTYPES: dict[Any, np.dtype] = {}  # a gs dtype (numpy type, dtype or ONNX enum) -> its np.dtype
_NAMES: dict[np.dtype, str] = {}


#: the type of a TensorProto's ``dims`` (a lazy weight's shape): tuple() of it reads it element by
#: element through protobuf (~0.4 us); a slice copies it in one call
_DIMS_TYPE = type(onnx.TensorProto().dims)


def _values_shape(values: Any) -> tuple:
    """A constant's shape as ``_shape_uncached`` reads it (a lazy weight's header: never loaded)."""
    shape = getattr(values, "shape", None)
    if shape is None and not hasattr(values, "shape"):
        return tuple(np.shape(values))
    if type(shape) is tuple:
        return shape
    return tuple(shape[:]) if type(shape) is _DIMS_TYPE else tuple(shape)


def _dtype_name(dtype: np.dtype) -> str:
    """``dtype.name``, cached (numpy computes it on every access)."""
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = dtype.name
    return name
_NEVER_FOLDED = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                           "Dropout", "Bernoulli"})
#: Attributes that change a node's cost (the rest only change values, not work).
# the attributes a node's price reads besides its shapes, formats and engine (the key of the
# per-walk memo): ``mode`` picks the op-info row (Resize: one per mode), ``num_heads`` the
# attention dims (AttentionBSH)
_COST_ATTRS = frozenset({"group", "transA", "transB", "axis", "axes", "kernel_shape", "strides", "src_format", "dst_format",
                         "mode", "num_heads"})


def _ceil(a: float, b: float) -> int:
    return int(math.ceil(a / b)) if b else 0


@dataclasses.dataclass(frozen=True)
class Fractal:
    """The Cube's tile sizes, from the profile (``fractal_m``, ``c0_2byte``, ``c0_1byte``; GE-FT,
    INI DtypeMKN, P): M = N = ``m``; C0 (the K of a fractal and the lane count of 5HD) by dtype size."""

    m: int
    c0_2byte: int
    c0_1byte: int

    def c0(self, itemsize: int) -> int:
        return self.c0_1byte if itemsize == 1 else self.c0_2byte


def c0_of(itemsize: int, fr: Fractal) -> int:
    """C0 of a dtype of ``itemsize`` bytes (GE GetCubeSizeByDataType, P)."""
    return fr.c0(itemsize)


def padded_numel(shape: list[int], fmt: str, itemsize: int, fr: Fractal) -> int:
    """Elements a tensor occupies in a storage format, padding included (GE-FT, P)."""
    n = 1
    for d in shape:
        n *= d
    if fmt == "NC1HWC0" and len(shape) == 4:
        c0 = fr.c0(itemsize)
        N, C, H, W = shape
        return N * _ceil(C, c0) * c0 * H * W
    if fmt in ("FRACTAL_NZ", "FRACTAL_Z") and len(shape) >= 2:
        c0 = fr.c0(itemsize)
        *lead, h, w = shape
        base = 1
        for d in lead:
            base *= d
        if fmt == "FRACTAL_Z" and len(shape) == 4:  # conv weight (Cout, Cin, kh, kw)
            co, ci, kh, kw = shape
            return _ceil(ci, c0) * kh * kw * _ceil(co, fr.m) * fr.m * c0
        return base * _ceil(h, fr.m) * fr.m * _ceil(w, c0) * c0
    return n


def groups_per_fractal(cin_g: int, cout_g: int, groups: int, c0: int) -> int:
    """How many groups of a grouped Conv share one fractal: the Cube packs groups whose channels
    are fewer than C0 side by side (a block-diagonal weight), so a depthwise Conv (1 channel per
    group) fills C0 lanes with C0 groups instead of one (DepthwiseConv2D's FRACTAL_Z with
    C1HWNCoC0 packing, GE-FT; E for the rule beyond depthwise)."""
    if groups <= 1:
        return 1
    return max(1, min(groups, c0 // max(1, cin_g, cout_g)))


def cube_cycles_conv(n: int, cin: int, cout: int, kh: int, kw: int, ho: int, wo: int, groups: int,
                     fr: Fractal, c0: int) -> int:
    """CANN FE estimator for Conv: ceil(H*W/M) * K1 * N1 * N per (packed) group (FE-EST, P);
    groups of fewer than C0 channels are packed into one fractal (:func:`groups_per_fractal`)."""
    groups = max(groups, 1)
    cin_g, cout_g = cin // groups, cout // groups
    pack = groups_per_fractal(cin_g, cout_g, groups, c0)
    k1 = _ceil(cin_g * pack, c0) * kh * kw
    n1 = _ceil(cout_g * pack, fr.m)
    return _ceil(ho * wo, fr.m) * k1 * n1 * n * _ceil(groups, pack)


def cube_cycles_matmul(m: int, k: int, n: int, batch: int, fr: Fractal, c0: int) -> int:
    """CANN FE estimator for MatMul: m1 * k1 * n1 * batch (FE-EST, P)."""
    return _ceil(m, fr.m) * _ceil(k, c0) * _ceil(n, fr.m) * batch


def vector_cycles(numel: int, elems_per_cycle: int, ops_per_elem: float) -> float:
    """CANN FE estimator for vector ops: ops * numel / vec_calc_size (FE-EST, P; ops from op_info)."""
    return ops_per_elem * numel / elems_per_cycle


_SAME_SHAPE = frozenset({"Relu", "Sigmoid", "Clip", "HardSwish", "HardSigmoid", "Tanh", "LeakyRelu", "Identity", "Cast",
                         "Neg", "Abs", "Exp", "Sqrt", "Erf", "Gelu", "Softmax"})
_FUSION_HEADS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
#: the cost classes of the AI Core kernels whose memory traffic the fusion model re-prices
_KERNEL_COSTS = frozenset({"cube", "vector", "datamove", "gather", "transdata"})


class _Item:
    """One node of a graph and its cost record, as :meth:`AscendCostModel._fuse` sees it: the
    record's figures as fields (``us``, ``bound``, ``cube``, ``vector``, ``memory``, ``launch``,
    ``note``; the report's record dict is made from them, when records are kept, by
    :meth:`AscendCostModel._contributions`). ``kernel``: an AI Core kernel whose memory traffic
    the fusion model re-prices (its figure above 0 when made); ``elt``: an elementwise op but for
    its figure (:meth:`eltwise` adds that, as it reads it); ``fused``: taken in by a group."""

    __slots__ = ("node", "e", "info", "engine", "c16", "in_fmts", "out_fmts", "host", "us", "bound", "cube", "vector",
                 "memory", "launch", "note", "kernel", "elt", "fused")

    def eltwise(self) -> bool:
        return self.elt and self.us > 0.0


#: graphpass's attention device ops (two MatMuls on the Cube, the softmax on the Vector unit)
_ATTENTION_OPS = frozenset({"Attention", "AttentionBSH"})


class _Sig:
    """What a node signature decides (:meth:`AscendCostModel._signature`), for every node of an
    estimate with that signature: the engine (None: not worked out yet; ``_PER_NODE``: read per
    node), the formats per (first input's format, inputs GE folds) (None: worked out per node)
    and the cost records per walk state (engine, fp16, host-scheduled, casts, formats)."""

    __slots__ = ("engine", "fmts", "memo")

    def __init__(self, engine: Any, fmts: dict | None):
        self.engine = engine
        self.fmts = fmts
        self.memo: dict[tuple, tuple] = {}


_PER_NODE = object()  # a _Sig's engine that reads more than the signature (worked out per node)
_UNLOOKED = object()


def _static_dims(shape: Any) -> bool:
    """Every dim a plain non-negative int (the fully static case)."""
    if shape is None:
        return False
    for d in shape:
        if type(d) is not int or d < 0:
            return False
    return True


class _Ctx:
    """State of one estimate (per graph, recursive into subgraphs)."""

    def __init__(self, model: "AscendCostModel", precision_mode: str, loop_trips: int, defaults: dict[str, list[int]]):
        self.m = model
        self.p = model.pv
        self.shapes: dict[int, tuple[int, ...]] = {}
        self.bytes: dict[tuple[int, str, bool], int] = {}  # (tensor id, format, computed in fp16) -> bytes
        self.engines: dict[int, tuple[str, str]] = {}  # node id -> (engine, why not AI Core)
        self.memo: dict[tuple, dict[str, Any]] = {}
        # node signatures (see AscendCostModel._signature): what only the op, its cost attributes
        # and its tensors' shapes, dtypes and constness decide is worked out once per signature.
        # ``codes`` and ``sigs`` are keyed by content (kept by the incremental estimate as the
        # memo is); ``tcode`` is keyed by tensor id (emptied by each incremental update)
        self.codes: dict[tuple, int] = {}  # (shape, dtype, is a gs.Constant) -> its code
        self.tcode: dict[int, int] = {}  # tensor id -> code (-1: irregular, priced the general way)
        self.sigs: dict[tuple, _Sig] = {}
        # node templates (see AscendCostModel._templates): a whole walk entry per signature and
        # state of the inputs (keyed by content, kept by the incremental estimate as the memo is)
        self.templates: dict[tuple, tuple] = {}
        self.template_entries: set[int] = set()  # ids of the templates' walk entries (kept alive by them)
        # a runtime input's state in a template key -> its number (below -3: never a code or a marker)
        self.states: dict[tuple, int] = {}
        self.bytes_of: dict[tuple[int, str, bool], int] = {}  # (code, format, computed in fp16) -> bytes
        self.transdata: dict[tuple[int, str, str], float] = {}  # (code, from, to) -> a TransData's us
        self.infos: dict[tuple[str, str | None], OpInfo | None] = {}  # (op, domain) -> op-info row (no modes)
        self.infos_op: dict[str, OpInfo | None] = {}  # op of the default domain (None or "") -> its row
        self.mode = precision_mode
        self.loop_trips = loop_trips
        self.defaults = defaults
        self.assumptions: dict[str, None] = {}
        self.assumed_dims: dict[str, int] = {}  # symbolic dim name -> the value the estimate took
        self.fixed_dims: dict[str, int] = {}
        self.graph: gs.Graph | None = None
        self.unknown: dict[str, None] = {}
        self.crossings: list[dict[str, Any]] = []
        self.dynamic_regions: list[dict[str, Any]] = []
        self.implicit: list[dict[str, Any]] = []
        self.per_engine: dict[str, float] = defaultdict(float)
        self.per_op: dict[str, float] = defaultdict(float)
        self.nodes: list[dict[str, Any]] = []
        self.keep_nodes = True  # False: per-node records are not kept in the report
        self.explicit_transdata = 0
        self.transdata_us: list[float] = []  # each explicit TransData's figure (summed exactly)
        self.costs_out: dict[str, float] | None = None  # first output name -> estimate, when asked
        self.values: dict[int, np.ndarray] = {}  # folded small integer values (shape arithmetic)
        self.static_graph = False  # every input shape fixed (set by the estimate)
        self.fusion = True  # UB fusion and L2 residency (False: every node its own kernel, through GM)
        self.capture: dict[int, tuple] | None = None  # node id -> (node, entry, inputs, outputs), top graph
        self.top_walk: _Walk | None = None
        self.top_contrib: list[float] = []
        self.top_items: list[_Item] = []
        self.fusion_groups: list[tuple[int, tuple[int, ...]]] = []

    def assume(self, text: str) -> None:
        self.assumptions.setdefault(text, None)

    def set_graph(self, graph: gs.Graph, dims: dict[str, int] | None = None) -> None:
        """The graph estimated: the dims --input-shape/--dim fixed on it (and ``dims``) are used
        where a stale shape still names them; every other symbolic dim is assumed 1 and listed."""
        self.graph = graph
        self.fixed_dims = {**given_shapes(graph)["dims"], **(dims or {})}


#: the fields of a node's cost record, in the order of an entry's record tuple
_REC_KEYS = ("us", "bound", "cube_us", "vector_us", "memory_us", "launch_us", "note")
_FOLDED_REC = (0.0, "none", 0.0, 0.0, 0.0, 0.0, "constant: folded by GE at compile time")


def _op_label(node: gs.Node) -> str:
    return node.op if node.domain in (None, "", "ai.onnx") else f"{node.domain}::{node.op}"


def _item_of(node: gs.Node, e: tuple) -> "_Item":
    """The :class:`_Item` of a node's walk entry (see ``_step``; the record dict, when records are
    kept, is made from its fields by ``_contributions``)."""
    info, engine, compute16, in_fmts, out_fmts, host, r, _, _ = e
    it = _Item()
    it.e = e
    it.node, it.info, it.engine, it.c16, it.in_fmts, it.out_fmts, it.host = (node, info, engine, compute16, in_fmts,
                                                                             out_fmts, host)
    it.us, it.bound, it.cube, it.vector, it.memory, it.launch, it.note = r
    it.fused = False
    if engine == "AICORE" and info is not None:
        cost = info.cost
        it.kernel = cost in _KERNEL_COSTS and r[0] > 0.0 and not host
        it.elt = cost == "vector" and info.layout == "agnostic" and node.op not in ("Concat", "Split")
    else:
        it.kernel = it.elt = False
    return it


class _Walk:
    """The state of a forward walk over one graph, per tensor id: storage format, producer's
    engine, compile-time constant, stored as fp16, host-scheduled region."""

    __slots__ = ("fmt", "engine_of", "const", "half", "region_of", "dynamic", "static_graph", "sid")

    def __init__(self, static_graph: bool):
        self.fmt: dict[int, str] = {}
        self.engine_of: dict[int, str] = {}  # tensor id -> engine of its producer
        self.const: set[int] = set()  # tensors GE computes at compile time (its constant folding)
        self.half: set[int] = set()  # fp32 tensors stored as fp16 (computed under force_fp16 & co.)
        self.region_of: dict[int, dict[str, Any]] = {}
        self.dynamic: set[int] = set()  # tensor ids whose shape depends on data
        # tensor id -> the number of its state as a template key reads it (code, format, producer's
        # engine, fp16, folded: interned in _Ctx.states); set by a template's node for its outputs
        # and on a first read, dropped wherever the walk writes a tensor's state another way
        self.sid: dict[int, int] = {}
        # ATC compiles a graph whose inputs all have fixed shapes as a static graph: it knows every
        # shape, so shape arithmetic is compile-time work (GE-DYN, P)
        self.static_graph = static_graph



def _desc_code(codes: dict, desc: tuple) -> int:
    """The walk's code of a tensor description (``codes``: description -> code, numbered as first
    seen); -1 when it cannot be a key (an optional or sequence dtype, an unhashable dim)."""
    try:
        code = codes.get(desc)
    except TypeError:
        return -1
    if code is None:
        code = codes[desc] = len(codes)
    return code

class AscendCostModel(CostModel):
    """The analytical Ascend model for one hardware profile (see the module docstring)."""

    active = True

    def __init__(self, profile: HardwareProfile | str = DEFAULT_TARGET, op_table: OpTable | None = None):
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.ops = op_table or load_op_table()
        self.target = self.profile.name
        # plain attributes for the hot loop (the profile's __getattr__ is slow per node)
        self.pv = SimpleNamespace(**self.profile.values, gm_bytes_per_us=self.profile.gm_bytes_per_us)
        self.fr = Fractal(self.pv.fractal_m, self.pv.c0_2byte, self.pv.c0_1byte)

    # -- shapes, dtypes, formats ----------------------------------------------------------

    def _shape(self, t: gs.Tensor, cx: _Ctx) -> tuple[int, ...]:
        hit = cx.shapes.get(id(t))
        if hit is None:
            hit = cx.shapes[id(t)] = self._shape_uncached(t, cx)
        return hit

    def _shape_uncached(self, t: gs.Tensor, cx: _Ctx) -> tuple[int, ...]:
        if isinstance(t, gs.Constant):
            return _values_shape(t._values)  # the header of a lazy weight: never load it just for its shape
        shape = t.shape
        if shape is not None and all(type(d) is int and d >= 0 for d in shape):
            return tuple(shape)  # the common, fully static case
        if shape is None:
            cx.assume("tensors of unknown shape are costed as one element")
            return (1,)
        out = []
        for d in shape:
            if isinstance(d, (int, np.integer)) and d >= 0:
                out.append(int(d))
            elif isinstance(d, str) and d in cx.fixed_dims:  # fixed by --dim / --input-shape
                out.append(cx.fixed_dims[d])
            else:
                name = d if isinstance(d, str) and d else "?"
                if name not in cx.assumed_dims:
                    cx.assumed_dims[name] = 1
                    hint = dim_hint(cx.graph, d) if cx.graph is not None else "fix it with --input-shape or --dim"
                    if cx.static_graph and hint.startswith("fix"):  # never tell whoever fixed every input to fix them
                        hint = "unresolved although every input shape is fixed: shape inference cannot size it"
                    cx.assume(f"symbolic dim '{name}' taken as 1 ({hint})")
                out.append(1)
        return tuple(out)

    @staticmethod
    def _dtype(t: gs.Tensor) -> np.dtype:
        d = t.dtype
        try:
            return _DTYPES[d]
        except (KeyError, TypeError):  # TypeError: an unhashable dtype object (not cached)
            pass
        try:
            out = np.dtype(d) if d is not None else _F32
        except TypeError:
            out = _F32
        try:
            _DTYPES[d] = out
        except TypeError:
            pass
        return out

    def _storage_itemsize(self, dtype: np.dtype, compute16: bool) -> int:
        if dtype == _F32 and compute16:
            return 2
        return max(1, dtype.itemsize)

    # -- the estimate ---------------------------------------------------------------------

    def estimate(self, graph: Any, **kwargs: Any) -> CostReport:
        """Estimate ``graph`` (a gs.Graph, or any model form ``as_model`` takes; it is not
        changed); see :meth:`_estimate` for the options."""
        from graphpass.cost_model.base import check_estimate_options

        check_estimate_options(kwargs)
        if not isinstance(graph, gs.Graph):
            from graphpass.ir.model import as_model

            graph = as_model(graph).graph
        with gc_frozen():  # the per-node records would otherwise make the GC rescan a big graph
            return self._estimate(graph, **kwargs)

    def node_costs(self, graph: gs.Graph, **kwargs: Any) -> tuple[dict[str, float], CostReport]:
        """Estimate of every node (subgraphs included), keyed by its first output's name."""
        with gc_frozen():
            report = self._estimate(graph, _costs_out=(out := {}), **kwargs)
        return out, report

    def placement(self, graph: gs.Graph, *, node_records: bool = True,
                  **kwargs: Any) -> tuple[dict[int, tuple[str, str]], CostReport]:
        """Engine of every node (by id, subgraphs included) with the reason when it is not AI Core;
        ``node_records=False`` leaves the report's per-node list empty (the pass manager's cost
        veto keeps several reports of a big graph alive and reads only their totals)."""
        with gc_frozen():
            report = self._estimate(graph, _engines_out=(out := {}), _node_records=node_records, **kwargs)
        return out, report

    def placement_report(self, graph: gs.Graph, capture: dict, cx_out: list, engines: dict, node_records: bool,
                         options: dict[str, Any]) -> CostReport:
        """A fresh estimate that also hands back its walk (``capture``: node id -> (node, entry,
        inputs, outputs); ``cx_out``: the estimate's state; ``engines``: as :meth:`placement`):
        what :class:`graphpass.cost_model.incremental.IncrementalEstimate` starts from."""
        with gc_frozen():
            return self._estimate(graph, _engines_out=engines, _node_records=node_records, _capture=capture,
                                  _cx_out=cx_out, **options)

    def _estimate(
        self,
        graph: gs.Graph,
        precision_mode: str | None = None,
        iterations_per_loop: int = 1,
        loop_trips: int = 1,
        input_shapes: dict[str, list[int]] | None = None,
        dims: dict[str, int] | None = None,
        fusion: bool = True,
        _engines_out: dict | None = None,
        _costs_out: dict | None = None,
        _node_records: bool = True,
        _capture: dict | None = None,
        _cx_out: list | None = None,
        **_: Any,
    ) -> CostReport:
        mode = precision_mode or self.profile.default_precision_mode
        if mode not in PRECISION_MODES:
            raise UsageError(f"unknown precision mode '{mode}'; known: {', '.join(PRECISION_MODES)}")
        if iterations_per_loop < 1:
            raise UsageError(f"iterations_per_loop must be at least 1, got {iterations_per_loop}")
        cx = _Ctx(self, mode, max(1, int(loop_trips)), dict(input_shapes or {}))
        cx.set_graph(graph, dims)
        cx.costs_out = _costs_out
        cx.keep_nodes = _node_records
        cx.static_graph = self.static_inputs(graph)
        cx.fusion = bool(fusion)
        cx.capture = _capture
        if _cx_out is not None:
            _cx_out.append(cx)
        nodes_us = self._graph_cost(graph, cx, top=True)
        if _engines_out is not None:
            _engines_out.update(cx.engines)
        step_us, sinkable = self._step_cost(graph, cx)
        ipl = iterations_per_loop
        if not sinkable and ipl > 1:
            cx.assume("the graph has host-scheduled regions: it cannot be sunk, iterations_per_loop taken as 1")
            ipl = 1
        step = step_us / ipl
        # exact sums (math.fsum: independent of order), so that the incremental estimate
        # (graphpass.cost_model.incremental), which keeps the same terms, gives the same total
        implicit_us = math.fsum(i["us"] for i in cx.implicit) if cx.implicit else 0  # (0, as sum() gave, when none)
        cross_us = math.fsum(c["us"] for c in cx.crossings) if cx.crossings else 0
        total = math.fsum([*cx.top_contrib, *(i["us"] for i in cx.implicit), *(c["us"] for c in cx.crossings), step])
        td_us = math.fsum([*cx.transdata_us, *(i["us"] for i in cx.implicit)])
        if implicit_us:
            cx.per_op["TransData (implicit)"] += implicit_us
            cx.per_engine["AICORE"] += implicit_us
        if cross_us:
            cx.per_engine["transfer"] += cross_us
        cx.per_engine["step"] += step
        return CostReport(
            target=self.target,
            total_us=total,
            precision_mode=mode,
            iterations_per_loop=ipl,
            nodes=cx.nodes,
            breakdown_us={"nodes": nodes_us, "implicit_transdata": implicit_us, "crossings": cross_us, "step": step},
            per_engine_us=dict(cx.per_engine),
            per_op_us=dict(cx.per_op),
            transdata={"explicit": cx.explicit_transdata, "implicit": len(cx.implicit), "us": td_us,
                       "share": td_us / total if total else 0.0, "implicit_list": cx.implicit},
            crossings=cx.crossings,
            dynamic_regions=cx.dynamic_regions,
            unknown_ops=list(cx.unknown),
            assumptions=list(cx.assumptions),
            assumed_dims=dict(cx.assumed_dims),
        )

    def _step_cost(self, graph: gs.Graph, cx: _Ctx) -> tuple[float, bool]:
        p = self.pv
        h2d = sum(self._bytes(t, "ND", cx, False) for t in graph.inputs) / (p.h2d_gbps * 1e3)
        d2h = sum(self._bytes(t, "ND", cx, False) for t in graph.outputs) / (p.d2h_gbps * 1e3)
        copies = (len(graph.inputs) + len(graph.outputs)) * p.small_copy_us
        return p.graph_launch_us + h2d + d2h + copies + p.host_sync_us, not cx.dynamic_regions

    def _bytes(self, t: gs.Tensor, fmt: str, cx: _Ctx, compute16: bool) -> float:
        code = cx.tcode.get(id(t), -1)
        if code >= 0:  # a coded tensor: its bytes are those of every tensor of its shape and dtype
            key = (code, fmt, compute16)
            hit = cx.bytes_of.get(key)
            if hit is None:
                item = self._storage_itemsize(self._dtype(t), compute16)
                hit = cx.bytes_of[key] = padded_numel(cx.shapes[id(t)], fmt, item, self.fr) * item
            return hit
        key = (id(t), fmt, compute16)
        hit = cx.bytes.get(key)
        if hit is None:
            item = self._storage_itemsize(self._dtype(t), compute16)
            hit = cx.bytes[key] = padded_numel(self._shape(t, cx), fmt, item, self.fr) * item
        return hit

    # -- formats --------------------------------------------------------------------------

    def _is_5hd_ok(self, node: gs.Node, cx: _Ctx, const: set[int]) -> bool:
        """FE-SEL broadcast rule: every runtime input 4-D with the same C (C not broadcast);
        a scalar operand needs C to be C0-aligned. Constants are laid out at compile time, so a
        per-channel constant ([C,1,1] or [1,C,1,1]) is accepted too."""
        ins = node.inputs[:1] if node.op == "Clip" else node.inputs  # Clip's bounds are scalars of the op (ClipByValue, Relu6)
        runtime = [self._shape(t, cx) for t in ins if t.name and not isinstance(t, gs.Constant) and id(t) not in const]
        consts = [self._shape(t, cx) for t in ins if t.name and (isinstance(t, gs.Constant) or id(t) in const)]
        if not runtime or any(len(s) != 4 for s in runtime):
            return False
        c = runtime[0][1]
        if any(s[1] != c for s in runtime):
            return False
        for s in consts:
            numel = math.prod(s)
            if numel == 1:
                if c % self.fr.c0_2byte:
                    return False
            elif not (numel == c and (tuple(s[-3:]) == (c, 1, 1) or tuple(s) == (c,))) or len(s) > 4:
                return False
        return True

    # -- per graph ------------------------------------------------------------------------

    def _graph_cost(self, graph: gs.Graph, cx: _Ctx, top: bool = False) -> float:
        w = _Walk(top and self.static_inputs(graph))
        for t in graph.inputs:  # in device memory: the step term pays the H2D copy
            w.fmt[id(t)] = A.get_format(t) or "ND"
            w.engine_of[id(t)] = "AICORE"
        seen_conv: set[tuple[int, str]] = set()
        seen_cross: set[tuple[int, str]] = set()
        items: list[_Item] = []
        capture = cx.capture if top else None
        step = self._step
        append = items.append
        item_of = _item_of
        io = None  # (ids of the graph's inputs, ids of its outputs, top): made at the first implicit TransData
        for node in graph.nodes:
            e = step(node, w, cx)
            if capture is not None:
                capture[id(node)] = (node, e, tuple(node.inputs), tuple(node.outputs))
            append(item_of(node, e))
            conv, cross = e[7], e[8]
            if not conv and not cross:
                continue
            for t, have, want in conv:
                key = (id(t), want)
                if key not in seen_conv:
                    seen_conv.add(key)
                    if io is None:
                        io = ({id(x) for x in graph.inputs}, {id(x) for x in graph.outputs}, top)
                    us = self._transdata_us(t, have, want, cx, self._transdata_l2(t, have, want, *io))
                    cx.implicit.append({"tensor": t.name, "from": have, "to": want, "us": us,
                                        "reason": f"{_op_label(node)} '{node.name}' takes {want}, its input comes in {have}"})
            engine = e[1]
            for t, src, c16 in cross:
                key2 = (id(t), engine)
                if key2 not in seen_cross:
                    seen_cross.add(key2)
                    self._cross(t, src, engine, cx, c16)
        if cx.fusion:
            groups = self._fuse(items, graph, cx, w.const, fmt=w.fmt, top_graph=top)
            if capture is not None:
                cx.fusion_groups = [(id(g[0].node), tuple(id(x.node) for x in g)) for g in groups]
        contrib = self._contributions(items, cx)
        # graph outputs leave in their origin format
        if top:
            cx.top_walk = w
            for t in graph.outputs:
                have = w.fmt.get(id(t), "ND")
                if have not in _PLAIN and (id(t), "ND") not in seen_conv:
                    seen_conv.add((id(t), "ND"))
                    if io is None:
                        io = ({id(x) for x in graph.inputs}, {id(x) for x in graph.outputs}, top)
                    us = self._transdata_us(t, have, "ND", cx, self._transdata_l2(t, have, "ND", *io))
                    cx.implicit.append({"tensor": t.name, "from": have, "to": "ND", "us": us, "reason": "graph output in its origin format"})
                if w.engine_of.get(id(t)) == "HOST" and (id(t), "AICORE") not in seen_cross:
                    seen_cross.add((id(t), "AICORE"))  # back to device memory for the step's D2H
                    self._cross(t, "HOST", "AICORE", cx, True)
            cx.top_contrib = contrib
            if capture is not None:
                cx.top_items = items
        return math.fsum(contrib)

    def _contributions(self, items: "list[_Item]", cx: _Ctx) -> list[float]:
        """Each costed node's final figure (after fusion and ``[op_scale]``), in node order; the
        report's per-engine/per-op sums and per-node records."""
        scale = self.profile.op_scale
        keep, costs_out = cx.keep_nodes, cx.costs_out
        per_engine, per_op = cx.per_engine, cx.per_op
        out = []
        for it in items:
            node = it.node
            op = node.op
            dom = node.domain
            label = op if dom is None or dom == "" or dom == "ai.onnx" else f"{dom}::{op}"  # (_op_label)
            if scale and it.us and op in scale:  # measured per-op-type correction (graphpass calibrate)
                it.us *= scale[op]
                it.note = (it.note + f"; x{scale[op]:.3g} (op_scale)").strip("; ")
            us = it.us
            engine = it.engine
            if keep:
                if engine == "compile-time":
                    rec = {"name": node.name, "op": label, "engine": "compile-time", "formats_in": [],
                           "formats_out": [], "us": us, "bound": it.bound, "cube_us": it.cube, "vector_us": it.vector,
                           "memory_us": it.memory, "launch_us": it.launch, "note": it.note}
                else:
                    rec = {"us": us, "bound": it.bound, "cube_us": it.cube, "vector_us": it.vector,
                           "memory_us": it.memory, "launch_us": it.launch, "note": it.note, "name": node.name,
                           "op": label, "engine": engine, "formats_in": list(it.in_fmts),
                           "formats_out": list(it.out_fmts)}
                cx.nodes.append(rec)
            if engine == "compile-time":
                continue
            if costs_out is not None and node.outputs:
                costs_out[node.outputs[0].name] = us
            per_engine[engine] += us
            per_op[label] += us
            if it.info is not None and it.info.cost == "transdata":
                cx.explicit_transdata += 1
                cx.transdata_us.append(us)
            out.append(us)
        return out

    def _step(self, node: gs.Node, w: "_Walk", cx: _Ctx) -> tuple:
        """One node of the forward walk: reads the state of its input tensors in ``w``, writes
        that of its outputs, and returns its entry ``(info, engine, computes in fp16, input
        formats, output formats, host-scheduled, cost record (a tuple in _REC_KEYS order, before
        fusion), implicit TransData demands ((tensor, have, want), ...), engine crossings
        ((tensor, from, computes in fp16), ...))``. The fresh walk and the incremental one
        (:mod:`graphpass.cost_model.incremental`) both price a node here.

        A node whose input shapes the walk knows (every node but the first readers of a graph
        input of symbolic shape, unknown ops and control flow) is priced through its signature
        (:meth:`_signature`): its engine, formats and cost record are worked out once per
        signature and walk state; any other node the general way (:meth:`_step_general`)."""
        fmt, engine_of, const, half, region_of = w.fmt, w.engine_of, w.const, w.half, w.region_of
        op = node.op
        dom = node.domain
        info = cx.infos_op.get(op, _UNLOOKED) if not dom else cx.infos.get((op, dom), _UNLOOKED)
        if info is _UNLOOKED:
            info = self.ops.lookup(op, dom)
            if info is not None and info.modes:
                info = info.for_mode(node.attrs.get("mode"))  # one row per mode: never kept per op
            elif not dom:  # (the lookup reads None and "" alike)
                cx.infos_op[op] = info
            else:
                cx.infos[(op, dom)] = info
        if info is None:
            cx.unknown.setdefault(_op_label(node), None)
        ins = node.inputs
        first = ins[0] if ins else None
        if (first is not None and first.name and not isinstance(first, _Constant) and id(first) not in const
                and op not in ("Shape", "Size", "Constant")):
            pass  # a runtime first input: not folded (the common case of _folded_by_ge, inline)
        else:
            static_here = w.static_graph and not (region_of and any(id(t) in region_of for t in ins))
            if self._folded_by_ge(node, info, const, static_here):
                const.update(id(t) for t in node.outputs)
                if w.sid:
                    for t in node.outputs:
                        w.sid.pop(id(t), None)
                self._fold_value(node, cx)
                return (info, "compile-time", False, (), (), False, _FOLDED_REC, (), ())
        outs = node.outputs
        outs_static = True
        for t in outs:  # (_static_dims, inline)
            if t.name:
                shape = t.shape
                if shape is None:
                    outs_static = False
                    break
                for d in shape:
                    if type(d) is not int or d < 0:
                        outs_static = False
                        break
                if not outs_static:
                    break
        if not outs_static:
            self._static_shapes(node, cx)
        # host-scheduled region: data-dependent output shape upstream
        upstream = None
        if region_of:  # most graphs have no dynamic region: skip the lookup entirely
            for t in ins:
                upstream = region_of.get(id(t))
                if upstream is not None:
                    break
        region = upstream
        if op == "TopK" or (info is not None and info.dynamic_output):
            starts = self._starts_dynamic(node, info)
            if starts:
                op_label = _op_label(node)
                region = {"root": node.name or op_label, "op": op_label, "reason": starts, "nodes": 0}
                cx.dynamic_regions.append(region)
        if region is not None:
            region["nodes"] += 1
            for t in outs:
                region_of[id(t)] = region
                w.dynamic.add(id(t))
        tkey = None
        meta = node.__dict__.get(_META)
        if region is None and outs_static and info is not None and info.cost != "control" and self._templates:
            # the template key (see _templates), inline
            a = node.attrs
            key = [op, dom, tuple(sorted((k, str(v)) for k, v in a.items() if k in _COST_ATTRS))
                   if a and not _COST_ATTRS.isdisjoint(a) else (), meta.get(A.ENGINE) if meta else None]
            append = key.append
            tcode, sid, shapes, codes = cx.tcode, w.sid, cx.shapes, cx.codes
            for t in ins:
                tid = id(t)
                s = sid.get(tid)
                if s is not None:  # a runtime input whose state is numbered (its code read before)
                    append(s)
                    continue
                if not t.name:
                    break
                c = tcode.get(tid)
                if isinstance(t, _Constant):
                    if c is None:  # (_tcode's constant case, inline: the same code)
                        values = t._values
                        shape = shapes.get(tid)
                        if shape is None:
                            shape = shapes[tid] = _values_shape(values)
                        c = tcode[tid] = _desc_code(codes, (shape, values.dtype, True))
                    if c < 0:
                        break
                    append(c)
                    continue
                if c is None:
                    c = self._tcode(t, cx)
                if c < 0:
                    break
                f = fmt.get(tid)
                if not f:
                    if tid not in const:
                        break
                    # a tensor GE folds (its format never set): what the signature path reads of it is
                    # its format as the first runtime input (_signature, _formats): its annotation or ND
                    f = A.get_format(t) or "ND"
                st = (c, f, engine_of.get(tid, "AICORE"), tid in half, tid in const)
                s = cx.states.get(st)
                if s is None:
                    s = cx.states[st] = -4 - len(cx.states)
                sid[tid] = s
                append(s)
            else:
                append(-3)
                for t in outs:
                    tid = id(t)
                    if not t.name or isinstance(t, _Constant):
                        break
                    tmeta = t.__dict__.get(_META)
                    append(tmeta.get(A.FORMAT) if tmeta else None)  # (the format annotation: the output's format)
                    c = tcode.get(tid)
                    if c is None:
                        if tid in shapes:
                            break  # (a shape the estimate fixed: _signature codes it)
                        # (_signature's static case, inline: the same code)
                        shape = shapes[tid] = tuple(t.shape)
                        c = tcode[tid] = _desc_code(codes, (shape, t.dtype, False))
                    if c < 0:
                        break
                    append(c)
                else:
                    tkey = tuple(key)
            if tkey is not None:
                tmpl = cx.templates.get(tkey)
                if tmpl is not None:  # a node of this signature and input state was walked before
                    e, out_w, conv_i, cross_i, eng = tmpl
                    engine = e[1]
                    i = 0
                    for f, h, s in out_w:  # (one per output: the key holds each)
                        tid = id(outs[i])
                        i += 1
                        fmt[tid] = f
                        engine_of[tid] = engine
                        if h:
                            half.add(tid)
                        if tid in const:  # (never for a tensor of one producer)
                            sid.pop(tid, None)
                        else:
                            sid[tid] = s
                    cx.engines[id(node)] = eng
                    if conv_i or cross_i:
                        e = (*e[:7], tuple([(ins[i], have, want) for i, have, want in conv_i]),
                             tuple([(ins[i], src, c16) for i, src, c16 in cross_i]))
                    return e
        sig = None
        if info is not None and info.cost != "control":
            sig, first_fmt, folded = self._signature(node, info, w, cx, outs_static)
        if sig is None:
            return self._step_general(node, info, region, w, cx)

        # the signature's engine, then the node's annotation
        engine_t = sig.engine
        if engine_t is None or engine_t is _PER_NODE:
            if engine_t is None:  # the first node of its signature
                sig.engine = _PER_NODE if load_op_limits().reads_values(node) else self._engine(node, info, cx)
            if sig.engine is _PER_NODE:
                engine_t = self._engine(node, info, cx)
                tkey = None  # (its engine reads more than the signature)
            else:
                engine_t = sig.engine
        engine, compute16, eng_note = engine_t
        if meta:  # (the node's annotations, read above: A.get_engine without the calls for a node of none)
            ann = meta.get(A.ENGINE)
            if ann in ("AICORE", "AICPU", "HOST") and ann != engine:
                # the annotation decides the engine, and with it the dtype the op computes in: AI CPU
                # and the host keep the origin dtype; an AI Core kernel without fp32 computes in fp16
                compute16 = ann == "AICORE" and self._fp32_without_kernel(node, info)
                eng_note = f"engine {ann} by annotation"
                engine = ann
        # formats: what the node takes and gives (per first input's format and inputs GE folds)
        fmts = sig.fmts
        if fmts is not None:
            fkey = (first_fmt, folded)
            f = fmts.get(fkey)
            if f is None:
                fi, fo = self._formats(node, info, fmt, cx, const)
                f = fmts[fkey] = (tuple(fi), tuple(fo))
            in_fmts, out_fmts = f
        else:
            fi, fo = self._formats(node, info, fmt, cx, const)
            in_fmts, out_fmts = tuple(fi), tuple(fo)
            if first_fmt == "NC1HWC0" and len(ins) > 1 and isinstance(ins[1], _Constant):
                tkey = None  # (its formats may read its axes input's values)
            # (else a reduce's formats read only what its template key holds: the first runtime
            # input's format, its attributes, whether input 1 is a constant, its outputs' ranks)
        aicore = engine == "AICORE"
        if not aicore:  # AI CPU kernels and the host read and write ND
            in_fmts, out_fmts = ("ND",) * len(in_fmts), ("ND",) * len(out_fmts)
        reads_data = op != "Shape" and op != "Size"  # these read only the shape
        # fp32 values computed in fp16 are stored in fp16: a cast is due only where a tensor
        # crosses between fp32 and fp16 storage (ATC converts whole regions, not single ops)
        casts = aicore and info.cost not in ("view", "none", "control")
        cast_numel = 0
        conv = cross = conv_i = cross_i = ()  # (tuples: most nodes have neither)
        n_in = len(in_fmts)
        i = -1
        for t in ins:
            i += 1
            if not t.name or isinstance(t, _Constant):
                continue  # weights are converted at compile time: no runtime TransData
            tid = id(t)
            if tid in const:
                continue
            have = fmt.get(tid)
            if have is None:
                have = A.get_format(t) or "ND"
            want = in_fmts[i] if i < n_in else "ND"
            if have != want and reads_data and not (have in _PLAIN and want in _PLAIN):
                conv += ((t, have, want),)
                conv_i += ((i, have, want),)
            # engine crossings
            src = engine_of.get(tid, "AICORE")
            if src != engine:
                cross += ((t, src, compute16),)
                cross_i += ((i, src, compute16),)
            if casts and (tid in half) != compute16 and t.dtype == _F32:
                cast_numel += math.prod(cx.shapes[tid])
        n_out = len(out_fmts)
        to_half = casts and compute16
        sid = w.sid
        i = -1
        for t in outs:
            i += 1
            tid = id(t)
            meta = t.__dict__.get(_META)  # (A.get_format)
            fmt[tid] = (meta.get(A.FORMAT) if meta else None) or (out_fmts[i] if i < n_out else "ND")
            engine_of[tid] = engine
            if to_half and t.dtype == _F32:
                half.add(tid)
            if sid:
                sid.pop(tid, None)  # (numbered again by its first reader's template key)
        host = region is not None
        key = (engine, compute16, host, cast_numel, in_fmts, out_fmts)
        rec_t = sig.memo.get(key)
        if rec_t is None:
            rec = self._node_cost(node, info, engine, compute16, in_fmts, out_fmts, host, cx, cast_numel)
            rec_t = sig.memo[key] = tuple(rec[k] for k in _REC_KEYS)
        if eng_note:
            rec_t = (*rec_t[:6], (eng_note + "; " + rec_t[6]).strip("; "))
        eng = cx.engines[id(node)] = (engine, "" if aicore else rec_t[6])
        e = (info, engine, compute16, in_fmts, out_fmts, host, rec_t, conv, cross)
        if tkey is not None:
            # each output's state as a reader's template key numbers it (see _templates)
            states = cx.states
            out_w = []
            for t in outs:
                tid = id(t)
                st = (cx.tcode[tid], fmt[tid], engine, tid in half, False)  # (a hit's output in const: not numbered)
                n = states.get(st)
                if n is None:
                    n = states[st] = -4 - len(states)
                out_w.append((fmt[tid], tid in half, n))
            out_w = tuple(out_w)
            te = (*e[:7], (), ())
            cx.templates[tkey] = (te, out_w, conv_i, cross_i, eng)
            cx.template_entries.add(id(te))
        return e

    # A node's template key (made inline in :meth:`_step`, the hot loop): its signature (:meth:`_signature`:
    # op, domain, cost attributes, each input's and output's code) with the walk state of each runtime input
    # (storage format, producer's engine, stored as fp16, folded by GE), the node's engine annotation
    # and each output's format annotation (what :meth:`_step` reads of the annotations); a runtime
    # input's state is one number (``_Walk.sid``). Two nodes of one key get the same walk entry from
    # :meth:`_step` but for their tensors (the demands are kept by input position) and write the same state
    # for their outputs. None (priced through the signature or the general way) for a node with an omitted
    # input or an unnamed output, an input whose format the walk has not set, or a tensor the signature
    # would not code (read like :meth:`_signature` reads it, in the same order: the same codes). Made only
    # for a node with static output shapes, outside host-scheduled regions.
    #: False: no node templates (every node priced through its signature or the general way)
    _templates = True
    #: False: the fusion chain reads a tensor's readers off a map of every item's inputs (not off
    #: the tensor's gs readers' list)
    _gs_readers = True

    def _signature(self, node: gs.Node, info: OpInfo, w: "_Walk", cx: _Ctx, outs_static: bool) -> tuple:
        """``(sig, first format, folded)``: the :class:`_Sig` of ``node`` (its op, domain, cost
        attributes (``_COST_ATTRS``) and each input's and output's code (:meth:`_tcode`)), with the
        walk state its formats read: the format of its first runtime input (as :meth:`_formats`
        reads it) and the bit mask of the inputs GE folds. Two nodes of one signature get the same
        engine, formats (given the same walk state) and cost record. ``sig`` None (the node is
        priced the general way) when an input's shape is not known yet without reading a
        symbolic one (that may write an assumption: the general path reads it, in its order) or a
        dtype is unhashable. ``outs_static``: every named output's declared shape is static."""
        tcode = cx.tcode
        a = node.attrs
        key = [node.op, node.domain, tuple(sorted((k, str(v)) for k, v in a.items() if k in _COST_ATTRS))
               if a and not _COST_ATTRS.isdisjoint(a) else ()]
        append = key.append
        first_fmt = None
        folded = 0
        fmt, const = w.fmt, w.const
        i = -1
        for t in node.inputs:
            i += 1
            if not t.name:  # an omitted optional input
                if t.dtype is not None or t.shape is not None:  # (read by the op limits: the general path)
                    return None, None, 0
                append(-2)
                continue
            tid = id(t)
            c = tcode.get(tid)
            if c is None:
                c = self._tcode(t, cx)
            if c < 0:
                return None, None, 0
            append(c)
            if not isinstance(t, _Constant):
                if first_fmt is None:
                    first_fmt = fmt.get(tid) or A.get_format(t) or "ND"
                if tid in const:
                    folded |= 1 << i
        append(-3)
        shapes, codes = cx.shapes, cx.codes
        for t in node.outputs:
            tid = id(t)
            c = tcode.get(tid)
            if c is None:
                if outs_static and t.name and tid not in shapes and not isinstance(t, _Constant):
                    # (_tcode's first static case, inline: a named output of static shape not read yet)
                    shape = shapes[tid] = tuple(t.shape)
                    c = tcode[tid] = _desc_code(codes, (shape, t.dtype, False))
                else:
                    # the outputs' shapes are read in their order, after the inputs', as the general
                    # path's memo key reads them (the first read of a symbolic dim writes its assumption)
                    c = self._tcode(t, cx, outs_static and bool(t.name), read=True)
            if c < 0:
                return None, None, 0
            append(c)
        key = tuple(key)
        sig = cx.sigs.get(key)
        if sig is None:
            # a reduce's output format reads its axes input's values: not part of the signature
            sig = cx.sigs[key] = _Sig(None, None if info.layout == "reduce" else {})
        return sig, first_fmt, folded

    def _tcode(self, t: gs.Tensor, cx: _Ctx, static: bool = False, read: bool = False) -> int:
        """The code of ``t`` in this walk (kept in ``cx.tcode``): of (shape, dtype, is a
        gs.Constant) where its declared shape is static and the one the estimate reads, else of
        (the shape the estimate reads, dtype, False, the declared shape with each dim's type).
        -1: not coded, when its shape is symbolic and not read yet (``read``: read it now) or its
        dtype is unhashable. ``static``: ``t.shape`` is known to be static (:func:`_static_dims`)."""
        tid = id(t)
        if isinstance(t, gs.Constant):
            values = t._values  # (its dtype and shape: a lazy weight's header, never loaded)
            shape = cx.shapes.get(tid)
            if shape is None:  # as _shape_uncached reads a constant's (no assumption)
                shape = cx.shapes[tid] = _values_shape(values)
            desc = (shape, values.dtype, True)
        else:
            raw = t.shape
            have = cx.shapes.get(tid)
            if static or _static_dims(raw):
                shape = tuple(raw)
                if have is None:
                    cx.shapes[tid] = shape
                    desc = (shape, t.dtype, False)
                elif have == shape:
                    desc = (shape, t.dtype, False)
                else:  # a shape the estimate fixed (_static_shapes)
                    desc = (have, t.dtype, False, tuple(raw), tuple(map(type, raw)))
            else:
                if have is None:
                    if not read:
                        return -1  # (not kept: the general path reads it, and it can be coded then)
                    have = self._shape(t, cx)
                # the declared shape too: the op limits and a Shape's price read it (int dims or not)
                desc = (have, t.dtype, False, None, None) if raw is None else (have, t.dtype, False, tuple(raw),
                                                                               tuple(map(type, raw)))
        code = cx.tcode[tid] = _desc_code(cx.codes, desc)
        return code

    def _step_general(self, node: gs.Node, info: OpInfo | None, region: dict | None, w: "_Walk", cx: _Ctx) -> tuple:
        """The rest of :meth:`_step` for a node without a signature (read every fact off the node)."""
        fmt, engine_of, const, half = w.fmt, w.engine_of, w.const, w.half
        engine, compute16, eng_note = self._engine(node, info, cx)
        ann = A.get_engine(node)
        if ann in ("AICORE", "AICPU", "HOST") and ann != engine:
            compute16 = ann == "AICORE" and info is not None and self._fp32_without_kernel(node, info)
            eng_note = f"engine {ann} by annotation"
            engine = ann
        in_fmts, out_fmts = self._formats(node, info, fmt, cx, const)
        if engine != "AICORE":
            in_fmts, out_fmts = ["ND"] * len(in_fmts), ["ND"] * len(out_fmts)
        reads_data = node.op not in ("Shape", "Size")
        conv = cross = ()
        for i, t in enumerate(node.inputs):
            if not t.name or isinstance(t, gs.Constant) or id(t) in const:
                continue
            have = fmt.get(id(t))
            if have is None:
                have = A.get_format(t) or "ND"
            want = in_fmts[i] if i < len(in_fmts) else "ND"
            if have != want and not (have in _PLAIN and want in _PLAIN) and reads_data:
                conv += ((t, have, want),)
            src = engine_of.get(id(t), "AICORE")
            if src != engine:
                cross += ((t, src, compute16),)
        for i, t in enumerate(node.outputs):
            fmt[id(t)] = A.get_format(t) or (out_fmts[i] if i < len(out_fmts) else "ND")
            engine_of[id(t)] = engine
            w.sid.pop(id(t), None)
        cast_numel = 0
        if engine == "AICORE" and info is not None and info.cost not in ("view", "none", "control"):
            for t in node.inputs:
                if t.name and not isinstance(t, gs.Constant) and id(t) not in const and t.dtype == _F32:
                    if (id(t) in half) != compute16:
                        cast_numel += math.prod(self._shape(t, cx))
            if compute16:
                half.update(id(t) for t in node.outputs if t.dtype == _F32)
        key = None
        if info is not None and info.cost != "control":
            key = (node.op, node.domain, engine, compute16, region is not None, cast_numel, tuple(in_fmts),
                   tuple(out_fmts), tuple((self._shape(t, cx), t.dtype) if t.name else None for t in node.inputs),
                   tuple((self._shape(t, cx), t.dtype) for t in node.outputs),
                   tuple(sorted((k, str(v)) for k, v in node.attrs.items() if k in _COST_ATTRS)))
            if node.op in ("Shape", "Size") and node.inputs:
                # its price reads its input's declared shape (all int dims: no kernel, else a host
                # op), which two tensors of one estimated shape need not share (as the signature)
                key += (all(isinstance(d, (int, np.integer)) for d in (node.inputs[0].shape or [None])),)
        if key is not None:
            try:
                hash(key)
            except TypeError:  # e.g. an optional-typed value (its gs dtype is a TypeProto)
                key = None
        rec_t = cx.memo.get(key) if key is not None else None
        if rec_t is None:
            rec = self._node_cost(node, info, engine, compute16, in_fmts, out_fmts, region is not None, cx, cast_numel)
            rec_t = tuple(rec[k] for k in _REC_KEYS)
            if key is not None:
                cx.memo[key] = rec_t
        if eng_note:
            rec_t = (*rec_t[:6], (eng_note + "; " + rec_t[6]).strip("; "))
        cx.engines[id(node)] = (engine, rec_t[6] if engine != "AICORE" else "")
        return (info, engine, compute16, tuple(in_fmts), tuple(out_fmts), region is not None, rec_t, conv, cross)


    @staticmethod
    def _folded_by_ge(node: gs.Node, info: OpInfo | None, const: set[int], static_graph: bool = False) -> bool:
        """GE's compile-time constant folding: every input a constant, or a Shape/Size of a
        tensor whose shape is static (ATC compiles a static-shape graph: the exporter's
        Shape -> Gather -> Concat chains become constants, GE-DYN, P)."""
        if info is None or info.cost in ("control", "transdata") or node.op in _NEVER_FOLDED:
            return False
        if node.op == "Constant" and not node.inputs:
            return True
        if node.op in ("Shape", "Size") and node.inputs:
            if static_graph:  # every input shape fixed and no data-dependent shape upstream
                return True
            shape = node.inputs[0].shape
            return shape is not None and all(type(d) is int or isinstance(d, np.integer) for d in shape) \
                and all(int(d) >= 0 for d in shape)
        seen = False
        for t in node.inputs:
            if t.name:
                if not (isinstance(t, gs.Constant) or id(t) in const):
                    return False
                seen = True
        return seen

    @staticmethod
    def static_inputs(graph: gs.Graph) -> bool:
        """Every graph input has a fixed shape: ATC compiles the graph as a static one."""
        return all(t.shape is not None and all(type(d) is int or isinstance(d, np.integer) for d in t.shape)
                   for t in graph.inputs)

    def _fold_value(self, node: gs.Node, cx: _Ctx) -> None:
        """The value of a small integer constant GE folds (shape arithmetic), where it is cheap to
        know: it fixes the output shape of a Reshape the exporter computed from Shape."""
        vals = cx.values
        try:
            ins = []
            for t in node.inputs:
                if not t.name:
                    ins.append(None)
                elif isinstance(t, gs.Constant):
                    # a small integer table, whether still on disk or already read by a pass (the
                    # same graph gets the same estimate); read without caching it on the tensor
                    v = t._values
                    if v.dtype not in (np.int64, np.int32) or math.prod(v.shape) > 64:
                        return
                    ins.append(np.asarray(peek_values(t)))
                elif id(t) in vals:
                    ins.append(vals[id(t)])
                elif node.op in ("Shape", "Size"):
                    ins.append(None)
                else:
                    return
            op, a = node.op, node.attrs
            if op == "Shape":
                out = np.array(self._shape(node.inputs[0], cx), dtype=np.int64)[a.get("start", 0):a.get("end", None)]
            elif op == "Size":
                out = np.array(math.prod(self._shape(node.inputs[0], cx)), dtype=np.int64)
            elif op == "Constant" and "value" in a:
                lazy = a["value"].__dict__.get("_values")  # not cached: the node's value stays as stored
                out = np.asarray(lazy.load() if isinstance(lazy, gs.ir.tensor.LazyValues) else a["value"].values)
            elif op == "Gather":
                out = np.take(ins[0], ins[1], axis=int(a.get("axis", 0)))
            elif op == "Unsqueeze":
                axes = ins[1] if len(ins) > 1 and ins[1] is not None else a.get("axes")
                out = np.expand_dims(ins[0], tuple(int(x) for x in np.ravel(axes)))
            elif op == "Squeeze":
                axes = ins[1] if len(ins) > 1 and ins[1] is not None else a.get("axes")
                out = np.squeeze(ins[0], tuple(int(x) for x in np.ravel(axes))) if axes is not None else np.squeeze(ins[0])
            elif op == "Concat":
                out = np.concatenate([np.atleast_1d(x) for x in ins if x is not None], axis=int(a.get("axis", 0)))
            elif op == "Cast":
                out = ins[0].astype(np.int64) if ins[0].dtype.kind in "iu" else None
            elif op in ("Mul", "Add", "Sub", "Div") and all(x is not None and x.dtype.kind in "iu" for x in ins):
                if op == "Div":
                    if np.any(ins[1] == 0):
                        return
                    out = np.sign(ins[0]) * np.sign(ins[1]) * (np.abs(ins[0]) // np.abs(ins[1]))  # truncates, as ONNX
                else:
                    out = {"Mul": np.multiply, "Add": np.add, "Sub": np.subtract}[op](ins[0], ins[1])
            elif op == "Slice" and len(ins) >= 3 and ins[0].ndim == 1:
                st = int(np.ravel(ins[1])[0])
                en = int(np.ravel(ins[2])[0])
                step = int(np.ravel(ins[4])[0]) if len(ins) > 4 and ins[4] is not None else 1
                out = ins[0][st:en:step]
            else:
                return
        except Exception:  # noqa: BLE001 - a value we cannot know only leaves a shape symbolic
            return
        if out is not None and out.size <= 64:
            for t in node.outputs[:1]:
                vals[id(t)] = out

    def _static_shapes(self, node: gs.Node, cx: _Ctx) -> None:
        """Output shapes that shape inference left symbolic but a static graph fixes: a Reshape
        whose target is a folded value, and the Transpose or elementwise op after it."""
        outs = [t for t in node.outputs if t.name]
        if not outs or all(t.shape is not None and all(type(d) is int for d in t.shape) for t in outs):
            return
        out = outs[0]
        if node.op == "Reshape" and len(node.inputs) > 1 and id(node.inputs[1]) in cx.values:
            src = self._shape(node.inputs[0], cx)
            target = [int(d) for d in np.ravel(cx.values[id(node.inputs[1])])]
            allow0 = int(node.attrs.get("allowzero", 0))
            dims = [src[i] if (d == 0 and not allow0 and i < len(src)) else d for i, d in enumerate(target)]
            if dims.count(-1) == 1:
                known = math.prod(d for d in dims if d != -1)
                dims[dims.index(-1)] = math.prod(src) // known if known else 0
            if all(d >= 0 for d in dims) and math.prod(dims) == math.prod(src):
                cx.shapes[id(out)] = tuple(dims)
        elif node.op == "Transpose" and node.inputs:
            src = self._shape(node.inputs[0], cx)
            perm = node.attrs.get("perm") or list(range(len(src)))[::-1]
            if len(perm) == len(src):
                cx.shapes[id(out)] = tuple(src[int(i)] for i in perm)
        elif node.op == "Slice" and len(node.inputs) >= 3 and all(id(t) in cx.values or isinstance(t, gs.Constant)
                                                                  for t in node.inputs[1:] if t.name):
            def val(t):
                return np.ravel(cx.values[id(t)] if id(t) in cx.values else np.asarray(t.values)).astype(np.int64)
            dims = list(self._shape(node.inputs[0], cx))
            if not dims:
                return
            starts, ends = val(node.inputs[1]), val(node.inputs[2])
            axes = val(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3].name else np.arange(len(starts))
            steps = val(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4].name else np.ones(len(starts), np.int64)
            for st, en, ax, sp in zip(starts, ends, axes, steps):
                ax = int(ax) % len(dims)
                dims[ax] = len(range(*slice(int(st), int(en), int(sp)).indices(dims[ax])))
            cx.shapes[id(out)] = tuple(dims)
        elif node.op == "Concat" and node.inputs:
            shapes = [self._shape(t, cx) for t in node.inputs if t.name]
            if not shapes or not shapes[0] or any(len(sh) != len(shapes[0]) for sh in shapes):
                return  # an input of unknown shape (costed as one element) says nothing of the rank
            ax = int(node.attrs.get("axis", 0)) % len(shapes[0])
            cx.shapes[id(out)] = tuple(sum(sh[ax] for sh in shapes) if i == ax else d for i, d in enumerate(shapes[0]))
        elif node.op in ("Conv", "MaxPool", "AveragePool") and node.inputs and node.attrs.get("auto_pad", "NOTSET") == "NOTSET":
            x = self._shape(node.inputs[0], cx)
            if len(x) < 3:
                return
            if node.op == "Conv" and len(node.inputs) > 1:
                w = self._shape(node.inputs[1], cx)
                if len(w) != len(x):
                    return
                co, ks = w[0], list(w[2:])
            else:
                co, ks = x[1], list(node.attrs.get("kernel_shape", []))
            n_sp = len(x) - 2
            strides = list(node.attrs.get("strides", [1] * n_sp))
            pads = list(node.attrs.get("pads", [0] * 2 * n_sp))
            dil = list(node.attrs.get("dilations", [1] * n_sp))
            if len(ks) == n_sp:
                sp = [(x[2 + i] + pads[i] + pads[i + n_sp] - dil[i] * (ks[i] - 1) - 1) // strides[i] + 1 for i in range(n_sp)]
                cx.shapes[id(out)] = (x[0], co, *sp)
        elif len(outs) == 1 and node.inputs and node.op in _SAME_SHAPE | {"BatchNormalization"}:
            cx.shapes[id(out)] = self._shape(node.inputs[0], cx)
        elif len(outs) == 1 and node.op in ("Add", "Sub", "Mul", "Div") and len(node.inputs) == 2:
            a, b = self._shape(node.inputs[0], cx), self._shape(node.inputs[1], cx)
            try:
                cx.shapes[id(out)] = tuple(np.broadcast_shapes(a, b))
            except ValueError:
                pass

    def _fuse(self, items: "list[_Item]", graph: gs.Graph, cx: _Ctx, const: set[int],
              outside: Any = None, fmt: dict[int, str] | None = None, top_graph: bool = False) -> "list[list[_Item]]":
        """What ATC does before the kernels run, applied to the per-node records:

        1. UB fusion (ATC-FSF, P): a Conv/MatMul/Gemm, a pooling or reduce kernel, or an
           elementwise op absorbs the chain of elementwise ops after it (bias, BN, residual Add,
           activation: TbeConv2DReluv2Pass, TbeEltwiseFusionPass, ATbeMatMulElemwiseFusionPass,
           TbeReduceElemwiseFusionPass, AutomaticUbFusion) while each link has one consumer, up to
           ``ub_fusion_max_ops`` ops: one kernel, one launch; the intermediates stay in UB (their
           GM write and read are not charged).
        2. L2 residency (E; every AI Core kernel but a Transpose, whose cost is its strided
           bursts): a tensor one kernel writes and another reads, up to
           ``l2_resident_fraction`` of L2, moves at the L2 rate instead of the GM rate. As the batch
           grows the activations outgrow L2: this is the knee of the batch curve (fps rises while
           launches and weights are shared by more images, then flattens where the traffic goes to GM).
           A graph input or output stays in GM, but not the intermediates GE's implicit TransData
           put next to one (as an explicit TransData's are, see :meth:`_io_in_l2`): a kernel that
           reads a graph input or output through a conversion reads the converted tensor, and a
           graph output stored in a device format (``fmt``: the walk's formats; ``top_graph``: the top
           graph, whose outputs leave in ND) is a twin its producer writes and its readers in that
           format read.

        Cost of a kernel: launch + max(cube, vector, memory) of its ops together.

        Returns the groups (lists of items, the head first). ``outside`` (the incremental
        estimate's local re-fusion, :mod:`graphpass.cost_model.incremental`): ``items`` are the
        nodes of some groups only; the readers of a tensor come from ``outside.readers`` and a
        chain that would take in a node not among ``items`` sets ``outside.reached``.
        """
        p = self.pv
        if not items:
            return []
        readers_of = item_of = None
        if outside is None:
            # a tensor's readers among the items: its readers' list (gs keeps it: one entry per input
            # that reads it, as node.inputs) filtered to the items' nodes
            by_node = {id(it.node): it for it in items}
            if len(by_node) == len(items) and self._gs_readers:
                item_of = by_node.get

                def readers(t: gs.Tensor, default: Any = None) -> Any:
                    out = []
                    for n in t.outputs:
                        it = item_of(id(n))
                        if it is not None:
                            out.append(it)
                    return out
            else:  # a node listed twice: read the readers off the items' inputs
                consumers: dict[int, list[_Item]] = {}
                for it in items:
                    for t in it.node.inputs:
                        if t.inputs:  # (only a node's output is asked for its readers)
                            lst = consumers.get(id(t))
                            if lst is None:
                                consumers[id(t)] = [it]
                            else:
                                lst.append(it)

                def readers(t: gs.Tensor, default: Any = None) -> Any:
                    return consumers.get(id(t), default)
                readers_of = consumers.get  # (by tensor id: readers() without the call, in the chain loop)
        else:
            readers = outside.readers
            readers_of = None
        graph_io = {id(t) for t in graph.outputs} | {id(t) for t in graph.inputs}
        io_in_l2 = self._io_in_l2
        l2_cap = p.l2_mib * 1048576 * p.l2_resident_fraction
        gm, l2 = p.gm_bytes_per_us, p.l2_bandwidth_gbps * 1e3
        save_gm = (1.0 / gm - 1.0 / l2) if l2 > gm else 0.0  # per byte that stays in L2
        max_ops = p.ub_fusion_max_ops
        efficiency = {"gather": p.gather_bw_efficiency, "transdata": p.transdata_bw_efficiency}
        saves = {}  # cost class -> save_gm / its efficiency
        groups: list[list[_Item]] = []
        bytes_of = self._bytes
        shapes, tcode, bytes_c = cx.shapes, cx.tcode, cx.bytes_of
        Constant = gs.Constant
        no_cons: list = []
        keep_notes = cx.keep_nodes
        solo: dict[int, tuple] = {}  # id of a template's walk entry -> the figures of a group of one with it
        shared = cx.template_entries
        for it in items:
            # an AI Core kernel whose memory traffic the fusion model may re-price? (its figure read now)
            if not it.kernel or it.fused or not it.us > 0.0:
                continue
            info = it.info
            group = [it]
            groups.append(group)
            # a fusion head: a Conv/MatMul/Gemm, a reduce, an elementwise op, a fixed-layout vector kernel
            if (it.node.op in _FUSION_HEADS or info.layout == "reduce" or (it.elt and it.us > 0.0)
                    or (info.cost == "vector" and info.layout == "fixed")):
                tail = it
                while len(group) < max_ops:
                    outs = tail.node.outputs
                    if len(outs) != 1 or not outs[0].name:
                        outs = [t for t in outs if t.name]
                        if len(outs) != 1:
                            break
                    out = outs[0]
                    if id(out) in graph_io:
                        break
                    if item_of is not None:
                        ons = out.outputs
                        if len(ons) == 1:  # (one reader: readers(), inline)
                            c = item_of(id(ons[0]))
                            cons = [c] if c is not None else no_cons
                        else:
                            cons = readers(out)
                    else:
                        cons = readers_of(id(out), no_cons) if readers_of is not None else readers(out, no_cons)
                    if len(cons) == 1:  # (_chain_step's first case, inline)
                        c = cons[0]
                        if not (c.elt and c.us > 0.0) or c.fused or c.host != tail.host:
                            break
                    else:
                        cons = self._chain_step(cons, out, readers)
                        if not cons or any(c.fused or c.host != tail.host for c in cons):
                            break
                    last = cons[-1].node.outputs[0]
                    if (shapes.get(id(out)) or self._shape(out, cx)) != (shapes.get(id(last)) or self._shape(last, cx)):
                        break
                    if len(group) + len(cons) > max_ops:
                        break
                    # a fused kernel keeps one storage format: it cannot span a TransData
                    out_fmt = tail.out_fmts[0] if tail.out_fmts else "ND"
                    spans = False
                    for c in cons:
                        for t, f in zip(c.node.inputs, c.in_fmts):
                            if t is out and f != out_fmt:
                                spans = True
                                break
                        if spans:
                            break
                    if spans:
                        break
                    if outside is not None and any(id(c.node) not in outside.inside for c in cons):
                        outside.reached = True  # a group not formed again would change: fuse the whole graph
                        return groups
                    tail = cons[-1]
                    group.extend(cons)
                    for c in cons:
                        c.fused = True
            # the group's figures summed left to right from 0, as sum() adds them
            solo_key = None
            if len(group) == 1:
                if id(it.e) in shared:
                    # a kernel of its own whose walk entry is a template's, and which reads and writes no
                    # graph input or output: the figures another such node got (the same tensors' codes,
                    # formats and constness: the same sums in the same order)
                    for t in it.node.outputs:
                        if id(t) in graph_io:
                            break
                    else:
                        for t in it.node.inputs:
                            if id(t) in graph_io:
                                break
                        else:
                            solo_key = id(it.e)
                            hit = solo.get(solo_key)
                            if hit is not None:
                                it.cube, it.vector, it.memory, it.us, it.bound = hit
                                continue
                internal = ()
                mem, cube, vector = 0 + it.memory, 0 + it.cube, 0 + it.vector
            else:
                internal = set()
                mem = cube = vector = 0
                last = group[-1]
                for g in group:
                    mem = mem + g.memory
                    cube = cube + g.cube
                    vector = vector + g.vector
                    if g is not last:
                        for t in g.node.outputs:
                            if t.name:
                                internal.add(id(t))
            for g in group:
                # a Transpose is not re-priced: its cost is short strided bursts (E), which L2 does not remove
                cost = g.info.cost
                save = saves.get(cost)
                if save is None:
                    save = saves[cost] = save_gm / efficiency.get(cost, 1.0)
                fmts, c16 = g.out_fmts, g.c16
                n_fmts = len(fmts)
                for i, t in enumerate(g.node.outputs):
                    if not t.name:
                        continue
                    tid = id(t)
                    f = fmts[i] if i < n_fmts else "ND"
                    code = tcode.get(tid, -1)  # (the hit of _bytes, inline)
                    b = bytes_c.get((code, f, c16)) if code >= 0 else None
                    if b is None:
                        b = bytes_of(t, f, cx, c16)
                    if tid in internal:
                        mem -= 2 * b / gm
                    elif b <= l2_cap and (tid not in graph_io or io_in_l2(t, None, graph, fmt, top_graph)):
                        mem -= b * save
                fmts = g.in_fmts
                n_fmts = len(fmts)
                for i, t in enumerate(g.node.inputs):
                    tid = id(t)
                    if isinstance(t, Constant) or not t.name or tid in const or tid in internal:
                        continue
                    f = fmts[i] if i < n_fmts else "ND"
                    if tid in graph_io and not io_in_l2(t, f, graph, fmt, top_graph):
                        continue
                    code = tcode.get(tid, -1)
                    b = bytes_c.get((code, f, c16)) if code >= 0 else None
                    if b is None:
                        b = bytes_of(t, f, cx, c16)
                    if b <= l2_cap:
                        mem -= b * save
            memory = max(0.0, mem)
            # the bound: the first of cube, vector, memory with the largest figure (as max() picks it)
            bound, top = "cube", cube
            if vector > top:
                bound, top = "vector", vector
            if memory > top:
                bound, top = "memory", memory
            launch = it.launch
            it.cube = cube
            it.vector = vector
            it.memory = memory
            it.us = launch + top
            it.bound = bound if top >= launch else ("host" if it.host else "launch")
            if solo_key is not None:
                solo[solo_key] = (cube, vector, memory, it.us, it.bound)
            if len(group) > 1:
                note = None
                if keep_notes:  # (the notes are read by the per-node records only)
                    it.note = (it.note + "; UB fusion: " + " + ".join(_op_label(g.node) for g in group)).strip("; ")
                    note = f"fused into {it.node.name or _op_label(it.node)} (UB fusion)"
                for g in group[1:]:
                    g.us = g.cube = g.vector = g.memory = g.launch = 0.0
                    g.bound = "fused"
                    g.note = note
        return groups

    @staticmethod
    def _io_in_l2(t: gs.Tensor, f: str | None, graph: gs.Graph, fmt: dict[int, str] | None, top: bool) -> bool:
        """Whether a kernel's access to graph input or output ``t`` is to an intermediate (an
        explicit TransData's, or the one GE's implicit TransData makes; how layout plans are
        written out, ``passes/layout/propagate_layout.materialize``): ``f`` None, a write of ``t``
        by its producer; else a read of ``t`` in format ``f``. A read through a conversion reads the
        converted tensor, which is the graph output itself only for the top graph output's
        conversion back to ND; a graph output of the top graph stored in a device format is
        written, and read in that format, as a twin. See :meth:`_transdata_l2` for the TransData's
        own read and write."""
        stored = fmt.get(id(t)) if fmt is not None else None
        if stored is None:
            stored = A.get_format(t) or "ND"
        twin = top and stored not in _PLAIN and any(x is t for x in graph.outputs) \
            and not any(x is t for x in graph.inputs)
        if f is None:
            return twin
        if f != stored and not (f in _PLAIN and stored in _PLAIN):  # through a conversion
            return not (twin and f == "ND")
        return twin

    @staticmethod
    def _chain_step(cons: "list[_Item]", t: gs.Tensor, readers: Any) -> "list[_Item]":
        """The elementwise op(s) a fused kernel can take in after its output ``t``: the one reader
        of ``t``, or a Swish/SiLU diamond ``t -> Sigmoid -> Mul(t, .)`` (ATC's SwishFusionPass makes
        it one Swish op, which then UB-fuses). [] when neither."""
        n = len(cons)
        if n == 1:
            c = cons[0]
            return cons if c.elt and c.us > 0.0 else []
        if n == 2:
            a, b = cons
            if not (a.elt and a.us > 0.0 and b.elt and b.us > 0.0):  # (eltwise(); both orders need both)
                return []
            for a, b in ((a, b), (b, a)):
                outs = a.node.outputs
                if len(outs) != 1 or not outs[0].name:
                    outs = [o for o in outs if o.name]
                    if len(outs) != 1:
                        continue
                r = readers(outs[0], None)
                if r is not None and len(r) == 1 and r[0] is b:
                    for i in b.node.inputs:
                        if i is t:
                            return [a, b]
        return []

    @staticmethod
    def _starts_dynamic(node: gs.Node, info: OpInfo | None) -> str:
        if info is not None and info.dynamic_output:
            return "data-dependent output shape"
        if node.op == "TopK" and len(node.inputs) > 1 and not isinstance(node.inputs[1], gs.Constant):
            return "TopK with a runtime k"
        return ""

    def _fp32_without_kernel(self, node: gs.Node, info: OpInfo) -> bool:
        """The node's data input is fp32 and its AI Core kernel on this target has no fp32."""
        t = next((t for t in node.inputs if t.name and not isinstance(t, gs.Constant)), None)
        if t is None or self._dtype(t) != _F32:
            return False
        if info.cost == "cube":
            return not self.profile.cube_fp32
        return "float32" not in info.dtypes_on(self.target) or info.fp16_only_on(self.target)

    def _engine(self, node: gs.Node, info: OpInfo | None, cx: _Ctx) -> tuple[str, bool, str]:
        """(engine, computes fp32 as fp16, note)."""
        if info is None:
            return "AICPU", False, "unknown op: costed as AI CPU"
        dtype = None
        for t in node.inputs:
            if t.name and not isinstance(t, gs.Constant):
                dtype = self._dtype(t)
                break
        if dtype is None:
            dtype = self._dtype(node.outputs[0]) if node.outputs else _F32
        engine = info.engine
        if engine != "AICORE" or info.cost in ("view", "none", "control"):
            return engine, False, ""
        limits = load_op_limits()
        limit = limits.aicpu_reason(node)  # an attribute or size outside the AI Core kernel
        if limit:
            return "AICPU", False, limit
        limit = limits.int64_reason(node, self.target)  # int64 data where the AI Core kernel has no int64
        if limit:
            return "AICPU", False, limit
        if dtype != _F32:
            name = _dtype_name(dtype)
            if name not in info.dtypes_on(self.target) and name not in ("int64", "float64"):
                return "AICPU", False, f"{name} has no AI Core kernel"
            return engine, False, ""
        # fp32 input
        cube = info.cost == "cube"
        fp32_ok = ("float32" in info.dtypes_on(self.target)) and not info.fp16_only_on(self.target)
        if cube:
            fp32_ok = bool(self.profile.cube_fp32)
        mode = cx.mode
        if mode == "force_fp16":
            return engine, True, ""
        if mode in ("allow_fp32_to_fp16", "allow_mix_precision"):
            if cube or not fp32_ok:
                return engine, True, ""
            return engine, False, ""
        # must_keep_origin_dtype / force_fp32
        if fp32_ok:
            return engine, False, ""
        if mode == "force_fp32" and cube:
            return engine, True, "fp16 in, fp32 out on the Cube"
        return "AICPU", False, f"fp32 {info.ascend} has no fp32 AI Core kernel on {self.target} ({mode}: AI CPU fallback)"

    def _formats(self, node: gs.Node, info: OpInfo | None, fmt: dict[int, str], cx: _Ctx,
                 const: set[int]) -> tuple[list[str], list[str]]:
        n_in, n_out = len(node.inputs), len(node.outputs)
        first_fmt = "ND"
        for t in node.inputs:
            if t.name and not isinstance(t, gs.Constant):
                first_fmt = fmt.get(id(t)) or A.get_format(t) or "ND"
                break
        if info is None or info.layout in ("nd", "none"):
            return ["ND"] * n_in, ["ND"] * n_out
        if info.layout == "fixed":
            return [info.input_format(i) for i in range(n_in)], [info.output_format(i) for i in range(n_out)]
        if info.layout == "any":  # TransData
            src = str(node.attrs.get("src_format", first_fmt))
            dst = str(node.attrs.get("dst_format", "ND"))
            return [src] * n_in, [dst] * n_out
        if info.layout == "agnostic":
            f = "NC1HWC0" if first_fmt == "NC1HWC0" and (node.op in ("Concat", "Split") or self._is_5hd_ok(node, cx, const)) else "ND"
            if node.op in ("Concat", "Split") and f == "NC1HWC0":
                axis = int(node.attrs.get("axis", 0))
                if axis not in (1, -3):
                    f = "ND"
            ins = [f if (t.name and not isinstance(t, gs.Constant) and id(t) not in const) else "ND" for t in node.inputs]
            return ins, [f] * n_out
        if info.layout == "reduce":
            if first_fmt == "NC1HWC0":
                axes = node.attrs.get("axes", node.attrs.get("axis"))
                second = node.inputs[1] if len(node.inputs) > 1 else None
                if (axes is None and node.op.startswith("Reduce") and isinstance(second, gs.Constant)
                        and np.asarray(second.values).dtype.kind in "iu"):  # the axes input (opset 13/18+)
                    axes = [int(a) for a in np.asarray(second.values).ravel()]
                axes = [axes] if isinstance(axes, (int, np.integer)) else list(axes or [])
                over_c = (not axes and node.op.startswith("Reduce")) or any(int(a) in (1, -3) for a in axes)
                # a reduction that drops dims leaves no (N, C, H, W) to tile: its output is ND too
                over_c = over_c or any(len(self._shape(t, cx)) != 4 for t in node.outputs if t.name)
                return ["NC1HWC0"] + ["ND"] * (n_in - 1), ["ND" if over_c else "NC1HWC0"] * n_out
            return ["ND"] * n_in, ["ND"] * n_out
        return ["ND"] * n_in, ["ND"] * n_out

    # -- costs ----------------------------------------------------------------------------

    @staticmethod
    def _transdata_l2(t: gs.Tensor, src: str, dst: str, inputs: Any, outputs: Any,
                      top: bool = True) -> tuple[bool, bool]:
        """Where the explicit TransData at the place of an implicit one of ``t`` (``src`` ->
        ``dst``) would read and write (``inputs``, ``outputs``: the ids of the graph's inputs and
        outputs; how layout plans are written out, ``passes/layout/propagate_layout.materialize``):
        (its input may stay in L2, its output may stay in L2), the bytes aside. It reads ``t``
        itself, a graph input or output kept by ``_fuse`` out of L2, except when ``t`` is an output
        of the top graph (``top``) stored in a device format: then its producer writes a twin (an
        intermediate) that every conversion of ``t`` reads. It writes a new intermediate, except
        the conversion of such a graph output back to ND, which writes the graph output (the
        twins of :meth:`_io_in_l2`)."""
        tid = id(t)
        if tid in inputs:
            return False, not (top and tid in outputs and dst == "ND" and src not in _PLAIN)
        if tid in outputs and top and src not in _PLAIN:
            return True, dst != "ND"
        return tid not in outputs, True

    def _transdata_us(self, t: gs.Tensor, src: str, dst: str, cx: _Ctx,
                      l2: tuple[bool, bool] = (False, False)) -> float:
        """One TransData of ``t``, implicit or explicit alike: what a TransData node at that place
        would cost after ``_fuse`` (its L2 residency: ``l2`` from :meth:`_transdata_l2`), a coded
        tensor's once per estimate for its shape, dtype, formats and ``l2``."""
        code = cx.tcode.get(id(t), -1)
        if code >= 0:
            key = (code, src, dst, l2)
            hit = cx.transdata.get(key)
            if hit is None:
                hit = cx.transdata[key] = self._transdata_us_uncached(t, src, dst, cx, l2)
            return hit
        return self._transdata_us_uncached(t, src, dst, cx, l2)

    def _transdata_us_uncached(self, t: gs.Tensor, src: str, dst: str, cx: _Ctx,
                               l2: tuple[bool, bool] = (False, False)) -> float:
        """The figure of a ``graphpass.ascend::TransData`` node from ``t`` in ``src`` to a tensor
        like ``t`` in ``dst``, as the walk prices it, re-priced as ``_fuse`` re-prices a kernel of
        its own (a TransData never heads a fusion group nor joins one): its read (if ``l2[0]``)
        and its write (if ``l2[1]``) at the L2 rate when the tensor fits ``l2_resident_fraction``
        of L2, the same sums in the same order; then ``[op_scale]`` as ``_contributions`` applies it."""
        info = self.ops.lookup("TransData", "graphpass.ascend")
        fake = SimpleNamespace(op="TransData", domain="graphpass.ascend", inputs=[t], outputs=[t], attrs={})
        engine, compute16, _ = self._engine(fake, info, cx)
        rec = self._node_cost(fake, info, engine, compute16, [src], [dst], False, cx)
        us = rec["us"]
        if (l2[0] or l2[1]) and cx.fusion and engine == "AICORE" and info is not None and us > 0.0:
            p = self.pv
            l2_cap = p.l2_mib * 1048576 * p.l2_resident_fraction
            gm, l2_rate = p.gm_bytes_per_us, p.l2_bandwidth_gbps * 1e3
            save_gm = (1.0 / gm - 1.0 / l2_rate) if l2_rate > gm else 0.0
            save = save_gm / (p.transdata_bw_efficiency if info.cost == "transdata" else 1.0)
            mem = 0 + rec["memory_us"]
            if l2[1]:  # (outputs first, then inputs: _fuse's order)
                b = self._bytes(t, dst, cx, compute16)
                if b <= l2_cap:
                    mem -= b * save
            if l2[0]:
                b = self._bytes(t, src, cx, compute16)
                if b <= l2_cap:
                    mem -= b * save
            memory = max(0.0, mem)
            top = 0 + rec["cube_us"]
            if rec["vector_us"] > top:
                top = rec["vector_us"]
            if memory > top:
                top = memory
            us = rec["launch_us"] + top
        scale = self.profile.op_scale
        if scale and us and "TransData" in scale:
            us *= scale["TransData"]
        return us

    def _cross(self, t: gs.Tensor, src: str, dst: str, cx: _Ctx, compute16: bool) -> None:
        cx.crossings.append(self._crossing(t, src, dst, cx, compute16))

    def _crossing(self, t: gs.Tensor, src: str, dst: str, cx: _Ctx, compute16: bool) -> dict[str, Any]:
        """A tensor crossing between engines (its record: tensor, from, to, bytes, us)."""
        p = self.pv
        byts = self._bytes(t, "ND", cx, compute16)
        if "HOST" in (src, dst):
            rate = p.h2d_gbps if dst != "HOST" else p.d2h_gbps
            us = p.small_copy_us + byts / (rate * 1e3) + p.host_sync_us
        else:
            us = p.engine_sync_us
        return {"tensor": t.name, "from": src, "to": dst, "bytes": int(byts), "us": us}

    def _node_cost(self, node: gs.Node, info: OpInfo | None, engine: str, compute16: bool,
                   in_fmts: list[str], out_fmts: list[str], host_scheduled: bool, cx: _Ctx,
                   cast_numel: int = 0) -> dict[str, Any]:
        p = self.pv
        rec = {"us": 0.0, "bound": "none", "cube_us": 0.0, "vector_us": 0.0, "memory_us": 0.0, "launch_us": 0.0, "note": ""}
        cost = info.cost if info is not None else "vector"
        if cost == "none":
            if node.op in ("Shape", "Size") and node.inputs and all(
                    isinstance(d, (int, np.integer)) for d in (node.inputs[0].shape or [None])):
                return rec
            if node.op in ("Shape", "Size"):
                engine = "HOST"
            else:
                return rec
        if cost == "control":
            return self._control_cost(node, cx, rec)
        if cost == "view" and all(f in _PLAIN for f in in_fmts[:1]) and engine == "AICORE":
            rec["note"] = "view: no kernel"
            return rec
        # bytes moved
        in_bytes = 0.0
        for i, t in enumerate(node.inputs):
            if t.name:
                f = in_fmts[i] if i < len(in_fmts) else "ND"
                in_bytes += self._bytes(t, f, cx, compute16)
        out_bytes = 0.0
        out_numel = 0
        for i, t in enumerate(node.outputs):
            if t.name:
                f = out_fmts[i] if i < len(out_fmts) else "ND"
                item = self._storage_itemsize(self._dtype(t), compute16)
                numel = padded_numel(self._shape(t, cx), f, item, self.fr)
                out_numel = max(out_numel, numel)
                out_bytes += numel * item

        if engine == "AICPU":
            rec["memory_us"] = (in_bytes + out_bytes) / (p.aicpu_gbps * 1e3)
            rec["launch_us"] = p.aicpu_op_us
            rec["us"] = rec["launch_us"] + rec["memory_us"]
            rec["bound"] = "aicpu"
            return rec
        if engine == "HOST":
            rec["launch_us"] = p.host_dispatch_us
            rec["us"] = p.host_dispatch_us
            rec["bound"] = "host"
            return rec

        eff = 1.0
        if cost == "transpose":
            eff = p.transpose_bw_efficiency
        elif cost == "gather":
            eff = p.gather_bw_efficiency
        elif cost == "transdata":
            eff = p.transdata_bw_efficiency
        mem_bytes = in_bytes + out_bytes
        if node.op == "Concat" and out_fmts and out_fmts[0] == "NC1HWC0":
            item = self._storage_itemsize(self._dtype(node.outputs[0]), compute16)
            c0 = c0_of(item, self.fr)
            chans = [self._shape(t, cx) for t in node.inputs if t.name]
            if all(len(s) == 4 and s[1] % c0 == 0 for s in chans) and not host_scheduled:
                rec["note"] = "no-task Concat: aligned C in 5HD (GE-CNT)"
                return rec
            mem_bytes += in_bytes + out_bytes  # repack the padded C0 lanes (E)
            rec["note"] = f"Concat of C not a multiple of {c0} in 5HD: repacking kernel"
        elif node.op == "Split" and out_fmts and out_fmts[0] == "NC1HWC0":
            item = self._storage_itemsize(self._dtype(node.inputs[0]), compute16)
            c0 = c0_of(item, self.fr)
            if any(len(s) == 4 and s[1] % c0 for s in (self._shape(t, cx) for t in node.outputs if t.name)):
                mem_bytes += in_bytes + out_bytes  # outputs start inside a C0 lane: repack (E), as for Concat
                rec["note"] = f"Split into C not a multiple of {c0} in 5HD: repacking kernel"
        rec["memory_us"] = mem_bytes / (p.gm_bytes_per_us * eff)

        elems = p.vector_fp16_elems_per_cycle if (compute16 or self._dtype(node.outputs[0]).itemsize <= 2) else p.vector_fp32_elems_per_cycle
        if node.op in _ATTENTION_OPS and node.domain == "graphpass.ascend":
            bn, sq, skv, _ = self._attention_dims(node, cx)
            out_numel = bn * sq * skv  # the softmax runs over the scores, which never leave the core
        if cost in ("vector", "cube"):
            ops = (info.vector_ops if info is not None else 0.0) or self.ops.default_vector_ops
            rec["vector_us"] = vector_cycles(out_numel, elems, ops) / max(1, p.vector_core_count) / p.vector_freq_mhz
        if cast_numel:
            rec["vector_us"] += cast_numel / p.vector_fp32_elems_per_cycle / max(1, p.vector_core_count) / p.vector_freq_mhz
            rec["note"] = (rec["note"] + "; casts between fp32 and fp16 storage").strip("; ")
        if cost == "cube":
            cycles, tiles = self._cube(node, cx, compute16)
            rec["cube_us"] = cycles / max(1, min(p.ai_core_count, tiles)) / p.cube_freq_mhz / p.cube_efficiency
        rec["launch_us"] = p.host_dispatch_us if host_scheduled else p.kernel_launch_us
        parts = {"cube": rec["cube_us"], "vector": rec["vector_us"], "memory": rec["memory_us"]}
        bound = max(parts, key=parts.get)
        rec["us"] = rec["launch_us"] + parts[bound]
        rec["bound"] = bound if parts[bound] >= rec["launch_us"] else ("host" if host_scheduled else "launch")
        return rec

    def _cube(self, node: gs.Node, cx: _Ctx, compute16: bool) -> tuple[float, int]:
        """(cycles in fp16/int8 fractal units scaled for the dtype, parallel tiles)."""
        p = self.pv
        dtype = self._dtype(node.inputs[0]) if node.inputs else np.dtype("float32")
        item = 2 if compute16 else dtype.itemsize
        c0 = c0_of(item, self.fr)
        m16 = self.fr.m
        scale = 1.0
        if item == 4:  # fp32 on a Cube that has it (910B): fewer MACs per cycle
            scale = p.cube_fp16_macs_per_cycle / max(1, p.cube_fp32_macs_per_cycle)
        if (node.op in ("Conv", "ConvTranspose") or node.op.startswith("FusedConv")) and len(node.inputs) >= 2:
            x, w, y = self._shape(node.inputs[0], cx), self._shape(node.inputs[1], cx), self._shape(node.outputs[0], cx)
            if len(x) < 3 or len(w) < 3 or len(y) < 3:
                return 0.0, 1
            groups = int(node.attrs.get("group", 1))
            kh = w[2]
            kw = w[3] if len(w) > 3 else 1
            spatial_out = y[2] * (y[3] if len(y) > 3 else 1)
            if node.op != "ConvTranspose":
                cin, cout = x[1], w[0]
                cycles = cube_cycles_conv(x[0], cin, cout, kh, kw, y[2], y[3] if len(y) > 3 else 1, groups, self.fr, c0)
                pack = groups_per_fractal(cin // max(groups, 1), cout // max(groups, 1), groups, c0)
                tiles = _ceil(spatial_out, m16) * _ceil(cout // max(groups, 1) * pack, m16) * x[0] * _ceil(groups, pack)
            else:  # ConvTranspose: each input pixel scatters a kh*kw patch (E)
                cin, cout = x[1], w[1] * groups
                spatial_in = x[2] * (x[3] if len(x) > 3 else 1)
                cycles = _ceil(spatial_in, m16) * _ceil(cin // groups, c0) * _ceil(cout // groups * kh * kw, m16) * x[0] * groups
                tiles = _ceil(spatial_in, m16) * _ceil(cout // groups, m16) * x[0] * groups
            return cycles * scale, max(1, tiles)
        if node.op in _ATTENTION_OPS and len(node.inputs) >= 3:
            bn, sq, skv, d = self._attention_dims(node, cx)
            dv = d
            cycles = cube_cycles_matmul(sq, d, skv, bn, self.fr, c0) + cube_cycles_matmul(sq, skv, dv, bn, self.fr, c0)
            return cycles * scale, max(1, _ceil(sq, m16) * bn)
        if node.op in ("MatMul", "Gemm") and len(node.inputs) >= 2:
            a, b = self._shape(node.inputs[0], cx), self._shape(node.inputs[1], cx)
            if node.op == "Gemm":
                # (an input of unknown shape is costed as one element: rank 1)
                m, k = (a[1] if len(a) > 1 else 1, a[0]) if node.attrs.get("transA", 0) else (a[0], a[1] if len(a) > 1 else 1)
                n = b[0] if node.attrs.get("transB", 0) else (b[1] if len(b) > 1 else 1)
                batch = 1
            else:
                m = a[-2] if len(a) >= 2 else 1
                k = a[-1]
                n = b[-1] if len(b) >= 2 else 1
                batch = 1
                for d in (a[:-2] if len(a) > len(b) else b[:-2]):
                    batch *= d
            return cube_cycles_matmul(m, k, n, batch, self.fr, c0) * scale, max(1, _ceil(m, m16) * _ceil(n, m16) * batch)
        if node.op in ("LSTM", "GRU") and len(node.inputs) >= 3:
            x, w = self._shape(node.inputs[0], cx), self._shape(node.inputs[1], cx)
            seq, batch = x[0], x[1] if len(x) > 1 else 1
            gates, hidden_in = w[1] if len(w) > 1 else 1, w[2] if len(w) > 2 else 1
            hidden = gates // (4 if node.op == "LSTM" else 3)
            cycles = seq * cube_cycles_matmul(batch, hidden_in + hidden, gates, 1, self.fr, c0)
            return cycles * scale, max(1, _ceil(batch, m16) * _ceil(gates, m16))
        return 0.0, 1

    def _attention_dims(self, node: gs.Node, cx: _Ctx) -> tuple[int, int, int, int]:
        """(B*N, Sq, Skv, D) of a graphpass.ascend::Attention (BNSD) or AttentionBSH (BSH) node."""
        q, k = self._shape(node.inputs[0], cx), self._shape(node.inputs[1], cx)
        heads = max(1, int(node.attrs.get("num_heads", 1)))
        if node.op == "AttentionBSH" and len(q) == 3 and len(k) == 3:
            return q[0] * heads, q[1], k[1], max(1, q[2] // heads)
        if len(q) == 4 and len(k) == 4:
            return q[0] * q[1], q[2], k[2], q[3]
        return 1, 1, 1, 1

    def _control_cost(self, node: gs.Node, cx: _Ctx, rec: dict[str, Any]) -> dict[str, Any]:
        p = self.pv
        subs = subgraphs_of(node)
        if not subs:
            return rec
        if node.op == "If":
            body = max(self._graph_cost(g, cx) for g in subs)
            rec["us"] = p.kernel_launch_us + body
            rec["launch_us"] = p.kernel_launch_us
            rec["bound"] = "control"
            rec["note"] = "the dearer branch"
            return rec
        trips = None
        if node.op == "Loop" and node.inputs and isinstance(node.inputs[0], gs.Constant):
            trips = int(np.asarray(node.inputs[0].values).ravel()[0])
        elif node.op == "Scan":
            n_state = len(node.inputs) - int(node.attrs.get("num_scan_inputs", 1))
            scan_in = node.inputs[n_state] if len(node.inputs) > n_state else None
            if scan_in is not None:
                axes = node.attrs.get("scan_input_axes")
                axis = int(axes[0]) if axes else 0
                shape = self._shape(scan_in, cx)
                trips = shape[axis] if shape and axis < len(shape) else None
        if trips is None:
            trips = cx.loop_trips
            cx.assume(f"{node.op} '{node.name}': trip count not constant, taken as {trips} (--loop-trips)")
        body = self._graph_cost(subs[0], cx)
        sunk = A.get(node, A.SINK) == "device"
        per_iter = 0.0 if sunk else p.graph_launch_us + p.host_sync_us
        rec["us"] = p.kernel_launch_us + trips * (body + per_iter)
        rec["launch_us"] = p.kernel_launch_us
        rec["bound"] = "control"
        rec["note"] = f"{trips} iterations, {'sunk (one launch)' if sunk else 'host-driven: launch + sync per iteration'}"
        return rec

    # -- layout ---------------------------------------------------------------------------

    def format_oracle(self, graph: gs.Graph, precision_mode: str | None = None,
                      input_shapes: dict[str, list[int]] | None = None, **_: Any):
        """Per-node format facts for the layout passes (see ``cost_model/formats.py``)."""
        from graphpass.cost_model.formats import FormatOracle

        return FormatOracle(self, graph, precision_mode, input_shapes)
