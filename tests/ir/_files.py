"""The model files the IR's import and export are compared with onnx-graphsurgeon's on: onnx's
backend test data (model-zoo architectures, simple and pytorch cases) and every .onnx of the
suite's own data (the exporter corpus included)."""

import glob
from pathlib import Path

import onnx

ONNX_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
REPO = Path(__file__).resolve().parents[2]
FILES = sorted(
    glob.glob(str(ONNX_DATA / "light" / "*.onnx"))
    + glob.glob(str(ONNX_DATA / "simple" / "*" / "model.onnx"))
    + glob.glob(str(ONNX_DATA / "pytorch-*" / "*" / "model.onnx"))
    + glob.glob(str(REPO / "tests" / "data" / "**" / "*.onnx"), recursive=True)
)
# every .onnx under onnx's backend test data (the node cases too), for tests that only read protos
ALL_ONNX_DATA = sorted(glob.glob(str(ONNX_DATA / "**" / "*.onnx"), recursive=True))


def loaded(paths):
    """``(path, model)`` for each of ``paths`` onnx itself can read (external data not loaded)."""
    for p in paths:
        try:
            yield p, onnx.load(p, load_external_data=False)
        except Exception:  # noqa: BLE001 - a file onnx itself cannot read
            continue
