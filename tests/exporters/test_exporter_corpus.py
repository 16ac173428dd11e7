"""The real-exporter corpus (tests/data/exporters, made by benchmarks/export_corpus.py): what
torch's TorchScript and dynamo exporters write for torchvision and transformers models.

Every committed file is what the exporter wrote (symbolic batch, Shape arithmetic, exporter
value_info, external data for the dynamo files) and checks in full; graphpass's neutral and
default pipelines each give a model that checks in full, runs in onnxruntime and matches the
original on seeded inputs of the export's example shapes within the declared promises of the
passes that changed it. No torch needed: the files are committed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx
import pytest

import graphpass as gp
from graphpass.check import verify as V
from graphpass.passes.framework.registry import all_passes

from _corpus import DATA, exported, feeds_for, manifest

ENTRIES = manifest()["files"]
FILES = exported()
#: what issue 20 asks the corpus to hold, each through both exporters (exported or its error recorded)
MODELS = {"shufflenet_v2", "mobilenet_v3_small", "resnet18", "efficientnet_b0", "lraspp_mobilenet_v3",
          "nms_detector", "bert", "gpt2", "vit", "whisper"}
PIPELINES = {"neutral": "none", "default": None}  # pipeline -> target (None: the default target)

#: (file, pipeline) -> what graphpass gets wrong on it today (strict xfail: the test says when it is fixed)
BROKEN: dict[tuple[str, str], str] = {}


def _id(e: dict) -> str:
    return e["file"].removesuffix(".onnx")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_manifest_covers_every_model_and_both_exporters():
    seen = {(e["model"], e["exporter"]) for e in ENTRIES}
    assert {(m, x) for m in MODELS for x in ("torchscript", "dynamo")} <= seen
    for e in ENTRIES:
        assert e.get("file") or e.get("error"), e
        assert e["command"].startswith("python benchmarks/export_corpus.py")
        assert e["versions"]["torch"] and e["versions"]["torchvision"]


def test_committed_files_are_the_manifests():
    listed = set()
    for e in FILES:
        path = DATA / e["file"]
        assert _sha(path) == e["sha256"], f"{e['file']} differs from the manifest: re-run the export script"
        listed.add(e["file"])
        for ext in e["external_data"]:
            assert _sha(DATA / ext["file"]) == ext["sha256"], ext["file"]
            listed.add(ext["file"])
    on_disk = {p.name for p in DATA.iterdir() if p.name != "manifest.json"}
    assert on_disk == listed, f"files not in the manifest: {sorted(on_disk - listed)}; missing: {sorted(listed - on_disk)}"
    assert sum((DATA / f).stat().st_size for f in on_disk) <= 20 * 2**20


def test_the_corpus_holds_what_real_exports_hold():
    """Symbolic batch dims on every file, external data in at least one dynamo file, both opsets."""
    assert any(e["external_data"] for e in FILES if e["exporter"] == "dynamo")
    assert {e["opset"] for e in FILES} >= {17, 18}
    for e in FILES:
        dims = [d for i in e["inputs"] for d in i["shape"]]
        assert any(isinstance(d, str) for d in dims), f"{e['file']}: no symbolic dim"


@pytest.mark.parametrize("entry", FILES, ids=_id)
def test_original_checks_in_full_and_runs(entry):
    path = DATA / entry["file"]
    onnx.checker.check_model(str(path), full_check=True)
    outs = V.run(V.session(str(path)), feeds_for(entry))
    assert [o for o in outs] == entry["outputs"]


def _cases():
    for e in FILES:
        for pipeline in PIPELINES:
            why = BROKEN.get((e["file"], pipeline))
            marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
            yield pytest.param(e, pipeline, id=f"{_id(e)}-{pipeline}", marks=marks)


@pytest.mark.parametrize("entry,pipeline", list(_cases()))
def test_optimized_checks_and_matches(entry, pipeline, tmp_path):
    path = DATA / entry["file"]
    kw = {"target": PIPELINES[pipeline]} if PIPELINES[pipeline] else {}
    result = gp.optimize(str(path), pipeline=pipeline, **kw)
    out = tmp_path / entry["file"]
    gp.save(result.model, out)
    onnx.checker.check_model(str(out), full_check=True)
    applied = [r.name for r in result.report.passes if r.application]
    feeds = feeds_for(entry)
    checked = V.check_outputs(str(path), str(out), feeds, promises=V.promises_of(applied, all_passes()))
    assert checked.ok, checked.describe()
    assert result.report.nodes_after <= result.report.nodes_before
