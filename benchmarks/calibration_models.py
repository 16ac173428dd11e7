"""Build the ONNX models of the calibration table (cost_model/data/calibration.toml).

    /work/venv-torch/bin/python benchmarks/calibration_models.py [--out DIR] [--only NAME ...]

Each network of the table is built from torchvision with seeded random weights
(``torch.manual_seed(0)``; the weights do not change the cost, only the values), put in eval
mode and exported the way a new user does: the TorchScript exporter (``dynamo=False``), opset
17, one input ``input`` with a dynamic batch dimension ``batch`` (fixed per row with
``input_shapes``, as ``graphpass cost --input-shape`` does).

The export is written twice:

- ``DIR/NAME.onnx``: the full model (needs torch to rebuild; not committed);
- ``benchmarks/data/calibration/NAME.onnx.gz``: the same graph with every initializer over
  1 KiB stripped to its header (name, dtype, dims; no bytes), gzipped. The cost model reads a
  weight's shape, never its values, so the estimate of the stripped graph is the estimate of the
  model; this is what ``tests/cost_model/test_calibration.py`` checks the fit on without torch.

torch is never imported by graphpass or by the default test path.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "cost_model" / "data" / "calibration.toml"
STRIPPED = ROOT / "benchmarks" / "data" / "calibration"
#: an initializer over this many bytes keeps its header only
STRIP_OVER_BYTES = 1024


def networks() -> dict[str, list[int]]:
    """network -> input shape with batch 1, from the calibration table."""
    rows = tomllib.loads(TABLE.read_text(encoding="utf-8"))["row"]
    return {r["network"]: [1, *r["input"][1:]] for r in rows}


def build(name: str, shape: list[int]):
    import torch
    import torchvision

    torch.manual_seed(0)
    kwargs = {"weights": None}
    if name == "googlenet":
        kwargs.update(aux_logits=False, init_weights=True)
    if name == "inception_v3":
        kwargs.update(aux_logits=False, init_weights=True)
    model = getattr(torchvision.models, name)(**kwargs).eval()
    if name.startswith("vit_") and shape[-1] != 224:
        raise SystemExit(f"{name}: only 224x224 is built")
    return model


def export(name: str, shape: list[int], path: Path) -> None:
    import torch

    model = build(name, shape)
    x = torch.zeros(*shape)
    torch.backends.mha.set_fastpath_enabled(False)  # the fused attention kernel has no ONNX export
    with torch.no_grad():
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17, input_names=["input"],
                          output_names=["output"], dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})


def strip(model):
    """The model with every initializer over STRIP_OVER_BYTES reduced to its header."""
    import onnx

    for t in model.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            raise SystemExit(f"{t.name}: external data is not expected here")
        if len(t.raw_data) > STRIP_OVER_BYTES or len(t.float_data) * 4 > STRIP_OVER_BYTES:
            t.ClearField("raw_data")
            t.ClearField("float_data")
    model.metadata_props.add(key="graphpass.calibration", value="initializers over 1 KiB stripped to their header")
    return model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/tmp/graphpass-calibration"))
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args(argv)
    import onnx

    args.out.mkdir(parents=True, exist_ok=True)
    STRIPPED.mkdir(parents=True, exist_ok=True)
    for name, shape in networks().items():
        if args.only and name not in args.only:
            continue
        full = args.out / f"{name}.onnx"
        if not full.exists():
            export(name, shape, full)
        model = strip(onnx.load(str(full)))
        data = model.SerializeToString()
        (STRIPPED / f"{name}.onnx.gz").write_bytes(gzip.compress(data, 9, mtime=0))
        print(f"{name}: {full.stat().st_size / 1e6:.1f} MB -> {len(data) / 1e3:.0f} kB stripped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
