"""Numeric verification with onnxruntime (graph optimizations off, so ORT does not redo our work).

This module is the base that ``graphpass verify``/``bisect``/``optimize --verify``, the pass
manager's ``--verify-each``, ``graphpass.testing``, the conformance run and the fuzzer build on:
each runs a model and judges its outputs with :func:`check_outputs`, which compares each output
by :func:`compare_arrays`:

* integer, bool and string values compare exactly;
* floats element by element: ``|a - b| <= atol + rtol * |b|`` (``b`` the original's value);
  NaN positions exact (a NaN where the original has a number fails, and the reverse), infinities
  exact in position and sign; with ``rtol = atol = 0`` the sign of zero counts too (bitwise, except that
  any NaN equals any NaN: payload and sign bits of NaNs are not compared);
* a different dtype or shape fails.

Inputs are generated per input dtype and shape from a seed (:func:`make_inputs`); a symbolic dim
takes the value given by ``input_shapes`` or ``symbolic_dim`` (2 by default: 1 hides bugs along
a batch axis, e.g. a mean over it), and 1 when the original model cannot run with 2. Models
holding float16 tensors run with fp16 emulation (:mod:`graphpass.fp16`) unless switched off.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from graphpass.errors import BadModelError
from graphpass.check.promise import Promise
from graphpass.reporting import Report, markdown_table, rich_table, text_console

if TYPE_CHECKING:
    from graphpass.ir.model import ModelLike

__all__ = ["OutputComparison", "OutputCheck", "check_outputs", "VerifyReport", "FedInput", "Tolerance", "Runner", "session", "random_inputs",
           "make_inputs", "check_input_shapes", "check_deterministic", "random_nodes", "branch_notes",
           "reference", "run", "compare", "compare_arrays", "all_match",
           "tolerance_for", "describe", "load_inputs", "verify_models", "DEFAULT_RTOL", "DEFAULT_ATOL"]

log = logging.getLogger(__name__)

#: Default tolerance of ``verify``, and the floor of runs where a tolerance pass ran
#: (:func:`tolerance_for`). The atol absorbs float32 cancellation: a sum of large terms that
#: nearly cancel keeps the absolute error of its terms (a ShuffleNet x1.0 with folded
#: BatchNorms: logits up to 721, differences up to 7e-4 with 5.5e-5 beyond rtol 1e-4 on a logit
#: of -0.58; intermediates 3.3e-4 off on values of 0.44). A 0.03 change of a probability fails.
DEFAULT_RTOL, DEFAULT_ATOL = 1e-4, 1e-3
#: The same when a model holds float16 (one fp16 ulp at 1.0 is 9.8e-4; errors compound).
FP16_RTOL, FP16_ATOL = 1e-2, 1e-2
#: Symbolic dims are fed as this unless ``--input-shape`` says otherwise.
SYMBOLIC_DIM = 2


@dataclasses.dataclass
class OutputComparison:
    name: str
    max_abs: float
    max_rel: float
    cosine: float
    ok: bool
    note: str = ""
    mismatched: int = 0
    size: int = 0


def session(model: onnx.ModelProto | bytes | str):
    """An onnxruntime CPU session with every graph optimization disabled."""
    from graphpass.check import runtime

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


def run(sess, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in sess.get_outputs()]
    try:
        values = sess.run(names, dict(feeds))
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadModelError(f"onnxruntime failed to run the model: {first}") from e
    return dict(zip(names, values))


def _scalar(v) -> str:
    v = v.item() if hasattr(v, "item") else v
    return repr(v)


def compare_arrays(name: str, ref, got, rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL,
                   strict_dtype: bool = True) -> OutputComparison:
    """The one comparison rule of graphpass (module docstring); ``ref`` is the original's value.

    ``strict_dtype=False`` lets two float dtypes meet (intermediates of a mixed-precision model).
    Sequences (lists), maps (dicts) and empty optionals (``None``), as onnxruntime returns them,
    compare by kind, length or keys, then element by element: a sequence never equals a tensor.
    """
    if _kind(ref) != "tensor" or _kind(got) != "tensor":
        return _compare_structured(name, ref, got, rtol, atol, strict_dtype)
    ref = np.asarray(ref)
    got = np.asarray(got)
    if ref.shape != got.shape:
        return OutputComparison(name, float("inf"), float("inf"), 0.0, False, f"shape {list(got.shape)} != {list(ref.shape)}",
                                size=int(ref.size))
    if ref.dtype != got.dtype and (strict_dtype or ref.dtype.kind != "f" or got.dtype.kind != "f"):
        return OutputComparison(name, float("inf"), float("inf"), 0.0, False, f"dtype {got.dtype} != {ref.dtype}",
                                size=int(ref.size))
    size = int(ref.size)
    if size == 0:
        return OutputComparison(name, 0.0, 0.0, 1.0, True)
    exact = rtol == 0 and atol == 0
    why: list[str] = []
    max_abs = max_rel = 0.0
    cosine = 1.0
    if ref.dtype.kind == "f":
        r, g = ref.astype(np.float64), got.astype(np.float64)
        nan_r, nan_g = np.isnan(r), np.isnan(g)
        bad_nan = nan_r != nan_g
        bad_inf = (np.isinf(r) | np.isinf(g)) & ~nan_r & ~nan_g & (r != g)
        fin = np.isfinite(r) & np.isfinite(g)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(fin, np.abs(g - r), 0.0)
            bad_val = fin & (diff > atol + rtol * np.where(fin, np.abs(r), 0.0))
        if exact:
            bad_val |= fin & (r == 0) & (g == 0) & (np.signbit(r) != np.signbit(g))
        bad = bad_nan | bad_inf | bad_val
        if bad_nan.any():
            why.append("NaN positions differ")
        if bad_inf.any():
            why.append("inf positions or signs differ")
        if exact and (fin & (r == 0) & (g == 0) & (np.signbit(r) != np.signbit(g))).any():
            why.append("sign of zero differs")
        if fin.any():
            max_abs = float(diff.max())
            absr = np.abs(r)
            with np.errstate(divide="ignore", invalid="ignore"):
                rel = np.where(fin & (diff > 0), diff / np.where(absr > 0, absr, 0.0), 0.0)
            max_rel = float(np.nanmax(rel)) if rel.size else 0.0
            rf, gf = r[fin], g[fin]
            with np.errstate(over="ignore", invalid="ignore"):  # float64 values near their max
                nr, ng = np.linalg.norm(rf), np.linalg.norm(gf)
                cosine = float(np.dot(rf, gf) / (nr * ng)) if nr > 0 and ng > 0 else (1.0 if nr == ng else 0.0)
    elif ref.dtype.kind in "biu":
        bad = ref != got
        if bad.any():
            pairs = zip(ref[bad].tolist(), got[bad].tolist())
            max_abs = float(max(abs(int(x) - int(y)) for x, y in pairs))
            max_rel = max(abs(int(x) - int(y)) / abs(int(x)) if int(x) else float("inf")
                          for x, y in zip(ref[bad].tolist(), got[bad].tolist()))
            rf, gf = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
            nr, ng = np.linalg.norm(rf), np.linalg.norm(gf)
            cosine = float(np.dot(rf, gf) / (nr * ng)) if nr > 0 and ng > 0 else (1.0 if nr == ng else 0.0)
    else:  # strings, objects, complex: exact
        bad = np.asarray(ref != got, dtype=bool).reshape(ref.shape)
        if bad.any():
            max_abs = max_rel = float("inf")
            cosine = 0.0
    count = int(np.count_nonzero(bad))
    if count == 0:
        return OutputComparison(name, max_abs, max_rel, cosine, True, size=size)
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    rule = "exact" if exact or ref.dtype.kind not in "f" else f"|a-b| <= {atol:g} + {rtol:g}*|b|"
    note = (f"{count} of {size} values differ ({rule}); first at {list(idx)}: {_scalar(got[idx])} vs {_scalar(ref[idx])}"
            + (f"; {', '.join(why)}" if why else ""))
    return OutputComparison(name, max_abs, max_rel, cosine, False, note, mismatched=count, size=size)


def _kind(v) -> str:
    if v is None:
        return "empty optional"
    if isinstance(v, (list, tuple)):
        return "sequence"
    if isinstance(v, dict):
        return "map"
    return "tensor"


def _compare_structured(name: str, ref, got, rtol: float, atol: float, strict_dtype: bool) -> OutputComparison:
    """:func:`compare_arrays` for sequence, map and optional values (recursively)."""
    kr, kg = _kind(ref), _kind(got)

    def fail(note: str, size: int = 0) -> OutputComparison:
        return OutputComparison(name, float("inf"), float("inf"), 0.0, False, note, size=size)

    if kr != kg:
        return fail(f"a {kg} where the original has a {kr}")
    if kr == "empty optional":
        return OutputComparison(name, 0.0, 0.0, 1.0, True)
    if kr == "sequence":
        if len(ref) != len(got):
            return fail(f"sequence of {len(got)} != {len(ref)} elements", len(ref))
        pairs = [(f"{name}[{k}]", r, g) for k, (r, g) in enumerate(zip(ref, got))]
    else:
        if set(ref) != set(got):
            return fail(f"map keys differ: {sorted(map(repr, set(ref) ^ set(got)))[:5]}", len(ref))
        pairs = [(f"{name}[{k!r}]", ref[k], got[k]) for k in ref]
    parts = [compare_arrays(n, r, g, rtol, atol, strict_dtype) for n, r, g in pairs]
    size = sum(c.size for c in parts)
    bad = [c for c in parts if not c.ok]
    max_abs = max([c.max_abs for c in parts], default=0.0)
    max_rel = max([c.max_rel for c in parts], default=0.0)
    cosine = min([c.cosine for c in parts], default=1.0)
    if not bad:
        return OutputComparison(name, max_abs, max_rel, cosine, True, size=size)
    note = f"{len(bad)} of {len(parts)} elements differ; first {bad[0].name}: {bad[0].note}"
    return OutputComparison(name, max_abs, max_rel, cosine, False, note,
                            mismatched=sum(c.mismatched or 1 for c in bad), size=size)


def compare(
    ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL,
    *, strict_dtype: bool = True, ulp_floor: bool = False, magnitude_atol: bool = False,
) -> list[OutputComparison]:
    """Per output of ``ref``: :func:`compare_arrays` (a missing output fails).

    Args:
        ulp_floor: a tolerance (not an exact comparison) is at least 4 units in the last place
            (``rtol``) and one (``atol``) of each output's own float dtype: a promise's figures are
            float32 figures, and a float16 output is one rounding more or less within that.
        magnitude_atol: ``atol`` is in units of each output's largest finite magnitude (at least 1),
            as rounding grows with the values that made it.
    """
    out = []
    for name, r in ref.items():
        if name not in got:
            out.append(OutputComparison(name, float("inf"), float("inf"), 0.0, False, "missing output"))
            continue
        rt, at = rtol, atol
        if magnitude_atol:
            at = at * _magnitude(r)
        kind = np.asarray(r).dtype.kind if _kind(r) == "tensor" else ""
        if ulp_floor and kind == "f" and not (rtol == 0 and atol == 0):
            eps = float(np.finfo(np.asarray(r).dtype).eps)
            rt, at = max(rt, 4 * eps), max(at, eps)
        out.append(compare_arrays(name, r, got[name], rt, at, strict_dtype))
    return out


def all_match(comparisons: Sequence[OutputComparison]) -> bool:
    return all(c.ok for c in comparisons)


def describe(c: OutputComparison) -> str:
    """One line for a failed comparison: ``output 'y' differs (...)``."""
    return (f"output '{c.name}' differs (max abs {c.max_abs:.3g}, cosine {c.cosine:.6f}"
            + (f"; {c.note}" if c.note else "") + ")")


# ------------------------------------------------------------------------------------------
# tolerance from the passes that ran


@dataclasses.dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    why: str

    def __str__(self) -> str:
        if self.rtol == 0 and self.atol == 0:
            return f"exact ({self.why})"
        return f"rtol {self.rtol:g}, atol {self.atol:g} ({self.why})"


def check_tolerance(rtol: float | None, atol: float | None) -> None:
    """A given tolerance is a finite number >= 0: NaN or inf would pass every finite difference.

    Raises:
        UsageError: naming the bad value (exit 2).
    """
    import math

    from graphpass.errors import UsageError

    for flag, v in (("rtol", rtol), ("atol", atol)):
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise UsageError(f"{flag} {v}: a tolerance is a finite number >= 0")


def tolerance_for(promises: Iterable, rtol: float | None = None, atol: float | None = None,
                  fp16: bool = False) -> Tolerance:
    """The default tolerance after passes with these promises ran (``rtol``/``atol`` override).

    Only exact passes: exact comparison (bitwise, sign of zero included). Otherwise the
    loosest promise, floored at ``DEFAULT_RTOL``/``DEFAULT_ATOL`` (``FP16_RTOL``/``FP16_ATOL``
    when ``fp16``, i.e. a model compared holds float16): a promise bounds one application, and
    applications compound. An approximation's promise loosens nothing (it claims no bound): the
    outputs are held to the other passes' promises unless ``rtol``/``atol`` are given.
    """
    check_tolerance(rtol, atol)
    promises = list(promises)
    # an approximation (Promise.approximation) loosens nothing: its error is the user's to accept
    approx = sorted({p.name for p in promises if getattr(p, "approximate", False)})
    loose = [p for p in promises if not p.exact and not getattr(p, "approximate", False)]
    if not loose and not fp16:
        tol = Tolerance(0.0, 0.0, "only exact passes changed the graph" if not approx else
                        f"exact: the approximation {', '.join(approx)} loosens nothing")
    else:
        fr, fa = (FP16_RTOL, FP16_ATOL) if fp16 else (DEFAULT_RTOL, DEFAULT_ATOL)
        names = sorted({p.name for p in loose})
        why = ("loosest promise of the passes that ran: " + ", ".join(names)) if names else "default"
        tol = Tolerance(max([fr] + [p.rtol for p in loose]), max([fa] + [p.atol for p in loose]),
                        why + ("; float16 floor" if fp16 else "")
                        + (f"; the approximation {', '.join(approx)} loosens nothing" if approx else ""))
    if rtol is not None or atol is not None:
        tol = Tolerance(tol.rtol if rtol is None else rtol, tol.atol if atol is None else atol, "given")
    return tol


#: The promise a pass that declares none is held to.
UNDECLARED = Promise.tolerance("undeclared", rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL,
                               reason="a pass that declares no promise is held to the default tolerance")


def promises_of(pass_names: Iterable[str], known: Mapping[str, object]) -> list[Promise]:
    """The declared promises of these passes, looked up in ``known`` (name -> pass class, e.g.
    ``graphpass.all_passes()``: the caller holds the registry, this layer sits below it); a pass
    not in ``known`` or without a promise: :data:`UNDECLARED`."""
    return [getattr(known[n], "promise", UNDECLARED) if n in known else UNDECLARED for n in pass_names]


# ------------------------------------------------------------------------------------------
# inputs


@dataclasses.dataclass
class FedInput:
    """One input as fed: its shape, and which dims were symbolic (axis -> dim name, or ``input[axis]``)."""

    name: str
    dtype: str
    shape: list[int]
    symbolic: dict[int, str] = dataclasses.field(default_factory=dict)
    given: bool = False

    def __str__(self) -> str:
        dims = [f"{d}({self.symbolic[k]})" if k in self.symbolic else str(d) for k, d in enumerate(self.shape)]
        return f"{self.name} {self.dtype}[{', '.join(dims)}]" + (" (--input-shape)" if self.given else "")


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {i.name for i in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def check_input_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None) -> None:
    """The check every verb shares: each name is a graph input, ranks and fixed dims agree.

    Raises:
        UsageError: naming the unknown input and listing the known ones (exit 2).
    """
    if not input_shapes:
        return
    from graphpass.ir import model_io

    head = onnx.ModelProto()
    head.graph.input.extend(_graph_inputs(model))
    model_io._apply_input_shapes(head, input_shapes)  # the same check as load(input_shapes=...)


def make_inputs(model: onnx.ModelProto, seed: int = 0, input_shapes: Mapping[str, Sequence[int]] | None = None,
                symbolic_dim: int = SYMBOLIC_DIM) -> tuple[dict[str, np.ndarray], list[FedInput]]:
    """Seeded inputs for every graph input: normal floats, small non-negative ints (below the
    table size where an input indexes a constant table directly), bools.

    A dim without a value takes ``input_shapes``' value or ``symbolic_dim``.
    """
    check_input_shapes(model, input_shapes)
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    fed: list[FedInput] = []
    index_bounds = _index_bounds(model)
    # a named dim fixed through one input's --input-shape holds for every input that names it
    bound: dict[str, int] = {}
    for vi in _graph_inputs(model):
        given = (input_shapes or {}).get(vi.name)
        if given is None or not vi.type.HasField("tensor_type"):
            continue
        for d, v in zip(vi.type.tensor_type.shape.dim, given):
            if d.dim_param and not d.HasField("dim_value") and int(v) >= 0:  # -1: left dynamic
                bound.setdefault(d.dim_param, int(v))
    for vi in _graph_inputs(model):
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is None or not tt.elem_type:
            raise BadModelError(f"input '{vi.name}' is not a typed tensor, which graphpass cannot generate")
        try:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except Exception:
            dtype = None
        if dtype is None or dtype.kind not in "fbiu" or dtype.itemsize > 8 or str(dtype) not in {
                str(np.dtype(t)) for t in _ORT_TYPES.values()}:
            raise BadModelError(f"input '{vi.name}' has type {onnx.TensorProto.DataType.Name(tt.elem_type).lower()}, "
                                "which graphpass cannot generate")
        given = (input_shapes or {}).get(vi.name)
        symbolic: dict[int, str] = {}
        if given is not None and all(int(d) >= 0 for d in given):
            shape = [int(d) for d in given]
        else:
            shape = []
            for k, d in enumerate(tt.shape.dim if tt.HasField("shape") else []):
                if given is not None and int(given[k]) >= 0:  # -1 in input_shapes: the dim stays dynamic
                    shape.append(int(given[k]))
                elif d.HasField("dim_value") and d.dim_value >= 0:
                    shape.append(int(d.dim_value))
                else:
                    symbolic[k] = d.dim_param or f"{vi.name}[{k}]"
                    shape.append(bound.get(d.dim_param, symbolic_dim) if d.dim_param else symbolic_dim)
        if dtype.kind == "f":
            arr = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            arr = rng.integers(0, 2, size=shape).astype(np.bool_)
        else:
            arr = rng.integers(0, max(1, min(4, index_bounds.get(vi.name, 4))), size=shape).astype(dtype)
        feeds[vi.name] = arr
        fed.append(FedInput(vi.name, str(dtype), list(arr.shape), symbolic, given is not None))
    return feeds, fed


def _index_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Integer graph inputs that index a constant table directly (a Gather of an initializer:
    an embedding's ids, BERT's token_type_ids over a 2-row table): input -> the table's size along
    the gathered axis. Random ints are drawn below it, so the original model runs."""
    g = model.graph
    sizes = {t.name: list(t.dims) for t in g.initializer}
    inputs = {vi.name for vi in g.input}
    out: dict[str, int] = {}
    for n in g.node:
        if n.op_type != "Gather" or n.domain not in ("", "ai.onnx") or len(n.input) < 2:
            continue
        dims = sizes.get(n.input[0])
        if n.input[1] not in inputs or not dims:
            continue
        axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
        if -len(dims) <= axis < len(dims):
            out[n.input[1]] = min(out.get(n.input[1], dims[axis]), dims[axis])
    return out


class Runner:
    """A model ready to run: an onnxruntime session, with fp16 emulation when the model holds float16."""

    def __init__(self, model: onnx.ModelProto | str, fp16_emulate: bool = True):
        from graphpass.check import fp16

        if isinstance(model, str):  # a path: onnxruntime reads it (and its external data) itself
            try:
                head = onnx.load(model, load_external_data=False)
            except (DecodeError, OSError, ValueError) as e:
                raise BadModelError(f"{model}: cannot be read as an ONNX model ({e})") from None
            self.fp16 = fp16.has_fp16(head)
            if not (fp16_emulate and self.fp16):
                self._emu, self.sess, self.emulated, self.model = None, session(model), False, head
                return
            from graphpass.ir import model_io

            model = model_io.load_proto(model)
        #: the model holds float16 (emulated or not): comparisons take the fp16 floor
        self.fp16 = fp16.has_fp16(model)
        if fp16_emulate:
            self._emu = fp16.Emulated(model, session)
            self.sess = self._emu.session
            self.emulated = self._emu.active
            self.model = self._emu.model
        else:
            self._emu = None
            self.sess = session(model)
            self.emulated = False
            self.model = model

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._emu is None or not self.emulated:
            return run(self.sess, feeds)
        return self._emu.outputs(run(self.sess, self._emu.feeds(feeds)))


def reference(model: onnx.ModelProto, seed: int = 0, input_shapes: Mapping[str, Sequence[int]] | None = None,
              fp16_emulate: bool = True, symbolic_dim: int = SYMBOLIC_DIM, feeds: Mapping[str, np.ndarray] | None = None):
    """Inputs and the original's outputs: ``(feeds, outputs, fed inputs, runner, notes)``.

    When symbolic dims fed as ``symbolic_dim`` make the original fail in onnxruntime, they are
    fed as 1 instead, and a note says so.
    """
    runner = Runner(model, fp16_emulate)
    notes: list[str] = []
    if feeds is not None:
        fed = [FedInput(k, str(np.asarray(v).dtype), list(np.asarray(v).shape), {}, True) for k, v in feeds.items()]
        return dict(feeds), runner.run(feeds), fed, runner, notes
    feeds, fed = make_inputs(model, seed, input_shapes, symbolic_dim)

    def fed_text(fed) -> str:
        return (f" (inputs fed: {'; '.join(str(f) for f in fed)}; random floats are standard normal, random ints "
                "0..3: other values can be given as feeds)")

    try:
        outputs = runner.run(feeds)
    except BadModelError as e:
        if symbolic_dim == 1 or not any(f.symbolic for f in fed):
            raise BadModelError(f"{e}{fed_text(fed)}", option="feeds") from e
        feeds, fed = make_inputs(model, seed, input_shapes, 1)
        try:
            outputs = runner.run(feeds)
        except BadModelError as e2:
            raise BadModelError(f"{e2}{fed_text(fed)}", option="feeds") from e2
        notes.append(f"symbolic dims fed as 1: the original model fails with {symbolic_dim} ({e})")
    return feeds, outputs, fed, runner, notes


def random_inputs(
    sess, seed: int = 0, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> dict[str, np.ndarray]:
    """Seeded inputs for every input of ``sess`` (dynamic dims 1); prefer :func:`make_inputs`."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for inp in sess.get_inputs():
        given = (input_shapes or {}).get(inp.name)
        shape = [g if g is not None and int(g) >= 0 else (d if isinstance(d, int) and d >= 0 else 1)
                 for g, d in zip(list(given) if given is not None else [None] * len(inp.shape), inp.shape)]
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


# ------------------------------------------------------------------------------------------
# the one output check


@dataclasses.dataclass
class OutputCheck:
    """The verdict of :func:`check_outputs`: one comparison per reference output, at ``tolerance``."""

    comparisons: list[OutputComparison]
    tolerance: Tolerance
    #: the candidate ran under fp16 emulation
    emulated: bool = False
    #: a model compared holds float16 (the tolerance took the fp16 floor unless given)
    fp16: bool = False
    #: the candidate's outputs, as run
    outputs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.comparisons)

    @property
    def failures(self) -> list[OutputComparison]:
        return [c for c in self.comparisons if not c.ok]

    def describe(self) -> str:
        """'' when every output matches, else the first failure and the tolerance it was judged at."""
        bad = self.failures
        return "" if not bad else f"{describe(bad[0])} at {self.tolerance}"


def _outputs_of(model, feeds: Mapping[str, np.ndarray], fp16_emulate: bool) -> tuple[dict, bool, bool]:
    """(outputs, emulated, holds fp16) of a model (ModelProto, path, bytes, Runner, anything with
    ``to_proto()``) or of outputs given as a mapping."""
    if isinstance(model, Mapping):
        return dict(model), False, False
    if not isinstance(model, Runner):
        if isinstance(model, (bytes, bytearray)):
            try:
                model = onnx.load_model_from_string(bytes(model))
            except (DecodeError, ValueError) as e:
                raise BadModelError(f"cannot be read as an ONNX model ({e})") from None
        elif hasattr(model, "to_proto"):
            model = model.to_proto()
        model = Runner(model if isinstance(model, onnx.ModelProto) else str(model), fp16_emulate)
    return model.run(feeds), model.emulated, model.fp16


def check_outputs(
    reference, candidate, feeds: Mapping[str, np.ndarray], tolerance: Tolerance | None = None, *,
    promises: Iterable[Promise] | None = None, rtol: float | None = None, atol: float | None = None,
    fp16_emulate: bool = True, fp16: bool = False, strict_dtype: bool = True, ulp_floor: bool = False,
    magnitude_atol: bool = False,
) -> OutputCheck:
    """Run ``candidate`` (and ``reference``) on ``feeds`` in onnxruntime and judge the outputs.

    The one output check of graphpass: ``graphpass verify``, ``optimize --verify``, the pass
    manager's verify-each, ``bisect``, :func:`graphpass.testing.assert_equivalent`, the
    conformance run and the fuzzer all judge a model's outputs here, by :func:`compare_arrays`.

    Args:
        reference: the original: a model (ModelProto, path or :class:`Runner`, run with
            ORT_DISABLE_ALL and fp16 emulation as ``fp16_emulate`` says), or its outputs already
            computed (a mapping name -> value), to run it once and check many candidates.
        candidate: the model judged, in the same forms.
        tolerance: the bound; by default :func:`tolerance_for` (``promises``, ``rtol``, ``atol``)
            when ``promises`` is given, else ``DEFAULT_RTOL``/``DEFAULT_ATOL`` (the float16 floor
            when a model holds float16) with ``rtol``/``atol`` overriding.
        fp16: the reference holds float16 (say so when it is given as outputs).
        strict_dtype, ulp_floor, magnitude_atol: as for :func:`compare_arrays` and :func:`compare`.

    Raises:
        BadModelError: onnxruntime cannot load or run a model (its reason, one line).
    """
    ref, _, ref_fp16 = _outputs_of(reference, feeds, fp16_emulate)
    got, emulated, got_fp16 = _outputs_of(candidate, feeds, fp16_emulate)
    any_fp16 = fp16 or ref_fp16 or got_fp16
    if tolerance is None:
        if promises is not None:
            tolerance = tolerance_for(promises, rtol, atol, fp16=any_fp16)
        else:
            check_tolerance(rtol, atol)
            base = (Tolerance(FP16_RTOL, FP16_ATOL, "default when a model holds float16") if any_fp16
                    else Tolerance(DEFAULT_RTOL, DEFAULT_ATOL, "default"))
            tolerance = base if rtol is None and atol is None else Tolerance(
                base.rtol if rtol is None else rtol, base.atol if atol is None else atol, "given")
    comps = compare(ref, got, tolerance.rtol, tolerance.atol, strict_dtype=strict_dtype, ulp_floor=ulp_floor,
                    magnitude_atol=magnitude_atol)
    return OutputCheck(comps, tolerance, emulated, any_fp16, got)


# ------------------------------------------------------------------------------------------
# whole-model verification (graphpass verify)


@dataclasses.dataclass
class VerifyReport(Report):
    """Outputs (and optionally every shared intermediate) of two models on the same inputs."""

    SCHEMA = "graphpass.verify_report/2"

    outputs: list[OutputComparison]
    tensors: list[OutputComparison] = dataclasses.field(default_factory=list)
    first_divergence: str | None = None
    first_nonfinite: dict[str, str | None] = dataclasses.field(default_factory=dict)
    inputs: dict[str, str] = dataclasses.field(default_factory=dict)
    min_cosine: float | None = None
    fed: list[FedInput] = dataclasses.field(default_factory=list)
    seed: int | None = None
    tolerance: Tolerance | None = None
    fp16_emulated: dict[str, bool] = dataclasses.field(default_factory=dict)
    notes: list[str] = dataclasses.field(default_factory=list)
    #: every shared intermediate was compared (``all_tensors``)
    all_tensors: bool = False
    #: where the inputs came from (a file name) when not generated from the seed
    inputs_from: str | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.outputs)

    def _head_lines(self) -> list[str]:
        src = f"from {self.inputs_from}" if self.inputs_from else f"seeded random, seed {self.seed}"
        lines = [f"inputs ({src}): " + "; ".join(str(f) for f in self.fed)]
        by_value: dict[int, set[str]] = {}
        for f in self.fed:
            for k, v in f.symbolic.items():
                by_value.setdefault(f.shape[k], set()).add(v)
        if by_value:  # the values really fed (a dim bound by input_shapes, or 1 after a retry)
            fed_as = "; ".join(f"({', '.join(sorted(names))}) fed as {val}" for val, names in sorted(by_value.items()))
            lines.append(f"symbolic dims {fed_as}: change with --symbolic-dim N or --input-shape NAME:D1,D2,...")
        lines += [f"note: {note}" for note in self.notes]
        emulated = [k.upper() for k, v in self.fp16_emulated.items() if v]
        lines.append(f"comparison: {self.tolerance}; ints, bools, strings exact; NaN/inf positions and signs exact"
                     + (f"; fp16 emulated in model {' and '.join(emulated)}" if emulated else ""))
        return lines

    def _tail_lines(self) -> list[str]:
        if not self.all_tensors:
            return []
        bad = sum(not c.ok for c in self.tensors)
        return [f"{len(self.tensors)} shared tensors compared in topological order, {bad} differ",
                f"first divergent tensor: {self.first_divergence or 'none'}",
                f"first NaN/Inf: A {self.first_nonfinite.get('a') or 'none'}, B {self.first_nonfinite.get('b') or 'none'}"]

    def _rows(self) -> list[tuple[str, ...]]:
        return [(c.name, f"{c.max_abs:.3g}", f"{c.max_rel:.3g}", f"{c.cosine:.6f}",
                 ("ok" if c.ok else "FAIL") + (f" ({c.note})" if c.note else "")) for c in self.outputs]

    def to_table(self, width: int = 120) -> str:
        console, buf = text_console(width)
        for line in self._head_lines():
            console.print(line)
        console.print(rich_table(("output", "max abs", "max rel", "cosine", "result"), self._rows(), title="outputs"))
        for line in self._tail_lines():
            console.print(line)
        return buf.getvalue()

    def to_markdown(self) -> str:
        verdict = "all outputs match" if self.ok else f"{sum(not c.ok for c in self.outputs)} of {len(self.outputs)} outputs differ"
        lines = [f"### graphpass verify: {verdict}", ""] + [f"- {x}" for x in self._head_lines() + self._tail_lines()]
        lines += [""] + markdown_table(["output", ("max abs", "right"), ("max rel", "right"), ("cosine", "right"), "result"],
                                       self._rows())
        lines.append("")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "schema": self.SCHEMA,
            "ok": self.ok,
            "inputs": self.inputs,
            "fed": [dataclasses.asdict(f) for f in self.fed],
            "seed": self.seed,
            "rtol": self.tolerance.rtol if self.tolerance else None,
            "atol": self.tolerance.atol if self.tolerance else None,
            "tolerance": str(self.tolerance) if self.tolerance else None,
            "fp16_emulated": self.fp16_emulated,
            "notes": self.notes,
            "outputs": [dataclasses.asdict(c) for c in self.outputs],
            "tensors_compared": len(self.tensors),
            "first_divergence": self.first_divergence,
            "first_nonfinite": self.first_nonfinite,
            "tensors": [dataclasses.asdict(c) for c in self.tensors if not c.ok],
        }


def load_inputs(path: str, sess, input_shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, np.ndarray]:
    """Inputs from an .npz: every model input present, with the model's dtype and a fitting shape
    (and the ``input_shapes`` given, if any: a shape the file contradicts is refused)."""
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
        given = (input_shapes or {}).get(inp.name)
        if given is not None and (len(given) != arr.ndim or any(0 <= int(d) != s for d, s in zip(given, arr.shape))):
            raise UsageError(f"{path}: input '{inp.name}' has shape {list(arr.shape)}, input_shapes says "
                             f"{[int(d) for d in given]}", option="input_shapes")
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


#: Ops whose outputs may change from run to run (Dropout only with a training_mode input).
RANDOM_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                        "Bernoulli", "Dropout"})


def random_nodes(model: onnx.ModelProto) -> list[str]:
    """``Op 'name'`` for every node that may draw random numbers (subgraphs and functions included)."""
    from graphpass.ir.graph import graph_protos

    found = []
    nodes = [n for g in graph_protos(model.graph) for n in g.node] + [n for f in model.functions for n in f.node]
    for n in nodes:
        if n.op_type in RANDOM_OPS and n.domain in ("", "ai.onnx") and (n.op_type != "Dropout" or
                                                                          (len(n.input) > 2 and n.input[2])):
            found.append(f"{n.op_type} '{n.name or n.output[0]}'")
    return found


def check_deterministic(label: str, model: onnx.ModelProto, runner: "Runner", feeds: Mapping[str, np.ndarray],
                        outputs: Mapping[str, np.ndarray]) -> None:
    """Refuse a model whose outputs change from run to run: no comparison can judge it.

    Only models holding random ops (:func:`random_nodes`) are run a second time.

    Raises:
        UsageError: naming the outputs that changed and the random ops (exit 2).
    """
    from graphpass.errors import UsageError

    nodes = random_nodes(model)
    if not nodes:
        return
    again = runner.run(feeds)
    moved = [c.name for c in compare(outputs, again, 0.0, 0.0) if not c.ok]
    if moved:
        raise UsageError(f"{label} gives other outputs on every run ({', '.join(moved)} changed between two runs on the "
                         f"same inputs; random ops: {', '.join(nodes[:5])}): a comparison cannot tell a changed model "
                         "from a new draw; give the random ops fixed inputs or Dropout training_mode false")


def branch_notes(label: str, model: onnx.ModelProto, runner: "Runner", feeds: Mapping[str, np.ndarray]) -> list[str]:
    """Notes on what these inputs leave unrun in the main graph: the untaken branch of each If
    whose condition comes from the inputs, and each Loop whose trip count or first condition
    (from the inputs) lets it run zero times.

    A comparison judges only what ran; the note names what stayed untried (``--inputs`` or
    another ``--seed`` reaches it). Ifs and Loops inside subgraphs are not observed.
    """
    consts = {t.name for t in model.graph.initializer}
    consts |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    ifs = [n for n in model.graph.node if n.op_type == "If" and n.input and n.input[0] not in consts]
    loops = [n for n in model.graph.node if n.op_type == "Loop"
             and any(k < len(n.input) and n.input[k] and n.input[k] not in consts for k in (0, 1))]
    if not ifs and not loops:
        return []
    wanted = {n.input[0]: onnx.TensorProto.BOOL for n in ifs}
    for n in loops:
        for k, t in ((0, onnx.TensorProto.INT64), (1, onnx.TensorProto.BOOL)):
            if k < len(n.input) and n.input[k]:
                wanted[n.input[k]] = t
    values = {k: v for k, v in feeds.items()}
    probed = sorted(set(wanted) - set(feeds))
    if probed:
        probe = onnx.ModelProto()
        probe.CopyFrom(runner.model)
        have = {o.name for o in probe.graph.output}
        probe.graph.output.extend(onnx.helper.make_tensor_value_info(c, wanted[c], None) for c in probed if c not in have)
        try:
            emu = runner._emu.feeds(feeds) if runner.emulated else feeds
            values.update(run(session(probe), emu))
        except BadModelError:
            return [f"{label}: {len(ifs)} If and {len(loops)} Loop node(s) depend on the inputs: only what these inputs "
                    "run is verified"]

    def scalar(name):
        v = values.get(name)
        return None if v is None or np.asarray(v).size != 1 else np.asarray(v).reshape(-1)[0]

    notes = []
    for n in ifs:
        v = scalar(n.input[0])
        label_n = n.name or n.output[0]
        if v is None:
            notes.append(f"{label}: If '{label_n}': the branch taken is not known; only it is verified")
            continue
        took = "then" if bool(v) else "else"
        other = "else" if took == "then" else "then"
        notes.append(f"{label}: If '{label_n}' ran only its {took} branch on these inputs; its {other} branch is "
                     "not verified (--inputs or --seed reach it)")
    for n in loops:
        trips = scalar(n.input[0]) if n.input[0] else None
        first = scalar(n.input[1]) if len(n.input) > 1 and n.input[1] else None
        if (trips is not None and int(trips) <= 0) or (first is not None and not bool(first)):
            notes.append(f"{label}: Loop '{n.name or n.output[0]}' ran zero times on these inputs; its body is not "
                         "verified (--inputs or --seed reach it)")
    return notes


def _provenance_map(a: onnx.ModelProto, b: onnx.ModelProto) -> dict[str, str]:
    """B tensor -> A tensor for tensors a rewrite created (``graphpass.fused_from``).

    The nodes that one rewrite made from the same original nodes (an inlined device op is
    several nodes carrying the same provenance) form a group; only the tensor that leaves the
    group (read outside it, or a graph output) stands for the last fused node's output. Its
    inner tensors (the Conv inside an inlined Conv+Relu) correspond to no tensor of A.
    """
    import json

    a_out = {n.name: list(n.output) for n in a.graph.node if n.name}
    b_names = {o for n in b.graph.node for o in n.output} | {i.name for i in b.graph.input}
    groups: dict[str, list[onnx.NodeProto]] = {}
    for n in b.graph.node:
        fused = next((p.value for p in n.metadata_props if p.key == "graphpass.fused_from"), None)
        if fused:
            groups.setdefault(fused, []).append(n)
    readers: dict[str, list[int]] = {}
    for k, n in enumerate(b.graph.node):
        for i in n.input:
            readers.setdefault(i, []).append(id(n))
    graph_outs = {o.name for o in b.graph.output}
    mapping: dict[str, str] = {}
    for fused, members in groups.items():
        try:
            origin = json.loads(fused)
        except ValueError:
            continue
        if not origin or origin[-1] not in a_out or not a_out[origin[-1]]:
            continue
        target = a_out[origin[-1]][0]
        if target in b_names:  # the name survives in B: matched by name
            continue
        ids = {id(n) for n in members}
        leaving = [o for n in members for o in n.output
                   if o and (o in graph_outs or any(r not in ids for r in readers.get(o, [])))]
        if len(leaving) == 1:
            mapping[leaving[0]] = target
    return mapping


def verify_models(
    a: "ModelLike",
    b: "ModelLike",
    feeds: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    min_cosine: float | None = None,
    all_tensors: bool = False,
    fp16_emulate: bool = True,
    symbolic_dim: int = SYMBOLIC_DIM,
) -> VerifyReport:
    """Run ``a`` (the original) and ``b`` on the same inputs in onnxruntime and compare.

    ``a`` and ``b`` are each a path, bytes, an ``onnx.ModelProto`` or a :class:`graphpass.Model`
    (coerced by :func:`graphpass.ir.model.as_proto`: validated as ``load`` validates; a Model
    is run in the form ``save`` writes, portable). Neither is changed.

    ``rtol``/``atol`` default to ``DEFAULT_RTOL``/``DEFAULT_ATOL``, or to the fp16 promise
    when either model holds float16 tensors; give 0 and 0 for bitwise comparison.

    Raises:
        UsageError: the models have different inputs or outputs, or ``input_shapes`` names no input.
        BadModelError: onnxruntime cannot run one of them (its reason, one line).
    """
    from graphpass.errors import UsageError
    from graphpass.ir.model import as_proto

    try:
        a = as_proto(a)
    except BadModelError as e:
        raise BadModelError(f"model A: {e}") from e
    try:
        b = as_proto(b)
    except BadModelError as e:
        raise BadModelError(f"model B: {e}") from e
    ins_a, ins_b = {i.name for i in _graph_inputs(a)}, {i.name for i in _graph_inputs(b)}
    if ins_a != ins_b:
        raise UsageError(f"the models have different inputs: {sorted(ins_a ^ ins_b)}")
    types_b = {i.name: i.type.tensor_type.elem_type for i in _graph_inputs(b) if i.type.HasField("tensor_type")}
    for i in _graph_inputs(a):
        ta, tb = (i.type.tensor_type.elem_type if i.type.HasField("tensor_type") else 0), types_b.get(i.name, 0)
        if ta and tb and ta != tb:
            name = onnx.TensorProto.DataType.Name
            raise UsageError(f"input '{i.name}' is {name(ta).lower()} in model A and {name(tb).lower()} in model B: "
                             "the same values cannot feed both")
    outs_a, outs_b = [o.name for o in a.graph.output], {o.name for o in b.graph.output}
    if set(outs_a) != outs_b:
        raise UsageError(f"the models have different outputs: {sorted(set(outs_a) ^ outs_b)}")
    check_input_shapes(a, input_shapes)
    check_input_shapes(b, input_shapes)
    check_tolerance(rtol, atol)
    if seed < 0:
        raise UsageError(f"seed {seed}: a seed is an integer >= 0")
    try:
        feeds, ref, fed, ra, notes = reference(a, seed, input_shapes, fp16_emulate, symbolic_dim, feeds)
    except BadModelError as e:
        raise BadModelError(f"model A: {e}") from e
    check_deterministic("model A", a, ra, feeds, ref)
    try:
        rb = Runner(b, fp16_emulate)
        got = rb.run(feeds)
    except BadModelError as e:
        raise BadModelError(f"model B: {e} (inputs fed: {'; '.join(str(f) for f in fed)})") from e
    try:
        check_deterministic("model B", b, rb, feeds, got)
    except UsageError as e:  # the original is deterministic: randomness in B is a difference (exit 1)
        from graphpass.errors import VerificationError

        raise VerificationError(f"{e}, where model A gives the same outputs on every run") from e
    notes = notes + branch_notes("model A", a, ra, feeds)
    checked = check_outputs(ref, got, feeds, rtol=rtol, atol=atol, fp16=ra.fp16 or rb.fp16)
    tol = checked.tolerance
    rtol, atol = tol.rtol, tol.atol

    def judged(c: OutputComparison) -> OutputComparison:
        if min_cosine is not None and c.ok and c.cosine < min_cosine:
            c.ok = False
            c.note = (c.note + f"; cosine below {min_cosine}").strip("; ")
        return c

    report = VerifyReport(outputs=[], inputs={k: f"{v.dtype}{list(v.shape)}" for k, v in feeds.items()},
                          min_cosine=min_cosine, fed=fed, seed=seed, tolerance=tol,
                          fp16_emulated={"a": ra.emulated, "b": rb.emulated}, notes=notes, all_tensors=all_tensors)
    if not all_tensors:
        report.outputs = [judged(c) for c in checked.comparisons]
        return report
    ea, order_a = _expose_all(ra.model)
    eb, order_b = _expose_all(rb.model)
    made = _emulation_names(ra.model, a) | _emulation_names(rb.model, b)
    order_a = [n for n in order_a if n not in made]
    order_b = [n for n in order_b if n not in made]
    va = Runner(ea, fp16_emulate=False).run(ra._emu.feeds(feeds) if ra.emulated else feeds)
    vb = Runner(eb, fp16_emulate=False).run(rb._emu.feeds(feeds) if rb.emulated else feeds)
    got_outs = rb._emu.outputs(vb) if rb.emulated else vb
    report.outputs = [judged(c) for c in check_outputs(ref, {k: got_outs[k] for k in outs_a}, feeds, tol).comparisons]
    to_a = _provenance_map(a, b)
    b_for_a = {name: name for name in order_b if name in va}
    for bv, av in to_a.items():
        b_for_a.setdefault(av, bv)
    skipped = 0
    for name in order_a:
        bname = b_for_a.get(name)
        if bname is None or bname not in vb:
            continue
        if bname != name and np.shape(va[name]) != np.shape(vb[bname]):
            skipped += 1  # provenance is a hint, not a proof: a shape change means no counterpart
            continue
        # intermediates: atol in units of the tensor's own largest magnitude (at least 1), since
        # their rounding grows with the values that made them; the verdict stays on the outputs
        scale = _magnitude(va[name])
        c = judged(compare_arrays(name if bname == name else f"{name} ~ {bname}", va[name], vb[bname], rtol,
                                  atol * scale, strict_dtype=False))
        report.tensors.append(c)
        if not c.ok and report.first_divergence is None:
            report.first_divergence = c.name
    if skipped:
        report.notes.append(f"{skipped} tensor(s) matched by provenance had another shape and were not compared")

    def first_bad(values, order):
        for name in order:
            v = values.get(name)
            if v is not None and np.issubdtype(np.asarray(v).dtype, np.floating) and not np.all(np.isfinite(v)):
                return name
        return None

    report.first_nonfinite = {"a": first_bad(va, order_a), "b": first_bad(vb, order_b)}
    return report


def _magnitude(v) -> float:
    v = np.asarray(v)
    if v.dtype.kind != "f" or v.size == 0:
        return 1.0
    fin = np.abs(v[np.isfinite(v)].astype(np.float64))
    return max(1.0, float(fin.max())) if fin.size else 1.0


def _emulation_names(emulated: onnx.ModelProto, original: onnx.ModelProto) -> set[str]:
    """Tensors the fp16 emulation added (raw and half values), to leave out of per-tensor views."""
    if emulated is original:
        return set()
    before = {o for n in original.graph.node for o in n.output}
    return {o for n in emulated.graph.node for o in n.output if o not in before}
