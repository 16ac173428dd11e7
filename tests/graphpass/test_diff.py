"""graphpass diff: matching, grouping into rewrites, formats, exit codes, bad input, the browser."""

import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphpass as gp
from graphpass.cli import main
from graphpass.diff import diff_models, to_html, to_json, to_markdown, to_text
from graphpass.testing import make_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def shufflenet(tmp_path_factory):
    sys.path.insert(0, str(EXAMPLES))
    import shufflenet_v2

    d = tmp_path_factory.mktemp("shuf")
    before = d / "before.onnx"
    onnx.save(shufflenet_v2.build(1.0, 1000), before)
    after = d / "after.onnx"
    r = gp.optimize(str(before), input_shapes={"input": [1, 3, 224, 224]})
    gp.save(r.graph, after, emit="device")
    return before, after


def _conv_model(pads=(0, 0, 0, 0)):
    w = np.random.default_rng(0).standard_normal((8, 4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=list(pads)),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    hw = 6 if pads[0] == 0 else 8
    return make_model(nodes, {"x": [1, 4, 8, 8]}, {"y": [1, 8, hw, hw]}, initializers={"w": w})


def test_identical_models_have_no_changes(light_path):
    d = diff_models(light_path("light_resnet50.onnx"), light_path("light_resnet50.onnx"))
    assert d.equivalent and not d.removed and not d.added and not d.rewrites
    assert to_text(d).splitlines()[1] == "no changes"
    assert main(["diff", light_path("light_resnet50.onnx"), light_path("light_resnet50.onnx"), "--exit-code"]) == 0


@pytest.mark.parametrize("name", ["light_resnet50.onnx", "light_inception_v2.onnx", "light_squeezenet.onnx"])
def test_stripped_and_renamed_nodes_still_match_by_structure(light_path, tmp_path, name):
    model = onnx.load(light_path(name))
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    rng = random.Random(0)
    for n in copy.graph.node:
        n.name = "" if rng.random() < 0.5 else f"renamed_{rng.randint(0, 10**9)}"
    onnx.save(copy, tmp_path / "copy.onnx")
    d = diff_models(light_path(name), tmp_path / "copy.onnx", target="none")
    assert d.equivalent, to_text(d)
    assert len(d.matching.a_of_b) == len(model.graph.node)


def test_shufflenet_rewrites_are_grouped_with_transdata_and_cost_deltas(shufflenet):
    before, after = shufflenet
    d = diff_models(before, after)
    assert not d.equivalent
    by_pass = {}
    for r in d.rewrites:
        by_pass.setdefault(r.pass_name, []).append(r)
    # every channel shuffle (16 in x1.0) is one site of a shuffle rewrite
    shuffle_sites = sum(len(r.sites) for p in ("fuse_gather_split", "fuse_channel_shuffle") for r in by_pass.get(p, []))
    assert shuffle_sites == 16
    gs_ = by_pass["fuse_gather_split"][0]
    assert gs_.label.startswith("Gather×3+Unsqueeze×3+Concat×2+Reshape×2") and gs_.label.endswith("→ Gather×2")
    td = by_pass["propagate_layout"][0]
    assert td.label == "∅ → graphpass.ascend::TransData" and len(td.sites) == d.transdata["after"] > 0
    # the before graph priced with its proven shapes (its shape arithmetic folded, as ATC compiles it): as
    # many implicit TransData as the after graph has explicit ones (issue 21)
    assert d.transdata["before"] == 0 and d.transdata["implicit_before"] >= d.transdata["after"]
    assert all(r.cost_delta_us is not None for r in d.rewrites)
    assert gs_.cost_delta_us < 0 and td.cost_delta_us > 0
    assert d.cost["after_us"] < d.cost["before_us"]
    md = to_markdown(d)
    assert md.startswith("### graphpass diff") and "<details><summary>sites of each rewrite</summary>" in md
    assert "| rewrite | pass | sites | est. Δ µs |" in md


def test_json_schema_is_stable(shufflenet):
    before, after = shufflenet
    out = json.loads(to_json(diff_models(before, after)))
    assert out["schema"] == "graphpass.diff/1"
    for key in ("before", "after", "equivalent", "summary", "ops", "transdata", "cost", "rewrites", "attribute_changes",
                "inputs", "outputs", "weights", "opsets", "subgraphs"):
        assert key in out
    assert set(out["summary"]) >= {"nodes", "removed", "added", "matched", "rewired", "attribute_changes", "matched_by"}
    r = out["rewrites"][0]
    assert set(r) == {"label", "pass", "count", "sites", "cost_delta_us"} and r["count"] == len(r["sites"])
    assert out["inputs"]["changed"][0]["before"]["shape"] == ["N", 3, 224, 224]


def test_attribute_change_and_exit_code(tmp_path):
    onnx.save(_conv_model(), tmp_path / "a.onnx")
    onnx.save(_conv_model((1, 1, 1, 1)), tmp_path / "b.onnx")
    d = diff_models(tmp_path / "a.onnx", tmp_path / "b.onnx")
    assert [(c["node"], c["attribute"], c["before"], c["after"]) for c in d.attribute_changes] == [
        ("conv", "pads", [0, 0, 0, 0], [1, 1, 1, 1])]
    assert d.outputs["changed"][0]["after"]["shape"] == [1, 8, 8, 8]
    assert main(["diff", str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx"), "--exit-code"]) == 1
    assert main(["diff", str(tmp_path / "a.onnx"), str(tmp_path / "b.onnx")]) == 0


def test_different_opsets_inputs_and_outputs_are_still_diffed(tmp_path):
    a = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2, 3]}, {"y": [2, 3]}, opset=13)
    b = make_model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["z"], ["w"])],
                   {"x": [2, 3], "z": (TensorProto.FLOAT16, [4])}, {"y": [2, 3], "w": (TensorProto.FLOAT16, [4])}, opset=17)
    d = diff_models(a, b)
    assert d.opsets["before"] != d.opsets["after"]
    assert d.inputs["added"] == ["z"] and d.outputs["added"] == ["w"]
    assert [r.label for r in d.rewrites] == ["∅ → Neg"]
    assert not d.equivalent


def test_subgraph_bodies_are_diffed_recursively():
    def model(then_op):
        then_g = helper.make_graph([helper.make_node(then_op, ["x"], ["o1"])], "then", [],
                                   [helper.make_tensor_value_info("o1", TensorProto.FLOAT, [2])])
        else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["o2"])], "else", [],
                                   [helper.make_tensor_value_info("o2", TensorProto.FLOAT, [2])])
        return make_model([helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)],
                          {"c": (TensorProto.BOOL, []), "x": [2]}, {"y": [2]})
    d = diff_models(model("Relu"), model("Sigmoid"), target="none")
    assert not d.equivalent and not d.removed and not d.added
    (sub,) = d.subgraphs
    assert sub["node"] == "branch" and sub["attribute"] == "then_branch"
    assert [r.label for r in sub["diff"].rewrites] == ["Relu → Sigmoid"]
    assert "subgraph branch.then_branch" in to_text(d)


def test_unreadable_file_exits_2_naming_it_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "junk.onnx").write_bytes(b"\x08\x07not a model at all")
    onnx.save(_conv_model(), tmp_path / "a.onnx")
    out = tmp_path / "d.md"
    assert main(["diff", str(tmp_path / "a.onnx"), str(tmp_path / "junk.onnx"), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "junk.onnx" in err[0] and "after model" in err[0]
    assert not out.exists()
    assert main(["diff", str(tmp_path / "missing.onnx"), str(tmp_path / "a.onnx")]) == 2
    assert "before model" in capsys.readouterr().err


def test_formats_write_atomically_to_a_file(shufflenet, tmp_path):
    before, after = shufflenet
    for fmt in ("text", "markdown", "json", "html"):
        out = tmp_path / f"d.{fmt}"
        assert main(["diff", str(before), str(after), "--format", fmt, "-o", str(out), "--target", "none"]) == 0
        text = out.read_text(encoding="utf-8")
        assert "fuse_gather_split" in text
    assert not list(tmp_path.glob(".d.*"))  # no temp files left


def test_html_is_self_contained(shufflenet):
    before, after = shufflenet
    page = to_html(diff_models(before, after, target="none"))
    assert page.startswith("<!doctype html>") and "</html>" in page
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)  # nothing fetched
    assert page.count('<svg class="graph before') == page.count('<svg class="graph after') > 10


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(_chromium() is None, reason="no chromium (.ci/run installs Debian's chromium)")
def test_html_renders_both_sides_in_a_headless_browser(shufflenet, tmp_path):
    before, after = shufflenet
    page = tmp_path / "diff.html"
    assert main(["diff", str(before), str(after), "--format", "html", "-o", str(page)]) == 0
    args = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--virtual-time-budget=5000", "--window-size=1400,1000"]
    dom = subprocess.run(args + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    m = re.search(r'data-rendered="([^"]+)"', dom)
    assert m, dom[:500]
    rendered = json.loads(m.group(1).replace("&quot;", '"'))
    for side in ("before", "after"):
        assert rendered[side]["svgs"] > 10 and rendered[side]["drawn"] == rendered[side]["boxes"] > 0
        assert rendered[side]["area"] > 0
    shot = tmp_path / "shot.png"
    subprocess.run(args + [f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
