"""atc-check: ATC's fusion_result.json and GE graph dumps against graphpass's plan.

No Ascend device runs in CI: the ATC files here are written by the tests in the formats the CANN
documents describe (fusion_result.json: the --export_compile_stat page; the GE dump: protobuf
text of GE's ModelDef, as DUMP_GE_GRAPH writes ge_proto_*_Build.txt; see [readback] in
cost_model/data/cann_atc.toml)."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from graphpass.atc import write_kit
from graphpass.atc.readback import atc_check, read_fusion_result, read_ge_graph
from graphpass.errors import UsageError
from graphpass.testing import make_model


def _model():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("NonZero", ["r"], ["nz"], name="nonzero"),
             helper.make_node("Transpose", ["r"], ["y"], name="tr", perm=[0, 2, 3, 1])]
    return make_model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 8, 8, 4], "nz": (TensorProto.INT64, [4, None])},
                      {"w": np.ones((4, 3, 3, 3), np.float32)})


FUSION_RESULT = {
    "session_and_graph_id_0_0": {
        "graph_fusion": {"ConvBatchnormFusionPass": {"match_times": "1", "effect_times": "1"}},
        "ub_fusion": {"TbeConv2DReluv2Pass": {"match_times": "1", "effect_times": "0", "repository_hit_times": "0"},
                      "TbeEltwiseFusionPass": {"match_times": "2", "effect_times": "1", "repository_hit_times": "0"}},
    },
    "session_and_graph_id_0_1": {
        "graph_fusion": {"ConvBatchnormFusionPass": {"match_times": 1, "effect_times": 0}},
    },
}


def _op(name, type_, inputs=(), engine=None, original=()):
    lines = ["  op {", f'    name: "{name}"', f'    type: "{type_}"']
    lines += [f'    input: "{i}"' for i in inputs]
    if engine:
        lines += ["    attr {", '      key: "_ge_attr_op_kernel_lib_name"', "      value {", f'        s: "{engine}"',
                  "      }", "    }"]
    if original:
        lines += ["    attr {", '      key: "_datadump_original_op_names"', "      value {", "        list {"]
        lines += [f'          s: "{o}"' for o in original]
        lines += ["          val_type: VT_LIST_STRING", "        }", "      }", "    }"]
    return lines + ["  }"]


def _dump(folder):
    ops = (_op("x", "Data", engine="DNN_VM_GE_LOCAL_OP_STORE")
           + _op("trans_TransData_0", "TransData", ["x:0"], "AIcoreEngine")
           + _op("conv_relu", "Conv2D", ["trans_TransData_0:0", "w:0"], "AIcoreEngine", ["conv", "relu"])
           + _op("trans_TransData_1", "TransData", ["relu:0"], "AIcoreEngine")
           + _op("nonzero", "NonZero", ["trans_TransData_1:0"], "aicpu_ascend_kernel")
           + _op("tr", "TransposeD", ["trans_TransData_1:0"], "aicpu_tf_kernel")
           + _op("trans_TransData_2", "TransData", ["tr:0"], "AIcoreEngine"))
    text = "\n".join(['name: "graph_1"', "# comment line", "graph {", '  name: "graph_1"'] + ops + ["}"]) + "\n"
    folder.mkdir()
    (folder / "ge_proto_00000001_graph_1_PreRunBegin.txt").write_text('graph {\n  name: "g"\n' + "\n".join(
        _op("only_in_early_stage", "TransData", ["x:0"])) + "\n}\n")
    (folder / "ge_proto_00000310_graph_1_Build.txt").write_text(text)
    return folder


@pytest.fixture
def files(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(_model(), model)
    kit = tmp_path / "kit"
    write_kit(str(model), kit, switches={"fold_batchnorm": False}, name="m")
    fr = tmp_path / "fusion_result.json"
    fr.write_text(json.dumps(FUSION_RESULT))
    return model, kit, fr, _dump(tmp_path / "dump")


def test_fusion_result_sums_every_session_and_graph(tmp_path):
    p = tmp_path / "f.json"
    p.write_text(json.dumps(FUSION_RESULT))
    got = read_fusion_result(p)
    assert got["ConvBatchnormFusionPass"] == {"section": "graph_fusion", "match": 2, "effect": 1}
    assert got["TbeEltwiseFusionPass"]["effect"] == 1 and got["TbeConv2DReluv2Pass"]["effect"] == 0


def test_ge_dump_folder_reads_the_compiled_stage(files):
    *_, dump = files
    f, ops = read_ge_graph(dump)
    assert f.name.endswith("_Build.txt")
    by = {o["name"]: o for o in ops}
    assert by["nonzero"]["engine"] == "aicpu_ascend_kernel" and by["conv_relu"]["original"] == ["conv", "relu"]
    assert by["trans_TransData_1"]["inputs"] == ["relu:0"]
    assert "only_in_early_stage" not in by


def test_atc_check_reports_matches_and_mismatches(files):
    model, kit, fr, dump = files
    r = atc_check(str(model), fr, ge_graph=dump, kit=kit)
    verdict = {f["name"]: f["verdict"] for f in r.fusions}
    assert verdict["ConvBatchnormFusionPass"] == "applied though switched off"
    assert verdict["TbeEltwiseFusionPass"] == "applied (not forecast)"
    assert verdict["TbeConv2DReluv2Pass"] == "expected, not applied"  # graphpass's fuse_conv_activation fires here
    assert verdict["AABiasaddConvFusion"] == "as planned"             # no bias: neither side fuses
    # TransData: forecast at the input x and after relu (the NC1HWC0 -> ND for NonZero); ATC adds one after tr
    assert r.transdata["both"] == ["relu", "x"] and r.transdata["only_atc"] == ["tr"]
    assert r.transdata["only_forecast"] == [] and (r.transdata["forecast"], r.transdata["atc"]) == (2, 3)
    # AI CPU: NonZero as forecast; the Transpose on AI CPU was not
    assert r.aicpu["both"] == ["nonzero"] and r.aicpu["only_atc"] == ["tr"]
    assert r.mismatches >= 3
    text = r.to_table()
    assert "applied though switched off" in text and "in ATC's graph, not forecast: tr" in text


def test_without_ge_graph_only_fusions_are_compared(files):
    model, kit, fr, _ = files
    r = atc_check(str(model), fr, kit=kit)
    assert r.transdata == {} and "no --ge-graph" in r.notes[0]


@pytest.mark.parametrize("text, match", [("[1, 2]", "expected an object"), ("{", "not valid JSON"),
                                         ('{"s": {"graph_fusion": {"P": {"effect_times": "x"}}}}', "must be numbers")])
def test_bad_fusion_result_is_one_clear_usage_error(tmp_path, text, match):
    p = tmp_path / "f.json"
    p.write_text(text)
    with pytest.raises(UsageError, match=match):
        read_fusion_result(p)


def test_bad_ge_dump_is_a_usage_error(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(UsageError, match="no ge_proto"):
        read_ge_graph(tmp_path / "d")
    bad = tmp_path / "ge_proto_1_Build.txt"
    bad.write_text("graph { op { name: \"a\" }")
    with pytest.raises(UsageError, match="unbalanced"):
        read_ge_graph(bad)


def test_cli_atc_check_exits_1_on_differences_and_prints_them(files):
    model, kit, fr, dump = files
    p = subprocess.run([sys.executable, "-m", "graphpass", "atc-check", str(model), "--fusion-result", str(fr),
                        "--ge-graph", str(dump), "--kit", str(kit), "--format", "json"], capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    assert json.loads(p.stdout)["mismatches"] >= 3
    p = subprocess.run([sys.executable, "-m", "graphpass", "atc-check", str(model), "--fusion-result",
                        str(fr) + ".missing"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "no such file" in p.stderr


def test_ge_dump_strings_with_octal_utf8_escapes(tmp_path):
    f = tmp_path / "ge_proto_1_Build.txt"
    f.write_text('graph {\n  op {\n    name: "\\345\\215\\267\\347\\247\\257"\n    type: "Conv2D"\n  }\n}\n')
    _, ops = read_ge_graph(f)
    assert ops[0]["name"] == "\u5377\u79ef" and ops[0]["type"] == "Conv2D"


@pytest.mark.parametrize("content, says", [
    (b"\xff\xfe\x00garbage", "not UTF-8"),
    (b"[" * 100_000, "nests too deeply"),
])
def test_hostile_fusion_results_are_one_line_exit_2(tmp_path, content, says):
    """Found by attacking atc-check: binary bytes and a deeply nested array were internal errors (exit 3)."""
    p = tmp_path / "f.json"
    p.write_bytes(content)
    r = subprocess.run([sys.executable, "-m", "graphpass", "atc-check", str(_write_model(tmp_path)), "--fusion-result",
                        str(p)], capture_output=True, text=True)
    assert r.returncode == 2 and says in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_a_device_or_folder_is_not_read_as_a_fusion_result(tmp_path):
    for path, says in (("/dev/zero", "is a device"), (str(tmp_path), "is a folder")):
        r = subprocess.run([sys.executable, "-m", "graphpass", "atc-check", str(_write_model(tmp_path)),
                            "--fusion-result", path], capture_output=True, text=True)
        assert r.returncode == 2 and says in r.stderr, r.stderr


@pytest.mark.parametrize("manifest, says", [
    ("[1]", "not a JSON object"), ('{"switches": [1]}', "malformed 'switches'"), ('{"gears": "abc"}', "malformed 'gears'"),
    ('{"gears": [{"x": "1"}]}', "malformed 'gears'"), ('{"target": 5}', "malformed 'target'"),
    ('{"target": "nope"}', "unknown target 'nope'"),
])
def test_a_malformed_kit_manifest_is_a_usage_error(tmp_path, manifest, says):
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "graphpass_kit.json").write_text(manifest)
    fr = tmp_path / "f.json"
    fr.write_text("{}")
    with pytest.raises(UsageError, match=says):
        atc_check(str(_write_model(tmp_path)), fr, kit=kit)


def _write_model(tmp_path):
    p = tmp_path / "m.onnx"
    if not p.exists():
        onnx.save(_model(), p)
    return p
