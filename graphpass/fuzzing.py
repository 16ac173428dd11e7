"""Random models for property-based testing (hypothesis), and the property they must keep.

:func:`models` is a hypothesis strategy for random DAGs of Conv, BatchNormalization,
activations, elementwise ops with broadcasting (per-channel and scalar constants, tensor +
tensor), Reshape, Transpose, C-axis Concat and Split, Gather, MatMul(+Add), TopK, pooling,
reductions and Loop (with a loop-invariant subexpression in its body), over random shapes and
channel counts aligned and unaligned to 16. :func:`check` is the property: the default pipeline
(every default pass, layout included, on the default target) leaves a model that passes the full
ONNX checker and computes the same outputs in onnxruntime, in the device and the portable form.

The differential tester (:func:`cases`, :func:`differential`) holds each pass to its declared
promise (``Pass.promise``): small models per dtype family (float32, float16, bfloat16, float64,
int8, int32, int64, bool; see graphpass/_fuzz_cases.py for the templates, special values,
control flow and storage forms drawn) run through the default pipeline or one pass; outputs are
compared bitwise where every pass that changed the graph is exact (NaN positions and the sign
of zero included), else with the loosest tolerance among them (NaN/inf positions and signs
still exact). A model onnxruntime's CPU provider cannot run is skipped with the reason.

Used by ``tests/graphpass/test_fuzz.py`` (CI: a few hundred examples) and ``benchmarks/fuzz.py``
(2,000+ per family, minimized reproducers saved to disk). Needs hypothesis (a test extra).
"""

from __future__ import annotations

import dataclasses
import math
import re
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphpass._fuzz_cases import FAMILIES, Case

__all__ = ["models", "check", "OPS", "FAMILIES", "Case", "Outcome", "cases", "differential", "write_reproducer", "mutate_bytes"]

OPS = ("conv", "bn", "act", "bias", "scalar", "binary", "reshape", "transpose", "concat", "split", "gather",
       "matmul", "topk", "pool", "reduce", "loop")
_CHANNELS = (3, 8, 16, 24, 32, 58)


def _f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def models():
    """The hypothesis strategy (imported lazily so graphpass itself does not need hypothesis)."""
    from hypothesis import strategies as st

    @st.composite
    def build(draw) -> onnx.ModelProto:
        rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
        n = draw(st.sampled_from([1, 2]))
        c = draw(st.sampled_from(_CHANNELS))
        hw = draw(st.sampled_from([4, 6, 8]))
        nodes, inits = [], []
        pool: list[tuple[str, tuple[int, ...]]] = [("x", (n, c, hw, hw))]
        counter = [0]

        def name(p: str) -> str:
            counter[0] += 1
            return f"{p}{counter[0]}"

        def const(arr) -> str:
            k = name("w")
            inits.append(numpy_helper.from_array(np.asarray(arr), k))
            return k

        def pick4() -> tuple[str, tuple[int, ...]]:
            four = [p for p in pool if len(p[1]) == 4]
            return four[draw(st.integers(0, len(four) - 1))] if len(four) < 3 else \
                four[len(four) - 1 - draw(st.integers(0, 2))]

        steps = draw(st.integers(1, 14))
        for _ in range(steps):
            op = draw(st.sampled_from(OPS))
            t, s = pick4()
            y = name("t")
            if op == "conv":
                k = draw(st.sampled_from([1, 3]))
                depthwise = draw(st.booleans()) and k == 3
                cout = s[1] if depthwise else draw(st.sampled_from(_CHANNELS))
                group = s[1] if depthwise else 1
                w = const(_f32(rng.standard_normal((cout, s[1] // group, k, k)) * 0.3))
                ins = [t, w] + ([const(_f32(rng.standard_normal(cout) * 0.1))] if draw(st.booleans()) else [])
                nodes.append(helper.make_node("Conv", ins, [y], kernel_shape=[k, k], pads=[k // 2] * 4, group=group))
                pool.append((y, (s[0], cout, s[2], s[3])))
            elif op == "bn":
                ch = s[1]
                ps = [const(_f32(rng.uniform(0.5, 1.5, ch))), const(_f32(rng.standard_normal(ch) * 0.1)),
                      const(_f32(rng.standard_normal(ch) * 0.1)), const(_f32(rng.uniform(0.5, 1.5, ch)))]
                nodes.append(helper.make_node("BatchNormalization", [t] + ps, [y], epsilon=1e-5))
                pool.append((y, s))
            elif op == "act":
                kind = draw(st.sampled_from(["Relu", "Sigmoid", "LeakyRelu", "Clip", "HardSwish", "Tanh"]))
                if kind == "Clip":
                    nodes.append(helper.make_node("Clip", [t, const(_f32(0.0)), const(_f32(6.0))], [y]))
                elif kind == "LeakyRelu":
                    nodes.append(helper.make_node("LeakyRelu", [t], [y], alpha=0.1))
                else:
                    nodes.append(helper.make_node(kind, [t], [y]))
                pool.append((y, s))
            elif op in ("bias", "scalar"):
                shape = (s[1], 1, 1) if op == "bias" else ()
                kind = draw(st.sampled_from(["Add", "Mul", "Sub"]))
                c_ = const(_f32(rng.uniform(0.5, 1.5, shape)))
                ins = [t, c_] if draw(st.booleans()) else [c_, t]
                nodes.append(helper.make_node(kind, ins, [y]))
                pool.append((y, s))
            elif op == "binary":
                same = [p for p in pool if p[1] == s]
                u = same[draw(st.integers(0, len(same) - 1))][0]
                nodes.append(helper.make_node(draw(st.sampled_from(["Add", "Mul", "Max"])), [t, u], [y]))
                pool.append((y, s))
            elif op == "reshape":
                mid = name("r")
                nodes += [helper.make_node("Reshape", [t, const(np.array([s[0], s[1], -1], np.int64))], [mid]),
                          helper.make_node("Reshape", [mid, const(np.array(s, np.int64))], [y])]
                pool.append((y, s))
            elif op == "transpose":
                perm = list(draw(st.permutations([0, 1, 2, 3])))
                mid = name("p")
                nodes.append(helper.make_node("Transpose", [t], [mid], perm=perm))
                inverse = list(np.argsort(perm))
                nodes.append(helper.make_node("Transpose", [mid], [y], perm=inverse))
                pool.append((y, s))
            elif op == "concat":
                same = [p for p in pool if len(p[1]) == 4 and p[1][0] == s[0] and p[1][2:] == s[2:]]
                u, su = same[draw(st.integers(0, len(same) - 1))]
                nodes.append(helper.make_node("Concat", [t, u], [y], axis=1))
                pool.append((y, (s[0], s[1] + su[1], s[2], s[3])))
            elif op == "split":
                if s[1] < 2:
                    continue
                a = draw(st.integers(1, s[1] - 1))
                y2 = name("t")
                nodes.append(helper.make_node("Split", [t, const(np.array([a, s[1] - a], np.int64))], [y, y2], axis=1))
                pool += [(y, (s[0], a, s[2], s[3])), (y2, (s[0], s[1] - a, s[2], s[3]))]
            elif op == "gather":
                idx = rng.permutation(s[1]).astype(np.int64)
                nodes.append(helper.make_node("Gather", [t, const(idx)], [y], axis=1))
                pool.append((y, s))
            elif op == "matmul":
                flat = name("f")
                k = s[1] * s[2] * s[3]
                m_ = draw(st.sampled_from([4, 10, 16]))
                nodes += [helper.make_node("Flatten", [t], [flat], axis=1),
                          helper.make_node("MatMul", [flat, const(_f32(rng.standard_normal((k, m_)) * 0.1))], [name("m")])]
                mm = nodes[-1].output[0]
                nodes.append(helper.make_node("Add", [mm, const(_f32(rng.standard_normal(m_) * 0.1))], [y]))
                pool.append((y, (s[0], m_)))
            elif op == "topk":
                k = draw(st.integers(1, s[3]))
                nodes.append(helper.make_node("TopK", [t, const(np.array([k], np.int64))], [y, name("i")], axis=-1))
                pool.append((y, (s[0], s[1], s[2], k)))
            elif op == "pool":
                kind = draw(st.sampled_from(["MaxPool", "AveragePool", "GlobalAveragePool"]))
                if kind != "GlobalAveragePool" and min(s[2], s[3]) < 2:
                    kind = "GlobalAveragePool"
                if kind == "GlobalAveragePool":
                    nodes.append(helper.make_node(kind, [t], [y]))
                    pool.append((y, (s[0], s[1], 1, 1)))
                else:
                    nodes.append(helper.make_node(kind, [t], [y], kernel_shape=[2, 2], strides=[2, 2]))
                    pool.append((y, (s[0], s[1], s[2] // 2, s[3] // 2)))
            elif op == "reduce":
                axis = draw(st.sampled_from([1, 2, 3]))
                nodes.append(helper.make_node("ReduceMean", [t], [y], axes=[axis], keepdims=1))
                shape = list(s)
                shape[axis] = 1
                pool.append((y, tuple(shape)))
            elif op == "loop":
                trips = draw(st.integers(1, 3))
                scale = const(_f32(rng.uniform(0.5, 1.0, (1,))))
                body = helper.make_graph(
                    [helper.make_node("Mul", [scale, scale], ["inv"]),  # loop-invariant
                     helper.make_node("Mul", ["v_in", "inv"], ["m"]),
                     helper.make_node("Add", ["m", t], ["v_out"]),
                     helper.make_node("Identity", ["cond_in"], ["cond_out"])],
                    name("body"),
                    [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                     helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                     helper.make_tensor_value_info("v_in", TensorProto.FLOAT, list(s))],
                    [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                     helper.make_tensor_value_info("v_out", TensorProto.FLOAT, list(s))])
                nodes.append(helper.make_node("Loop", [const(np.array(trips, np.int64)), "", t], [y], body=body))
                pool.append((y, s))
        outs = [pool[-1]]
        if len(pool) > 2 and draw(st.booleans()):
            extra = pool[draw(st.integers(1, len(pool) - 2))]
            if extra[0] != outs[0][0]:
                outs.append(extra)
        graph = helper.make_graph(nodes, "fuzz", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, hw, hw])],
                                  [helper.make_tensor_value_info(o, TensorProto.FLOAT, list(sh)) for o, sh in outs],
                                  initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return model

    return build()


def check(model: onnx.ModelProto, seed: int = 0) -> bool:
    """The property: optimized (default pipeline), both output forms pass the full checker and
    give onnxruntime's outputs of the input model. Raises AssertionError with the reason;
    returns False (nothing checked) when the input itself is invalid or onnxruntime cannot run it."""
    import graphpass as gp
    from graphpass.check import verify as V

    try:
        onnx.checker.check_model(model, full_check=True)
        ref_sess = V.session(model)
        feeds = V.random_inputs(ref_sess, seed=seed)
        ref = V.run(ref_sess, feeds)
    except Exception:  # noqa: BLE001 - not a property of the optimizer
        return False
    result = gp.optimize(model)
    for form in ("device", "portable"):
        out = gp.to_proto(result.graph, emit=form)
        try:
            onnx.checker.check_model(out, full_check=True)
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"{form} form fails the full checker: {str(e).splitlines()[0]}") from e
        # |a - b| <= 1e-4 * max(1, max |a|): the rule verify applies to intermediates
        checked = V.check_outputs(ref, out, feeds, V.Tolerance(0.0, 1e-4, "fuzz property"), fp16_emulate=False,
                                  magnitude_atol=True)
        assert checked.ok, f"{form} form: {checked.describe()}"
    return True


# ------------------------------------------------------------------------------------------
# the differential tester of each pass's promise



@dataclasses.dataclass
class Outcome:
    status: str  # ok | skip | fail | limit (outside the promise's stated domain: an intermediate overflowed)
    reason: str = ""
    #: for a failure: what failed, without the example-specific part (dedups findings)
    signature: str = ""
    promise: str = ""


def cases(family: str, pass_names: list[str] | None = None):
    """The hypothesis strategy of :class:`Case` for ``family`` (one of :data:`FAMILIES`)."""
    from graphpass._fuzz_cases import cases as _cases
    from graphpass.passes.framework.registry import all_passes

    return _cases(family, pass_names or sorted(all_passes()))


def _ort_reason(e: Exception) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if "ort_value_tensor_slicer" in str(e):
        return "a Scan over an empty axis"
    if "running Cast node" in str(e) and ("stod" in str(e) or "stoll" in str(e) or "stoi" in str(e) or "stof" in str(e)):
        return "Cast from a non-numeric string fails"
    if "Cannot parse data from external tensors" in str(e):
        return "onnxruntime cannot read a shape input stored in external data"
    m = re.search(r"implementation for (\w+)\(\d+\)", text) or re.search(r"kernel for (\w+)\b", text)
    if m:
        return f"no CPU kernel for {m.group(1)}"
    m = re.search(r"\(op_type:(\w+)\)[^\]]*?unsupported type: ([\w()]+)", str(e))
    if m:
        return f"ONNX: {m.group(1)} does not take {m.group(2)} at this opset"
    m = re.search(r"Status Message: (.*)", str(e))
    if m:
        text = m.group(1).split("/onnxruntime_src/")[-1]
    text = re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "_", text)
    return text[:90]


def _session(model_or_path):
    """An onnxruntime session with its optimizations off and its logs quiet (graphpass.runtime)."""
    from graphpass.check import runtime

    src = model_or_path.SerializeToString() if isinstance(model_or_path, onnx.ModelProto) else str(model_or_path)
    return runtime.session(src)


def _run(sess, feeds):
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def _outputs(model_or_path, feeds):
    """The model's outputs as the ONNX spec computes them. A model holding float16 runs under
    fp16 emulation (graphpass/check/fp16.py: every float16 tensor rounded to float16), both the
    original and the optimized one: onnxruntime's CPU provider computes float16 ops without a
    float16 kernel in float32 between casts it places itself, so where nodes are moved, added or
    removed its bits depend on the graph's structure, not on the values the spec defines."""
    from graphpass.check import fp16
    from graphpass.check.verify import Runner

    head = model_or_path if isinstance(model_or_path, onnx.ModelProto) else onnx.load(str(model_or_path),
                                                                                        load_external_data=False)
    if not fp16.has_fp16(head):
        return _run(_session(model_or_path), feeds)
    return Runner(model_or_path if isinstance(model_or_path, onnx.ModelProto) else str(model_or_path),
                  fp16_emulate=True).run(feeds)


def _verdict(c, exact: bool) -> str:
    """'' for a comparison that holds, else what differs: a failed exact comparison says
    "not bitwise equal", NaN/inf positions come first (the promise's stated limit is told apart
    by them), a value beyond the tolerance says "beyond"."""
    if c.ok:
        return ""
    note = c.note or "differs"
    if note.startswith(("dtype", "shape", "missing")):
        return note
    if exact:
        return f"not bitwise equal: {note}"
    for lead in ("NaN positions differ", "inf positions or signs differ"):
        if lead in note:
            return f"{lead}: {note}"
    return f"beyond the tolerance: {note}"


def compare(ref: np.ndarray, got: np.ndarray, exact: bool, rtol: float, atol: float) -> str:
    """'' when ``got`` keeps the promise against ``ref``, else what differs.

    The rule of :func:`graphpass.verify.compare` (``exact``: rtol = atol = 0, bitwise but for NaN
    payloads), with a tolerance floored at a few units in the last place of the output's own dtype
    (a promise's rtol/atol are float32 figures: one rounding more or less of a float16 output)."""
    from graphpass.check import verify as V

    rtol, atol = (0.0, 0.0) if exact else (rtol, atol)
    return _verdict(V.compare({"y": ref}, {"y": got}, rtol, atol, ulp_floor=True)[0], exact)


def _loosest(records) -> tuple[bool, float, float, list[str]]:
    """(exact, rtol, atol, names): the promise that applies to a run, from the passes that changed the graph."""
    from graphpass.passes.framework.registry import all_passes

    reg = all_passes()
    changed = sorted({r.name for r in records if r.modified and not r.rolled_back})
    exact, rtol, atol = True, 0.0, 0.0
    for n in changed:
        pr = reg[n].promise
        if not pr.bounded:  # an opt-in precision change or an approximation: held to validity only
            return False, math.inf, math.inf, changed
        if not pr.exact:
            exact, rtol, atol = False, max(rtol, pr.rtol), max(atol, pr.atol)
    return exact, rtol, atol, changed


def _overflowed(model, feeds) -> str:
    """Where a node of ``model`` overflows in this run: it writes ±inf at a position where it
    still writes ±inf when run alone with every NaN/inf among its inputs replaced by 0, so the
    inf came from finite values (any op: elementwise, Conv, BatchNormalization, reductions).
    '' if none, or if it cannot tell.

    A tolerance promise covers float rounding; an intermediate that overflows in one form and
    not the other is its stated limit (Promise), which this finds in the run itself, position by
    position, so NaN or inf fed elsewhere neither hides it nor stands in for it."""
    from graphpass.check.verify import _expose_all

    try:
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model))
        exposed, _ = _expose_all(proto)
        values = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
        values.update(feeds)
        values.update(_run(_session(exposed), feeds))
    except Exception:  # noqa: BLE001 - cannot tell: not a limit
        return ""
    for node in proto.graph.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            continue
        outs = [n for n in node.output if n and n in values and np.asarray(values[n]).dtype.kind == "f"
                and np.isinf(values[n]).any()]
        if not outs or any(n and n not in values for n in node.input):
            continue
        zeroed = {n: np.where(np.isfinite(v), v, 0).astype(v.dtype) if np.asarray(v).dtype.kind == "f" else np.asarray(v)
                  for n, v in ((n, np.asarray(values[n])) for n in node.input if n)}
        alone = _node_alone(proto, node, zeroed, {n: np.asarray(values[n]) for n in node.output if n in values})
        if alone is None:
            continue
        for name in outs:
            if name in alone and (np.isinf(values[name]) & np.isinf(alone[name])).any():
                return f"{node.op_type} '{node.name or name}' overflows to inf from finite inputs"
    return ""


def _node_alone(model: onnx.ModelProto, node: onnx.NodeProto, inputs: dict, outputs: dict) -> dict | None:
    """The outputs of ``node`` run alone in onnxruntime on ``inputs`` (None when it cannot run)."""
    from onnx import helper

    def vi(name, v):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))

    try:
        g = helper.make_graph([node], "alone", [vi(n, v) for n, v in inputs.items()],
                              [vi(n, v) for n, v in outputs.items()])
        m = helper.make_model(g, opset_imports=list(model.opset_import), functions=list(model.functions))
        m.ir_version = model.ir_version
        return _run(_session(m), inputs)
    except Exception:  # noqa: BLE001 - a node that cannot run alone: cannot tell
        return None


def model_io_checker_problem(path: str) -> str | None:
    from graphpass.ir.model_io import _checker_problem

    return _checker_problem(path)


def _norm(reason: str) -> str:
    """A failure reason without names and numbers, so failures of one kind share a signature."""
    reason = re.sub(r"\(at [^)]*\)|\(first [^)]*\)|'[^']*'|\"[^\"]*\"|tensor name: \w+|output \w+", "", reason)
    reason = re.sub(r"np\.\w+\([^)]*\)|[-+]?\d[\w.+-]*", "#", reason)
    return re.sub(r"\s+", " ", reason).strip()[:90]


def differential(case: Case, workdir: str | Path | None = None) -> Outcome:
    """Run ``case`` through its passes and hold the result to their promise. graphpass's own
    warnings are silenced while it runs (fold_constants' retries are not findings) and the
    logger's level is put back afterwards."""
    import logging

    logger = logging.getLogger("graphpass")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return _differential(case, workdir)
    finally:
        logger.setLevel(level)


def _differential(case: Case, workdir: str | Path | None) -> Outcome:
    import graphpass as gp
    from graphpass.check import verify as V
    from graphpass.errors import BadModelError

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        model, source = case.model, case.model
        try:
            # ONNX types a sparse initializer as a sparse tensor, which standard ops refuse in
            # its shape inference; onnxruntime densifies them: checked without inference
            onnx.checker.check_model(model, full_check=not len(model.graph.sparse_initializer))
        except Exception as e:  # noqa: BLE001 - the generator built an invalid model
            return Outcome("skip", f"generator: invalid model ({_ort_reason(e)})")
        if case.storage == "external":
            src_path = tmp / "in.onnx"
            stored = onnx.ModelProto()
            stored.CopyFrom(model)  # onnx.save_model moves the tensors out of the proto it is given
            onnx.save_model(stored, str(src_path), save_as_external_data=True, all_tensors_to_one_file=True,
                            location="in.onnx.data", size_threshold=0)
            source = str(src_path)
        try:
            ref = _outputs(source, case.feeds)
        except Exception as e:  # noqa: BLE001
            return Outcome("skip", f"onnxruntime cannot run the original: {_ort_reason(e)}")
        run = "default" if case.passes is None else case.passes[0]
        try:
            result = gp.optimize(source, passes=case.passes) if case.passes else gp.optimize(source)
        except BadModelError as e:
            return Outcome("fail", f"refused a valid model: {e}", f"{run}: refused: {_norm(str(e))[:60]}")
        except Exception as e:  # noqa: BLE001
            msg = str(e).splitlines()[0] if str(e) else ""
            return Outcome("fail", f"crash: {type(e).__name__}: {msg}", f"{run}: crash {type(e).__name__}: {_norm(msg)[:50]}")
        exact, rtol, atol, changed = _loosest(result.report.passes)
        # an opt-in promise holds the outputs to validity only: compared, never judged (below)
        tol = V.Tolerance(0.0, 0.0, "exact") if exact or math.isinf(rtol) else V.Tolerance(rtol, atol, "promise")
        promise = "exact" if exact else ("opt-in: valid models only" if math.isinf(rtol) else f"rtol {rtol:g} atol {atol:g}")
        who = run
        if not case.passes:
            promise += "; changed by " + (",".join(changed) or "nothing")
        for form in ("device", "portable"):
            try:
                if case.storage == "external":
                    out = gp.save(result.graph, tmp / f"out_{form}.onnx", external_data=True, emit=form)
                    problem = model_io_checker_problem(str(out))
                    if problem:
                        raise ValueError(problem)
                    target = str(out)
                else:
                    target = gp.to_proto(result.graph, emit=form)
                    onnx.checker.check_model(target, full_check=not len(target.graph.sparse_initializer))
            except Exception as e:  # noqa: BLE001
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                return Outcome("fail", f"{form} form invalid: {first}", f"{who}: invalid model: {_norm(first)}", promise)
            try:  # the candidate runs as _outputs runs the original (fp16 emulated where it holds float16)
                checked = V.check_outputs(ref, target, case.feeds, tol, ulp_floor=True)
            except Exception as e:  # noqa: BLE001
                e = e.__cause__ or e  # onnxruntime's own message, not only its first line
                return Outcome("fail", f"{form} form: onnxruntime fails: {_ort_reason(e)}",
                               f"{who}: optimized model fails in onnxruntime: {_ort_reason(e)[:60]}", promise)
            for c in checked.comparisons:
                k = c.name
                if c.note == "missing output":
                    return Outcome("fail", f"{form} form: output {k} missing", f"{who}: output missing", promise)
                why = "" if math.isinf(rtol) else _verdict(c, exact)
                if why and not exact and why.startswith(("NaN positions", "inf positions")):
                    over = _overflowed(case.model, case.feeds) or _overflowed(target, case.feeds)
                    if over:  # the stated limit of a tolerance (Promise): not a rounding question
                        return Outcome("limit", f"{form} form, output {k}: {why}; {over}", f"{who}: {_norm(why)}",
                                       promise)
                if why:
                    return Outcome("fail", f"{form} form, output {k} ({promise}): {why}",
                                   f"{who}: {_norm(why)}", promise)
        return Outcome("ok", promise=promise)


_REPRO = """\
# A minimized reproducer written by graphpass's fuzzer: {describe}
# Failure: {reason}
# The model is stored as the case stored it{stored} (`graphpass optimize {model}` reads it so).
from pathlib import Path

import numpy as np, onnx
import graphpass as gp
from graphpass._fuzz_cases import Case
from graphpass.fuzzing import differential

here = Path(__file__).resolve().parent
model = onnx.load(str(here / "{model}"))
feeds = dict(np.load(here / "{feeds}", allow_pickle=True))
case = Case({family!r}, {template!r}, {storage!r}, {opset}, model, feeds, {passes!r})
print(differential(case))
"""


def write_reproducer(case: Case, outcome: Outcome, folder: str | Path) -> Path:
    """Writes ``case`` (the model, its inputs, and a script that re-runs the check) under ``folder``.

    An external-data case's model is written as it was stored, its tensors in a ``.data`` file
    beside it; the script reads its files relative to itself, so the folder can be moved."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9_]+", "_", f"{case.family}_{outcome.signature}")[:80].strip("_")
    k = 0
    while (folder / f"{stem}_{k}.onnx").exists():
        k += 1
    base = folder / f"{stem}_{k}"
    stored = ""
    if case.storage == "external":  # as differential() stores it: every tensor in a .data file beside it
        copy = onnx.ModelProto()
        copy.CopyFrom(case.model)  # onnx.save_model moves the tensors out of the proto it is given
        onnx.save_model(copy, f"{base}.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                        location=f"{base.name}.onnx.data", size_threshold=0)
        stored = f", its tensors in {base.name}.onnx.data"
    else:
        onnx.save(case.model, f"{base}.onnx")
    np.savez(f"{base}_inputs.npz", **case.feeds)
    Path(f"{base}.py").write_text(_REPRO.format(
        describe=case.describe(), reason=outcome.reason.replace("\n", " "), model=f"{base.name}.onnx",
        feeds=f"{base.name}_inputs.npz", family=case.family, template=case.template, storage=case.storage,
        opset=case.opset, passes=case.passes, stored=stored))
    return Path(f"{base}.onnx")


def mutate_bytes(data: bytes, family: str, rng) -> bytes:
    """A corrupted copy of a serialized model: ``bitflip`` (1-20 bits), ``truncate`` (cut at a
    random byte) or ``overwrite`` (8 random bytes); ``rng`` is a ``random.Random``. Shared by
    benchmarks/bad_inputs.py and the mutated-models test."""
    b = bytearray(data)
    if family == "bitflip":
        for _ in range(rng.randint(1, 20)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif family == "truncate":
        b = b[: rng.randrange(1, len(b))]
    else:
        i = rng.randrange(len(b))
        b[i:i + 8] = bytes(rng.randrange(256) for _ in range(8))
    return bytes(b)
