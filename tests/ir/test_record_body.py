"""external._record_body writes a computed weight's TensorProto record without the message: the
bytes of ``_as_proto(name, array, header).SerializeToString()`` for every numeric type and bool,
scalars, empty and non-contiguous arrays, dims past a one-byte varint, non-ASCII and long names;
a big-endian array, an unnamed one, a header with annotations and a loaded TensorProto take the
message path (the same bytes by construction)."""

import numpy as np
import onnx
import pytest

from graphpass.ir import external

_TYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.float16,
          np.float32, np.float64]


def _expected(name, original, header=None):
    return external._as_proto(name, original, header).SerializeToString()


@pytest.mark.parametrize("kind", _TYPES, ids=lambda k: np.dtype(k).name)
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 0, 5), (300, 2), (1, 20000)])
def test_the_bytes_of_the_message(kind, shape):
    rng = np.random.default_rng(0)
    a = np.asarray((rng.standard_normal(shape) * 100)).astype(kind)
    if np.dtype(kind).kind == "f":
        a.reshape(-1)[:3] = [np.nan, -0.0, np.inf][:a.size]
    for name in ("w", "ü" * 3, "x" * 200):
        assert external._record_body(name, a, None) == _expected(name, a)
        assert onnx.TensorProto.FromString(external._record_body(name, a, None)) == onnx.numpy_helper.from_array(a, name)


def test_non_contiguous_and_other_orders():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    for view in (a.T, a[:, ::2], a[::-1]):
        assert external._record_body("t", view, None) == _expected("t", view)
    big = a.astype(">f4")  # not the machine's order: the message path, which refuses it as it did
    with pytest.raises(ValueError) as theirs:
        _expected("t", big)
    with pytest.raises(ValueError) as ours:
        external._record_body("t", big, None)
    assert str(ours.value) == str(theirs.value)


def test_headers_and_protos():
    a = np.ones((600,), np.float32)
    header = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[600])
    assert external._record_body("w", a, header) == _expected("w", a, header)
    header.metadata_props.add(key="graphpass.format", value="NC1HWC0")  # annotations: the header's
    body = external._record_body("w", a, header)
    assert body == _expected("w", a, header)
    assert onnx.TensorProto.FromString(body).metadata_props[0].value == "NC1HWC0"
    assert external._record_body("", a, None) == _expected("", a)  # unnamed: from_array writes no name
    proto = onnx.numpy_helper.from_array(a, "old")
    assert external._record_body("new", proto, None) == _expected("new", proto)  # a renamed loaded weight
