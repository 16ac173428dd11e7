"""The committed real-exporter corpus (tests/data/exporters): its manifest and seeded inputs.

Shared by the corpus tests and benchmarks/peers.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[1] / "data" / "exporters"


def manifest(folder: Path = DATA) -> dict:
    """The manifest.json that benchmarks/export_corpus.py wrote in ``folder``."""
    return json.loads((Path(folder) / "manifest.json").read_text())


def exported(folder: Path = DATA) -> list[dict]:
    """The manifest's entries that have a file (the others hold the exporter's error)."""
    return [e for e in manifest(folder)["files"] if e.get("file")]


def feeds_for(entry: dict, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs of the export's example shapes (the batch is not the exporter's default
    of 1); integer inputs within their valid range (token ids below the vocabulary size)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, spec in entry["example_inputs"].items():
        shape, dtype = spec["shape"], np.dtype(spec["dtype"])
        if dtype.kind in "iub":
            low, high = spec.get("range", (0, 2))
            out[name] = rng.integers(low, high, size=shape).astype(dtype)
        else:
            out[name] = rng.standard_normal(shape).astype(dtype)
    return out
