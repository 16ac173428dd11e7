"""Numeric verification with onnxruntime (graph optimizations off, so ORT does not redo our work).

This module is the base that ``graphpass verify``/``bisect`` build on; the pass manager uses it
for ``--verify-each``. Inputs are generated per input dtype and shape from a seed; dynamic dims
take the value given in ``input_shapes`` or 1.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np
import onnx

from graphpass.errors import BadModelError

__all__ = ["OutputComparison", "VerifyReport", "session", "random_inputs", "run", "compare", "all_match",
           "load_inputs", "verify_models"]


@dataclasses.dataclass
class OutputComparison:
    name: str
    max_abs: float
    max_rel: float
    cosine: float
    ok: bool
    note: str = ""


def session(model: onnx.ModelProto | bytes | str):
    """An onnxruntime CPU session with every graph optimization disabled."""
    from graphpass import runtime

    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    try:
        return runtime.session(data)  # quiet unless -v (graphpass.runtime)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadModelError(f"onnxruntime cannot run the model: {first}") from e


_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int16)": np.int16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
}


def random_inputs(
    sess, seed: int = 0, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> dict[str, np.ndarray]:
    """Seeded inputs for every input of ``sess``: normal floats, small non-negative ints, bools."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for inp in sess.get_inputs():
        given = (input_shapes or {}).get(inp.name)
        shape = list(given) if given is not None else [d if isinstance(d, int) and d >= 0 else 1 for d in inp.shape]
        dtype = _ORT_TYPES.get(inp.type)
        if dtype is None:
            raise BadModelError(f"input '{inp.name}' has type {inp.type}, which graphpass cannot generate")
        if np.issubdtype(dtype, np.floating):
            arr = rng.standard_normal(shape).astype(dtype)
        elif dtype is np.bool_:
            arr = rng.integers(0, 2, size=shape).astype(np.bool_)
        else:
            arr = rng.integers(0, 4, size=shape).astype(dtype)
        feeds[inp.name] = arr
    return feeds


def run(sess, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(names, dict(feeds))
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadModelError(f"onnxruntime failed to run the model: {first}") from e
    return dict(zip(names, values))


def _compare_one(name: str, ref: np.ndarray, got: np.ndarray, rtol: float, atol: float) -> OutputComparison:
    ref = np.asarray(ref)
    got = np.asarray(got)
    if ref.shape != got.shape:
        return OutputComparison(name, float("inf"), float("inf"), 0.0, False, f"shape {got.shape} != {ref.shape}")
    if ref.dtype != got.dtype:
        return OutputComparison(name, float("inf"), float("inf"), 0.0, False, f"dtype {got.dtype} != {ref.dtype}")
    if ref.size == 0:
        return OutputComparison(name, 0.0, 0.0, 1.0, True)
    if ref.dtype == object or not np.issubdtype(ref.dtype, np.number) and ref.dtype != np.bool_:
        same = bool(np.array_equal(ref, got))
        return OutputComparison(name, 0.0 if same else float("inf"), 0.0, 1.0 if same else 0.0, same)
    r = ref.astype(np.float64)
    g = got.astype(np.float64)
    nan_r, nan_g = np.isnan(r), np.isnan(g)
    if not np.array_equal(nan_r, nan_g):
        return OutputComparison(name, float("nan"), float("nan"), 0.0, False, "NaN positions differ")
    r = np.where(nan_r, 0.0, r)
    g = np.where(nan_g, 0.0, g)
    inf_same = np.array_equal(np.isinf(r), np.isinf(g)) and np.array_equal(r[np.isinf(r)], g[np.isinf(g)])
    finite = np.isfinite(r) & np.isfinite(g)
    diff = np.abs(r[finite] - g[finite])
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(r[finite]).max()) if diff.size else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    nr, ng = np.linalg.norm(r[finite]), np.linalg.norm(g[finite])
    cosine = float(np.dot(r[finite].ravel(), g[finite].ravel()) / (nr * ng)) if nr > 0 and ng > 0 else (1.0 if nr == ng else 0.0)
    ok = bool(inf_same and max_abs <= atol + rtol * scale)
    return OutputComparison(name, max_abs, max_rel, cosine, ok, "" if inf_same else "Inf positions differ")


def compare(
    ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], rtol: float = 1e-4, atol: float = 1e-5
) -> list[OutputComparison]:
    """Per output of ``ref``: errors and whether ``max_abs <= atol + rtol * max|ref|``."""
    out = []
    for name, r in ref.items():
        if name not in got:
            out.append(OutputComparison(name, float("inf"), float("inf"), 0.0, False, "missing output"))
        else:
            out.append(_compare_one(name, r, got[name], rtol, atol))
    return out


def all_match(comparisons: Sequence[OutputComparison]) -> bool:
    return all(c.ok for c in comparisons)


# ------------------------------------------------------------------------------------------
# whole-model verification (graphpass verify)


@dataclasses.dataclass
class VerifyReport:
    """Outputs (and optionally every shared intermediate) of two models on the same inputs."""

    outputs: list[OutputComparison]
    tensors: list[OutputComparison] = dataclasses.field(default_factory=list)
    first_divergence: str | None = None
    first_nonfinite: dict[str, str | None] = dataclasses.field(default_factory=dict)
    inputs: dict[str, str] = dataclasses.field(default_factory=dict)
    min_cosine: float | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.outputs)

    def to_dict(self) -> dict:
        return {
            "schema": "graphpass.verify_report/1",
            "ok": self.ok,
            "inputs": self.inputs,
            "outputs": [dataclasses.asdict(c) for c in self.outputs],
            "tensors_compared": len(self.tensors),
            "first_divergence": self.first_divergence,
            "first_nonfinite": self.first_nonfinite,
            "tensors": [dataclasses.asdict(c) for c in self.tensors if not c.ok],
        }


def load_inputs(path: str, sess) -> dict[str, np.ndarray]:
    """Inputs from an .npz: every model input present, with the model's dtype and a fitting shape."""
    from graphpass.errors import UsageError

    try:
        data = dict(np.load(path, allow_pickle=False))
    except Exception as e:  # noqa: BLE001 - a corrupt .npz raises BadZipFile, EOFError, ValueError, OSError...
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UsageError(f"{path}: cannot read the inputs (not a valid .npz: {reason})") from None
    feeds = {}
    for inp in sess.get_inputs():
        if inp.name not in data:
            raise UsageError(f"{path}: input '{inp.name}' is missing (the file has: {', '.join(sorted(data)) or 'nothing'})")
        arr = data[inp.name]
        want = _ORT_TYPES.get(inp.type)
        if want is not None and arr.dtype != np.dtype(want):
            raise UsageError(f"{path}: input '{inp.name}' is {arr.dtype}, the model wants {np.dtype(want)}")
        dims = inp.shape
        if len(dims) != arr.ndim or any(isinstance(d, int) and d >= 0 and d != s for d, s in zip(dims, arr.shape)):
            raise UsageError(f"{path}: input '{inp.name}' has shape {list(arr.shape)}, the model wants {dims}")
        feeds[inp.name] = arr
    return feeds


def _expose_all(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy whose every typed main-graph tensor is also an output; names in topological order."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    types = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    order: list[str] = []
    for node in m.graph.node:
        for name in node.output:
            vi = types.get(name)
            if not name or vi is None or not vi.type.HasField("tensor_type") or not vi.type.tensor_type.elem_type:
                continue
            order.append(name)
            if name not in have:
                m.graph.output.append(vi)
                have.add(name)
    return m, order


def _provenance_map(a: onnx.ModelProto, b: onnx.ModelProto) -> dict[str, str]:
    """B tensor -> A tensor for nodes a rewrite created (graphpass.fused_from), where names differ."""
    import json

    a_out = {n.name: list(n.output) for n in a.graph.node if n.name}
    a_names = {o for n in a.graph.node for o in n.output}
    mapping = {}
    for n in b.graph.node:
        props = {p.key: p.value for p in n.metadata_props}
        fused = props.get("graphpass.fused_from")
        if not fused or not n.output or n.output[0] in a_names:
            continue
        try:
            origin = json.loads(fused)
        except ValueError:
            continue
        if origin and origin[-1] in a_out and a_out[origin[-1]]:
            mapping[n.output[0]] = a_out[origin[-1]][0]
    return mapping


def verify_models(
    a: onnx.ModelProto,
    b: onnx.ModelProto,
    feeds: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    min_cosine: float | None = None,
    all_tensors: bool = False,
) -> VerifyReport:
    """Run ``a`` and ``b`` on the same inputs in onnxruntime (optimizations off) and compare.

    Raises:
        UsageError: the models have different inputs or outputs.
        BadModelError: onnxruntime cannot run one of them (its reason, one line).
    """
    from graphpass.errors import UsageError

    sa, sb = session(a), session(b)
    ins_a, ins_b = {i.name for i in sa.get_inputs()}, {i.name for i in sb.get_inputs()}
    if ins_a != ins_b:
        raise UsageError(f"the models have different inputs: {sorted(ins_a ^ ins_b)}")
    outs_a, outs_b = [o.name for o in sa.get_outputs()], {o.name for o in sb.get_outputs()}
    if set(outs_a) != outs_b:
        raise UsageError(f"the models have different outputs: {sorted(set(outs_a) ^ outs_b)}")
    if feeds is None:
        feeds = random_inputs(sa, seed=seed, input_shapes=input_shapes)

    def judged(c: OutputComparison) -> OutputComparison:
        if min_cosine is not None and c.ok and c.cosine < min_cosine:
            c.ok = False
            c.note = (c.note + f"; cosine below {min_cosine}").strip("; ")
        return c

    report = VerifyReport(outputs=[], inputs={k: f"{v.dtype}{list(v.shape)}" for k, v in feeds.items()}, min_cosine=min_cosine)
    if not all_tensors:
        report.outputs = [judged(c) for c in compare(run(sa, feeds), run(sb, feeds), rtol, atol)]
        return report
    ea, order_a = _expose_all(a)
    eb, order_b = _expose_all(b)
    va, vb = run(session(ea), feeds), run(session(eb), feeds)
    report.outputs = [judged(c) for c in compare({k: va[k] for k in outs_a}, vb, rtol, atol)]
    to_a = _provenance_map(a, b)
    b_for_a = {name: name for name in order_b if name in va}
    b_for_a.update({av: bv for bv, av in to_a.items()})
    for name in order_a:
        bname = b_for_a.get(name)
        if bname is None or bname not in vb:
            continue
        c = judged(_compare_one(name if bname == name else f"{name} ~ {bname}", va[name], vb[bname], rtol, atol))
        report.tensors.append(c)
        if not c.ok and report.first_divergence is None:
            report.first_divergence = c.name

    def first_bad(values, order):
        for name in order:
            v = values.get(name)
            if v is not None and np.issubdtype(np.asarray(v).dtype, np.floating) and not np.all(np.isfinite(v)):
                return name
        return None

    report.first_nonfinite = {"a": first_bad(va, order_a), "b": first_bad(vb, order_b)}
    return report
