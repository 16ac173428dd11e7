import json

import onnx
import pytest

from graphpass.cli import main
from graphpass.errors import UsageError
from graphpass.passes.fusion_switch import fusion_passes, read_switch_file, write_switch_file


def test_both_formats_round_trip(tmp_path):
    settings = {n: (i % 2 == 0) for i, n in enumerate(sorted(fusion_passes()))}
    for name in ("s.json", "s.cfg"):
        write_switch_file(tmp_path / name, settings)
        assert read_switch_file(tmp_path / name) == settings
    doc = json.loads((tmp_path / "s.json").read_text())
    assert "ConvBatchnormFusionPass" in doc["Switch"]["GraphFusion"]
    assert "ATbeMatMulElemwiseFusionPass" in doc["Switch"]["UBFusion"]


def test_all_then_override_and_unknown_ascend_names_warn(tmp_path, caplog):
    f = tmp_path / "sw.json"
    f.write_text(json.dumps({"Switch": {"GraphFusion": {"ALL": "off", "AABiasaddConvFusion": "on", "SoftmaxFusionPass": "on"}}}))
    got = read_switch_file(f)
    assert got["fuse_conv_bias"] is True and got["fold_batchnorm"] is False and got["fuse_channel_shuffle"] is False
    assert "fuse_matmul_add" not in got  # a UB fusion: GraphFusion.ALL does not touch it
    assert "SoftmaxFusionPass" in caplog.text


@pytest.mark.parametrize("text, message", [
    ("ConvBatchnormFusionPass off\n", "line 1: expected PassName:on|off"),
    ("# comment\nConvBatchnormFusionPass:maybe\n", "line 2: expected 'on' or 'off'"),
    ("fold_batchnorms:off\n", "unknown pass 'fold_batchnorms'; known fusions"),
    ('{"Switch": {"GraphFusion": {"ALL": 1}}}', "Switch.GraphFusion.ALL: expected 'on' or 'off'"),
    ('{"Switch": {"Fusion": {}}}', "Switch.Fusion: expected GraphFusion or UBFusion"),
    ('{"Switch": ', "line 1: not valid JSON"),
])
def test_malformed_files_name_the_line_or_json_path(tmp_path, text, message):
    f = tmp_path / "sw"
    f.write_text(text)
    with pytest.raises(UsageError, match=message):
        read_switch_file(f)


def test_cli_fusion_off_leaves_no_fused_node(light_path, tmp_path, capsys):
    out = tmp_path / "o.onnx"
    assert main(["optimize", light_path("light_shufflenet.onnx"), "-o", str(out), "--fusion-off", "-q"]) == 0
    m = onnx.load(out)
    kinds = {n.op_type for n in m.graph.node}
    assert "BatchNormalization" in kinds and "Transpose" in kinds and "Gather" not in kinds
    assert not any(p.key == "graphpass.pass" for n in m.graph.node for p in n.metadata_props)


def test_cli_fusion_switch_file_and_bad_file(light_path, tmp_path, capsys):
    sw = tmp_path / "sw.cfg"
    sw.write_text("ConvBatchnormFusionPass:off\n")
    out = tmp_path / "o.onnx"
    assert main(["optimize", light_path("light_resnet50.onnx"), "-o", str(out), "--fusion-switch", str(sw), "-q"]) == 0
    assert any(n.op_type == "BatchNormalization" for n in onnx.load(out).graph.node)
    sw.write_text("not a switch\n")
    assert main(["optimize", light_path("light_resnet50.onnx"), "-o", str(tmp_path / "x.onnx"), "--fusion-switch", str(sw)]) == 2
    assert "line 1" in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists()


def test_cli_explain_prints_refusals(tmp_path, capsys):
    import numpy as np
    from onnx import helper

    from graphpass.testing import make_model

    model = make_model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), helper.make_node("Add", ["c", "z"], ["y"])],
                       {"x": [1, 3, 8, 8], "z": [1, 6, 6, 6]}, {"y": [1, 6, 6, 6]},
                       initializers={"w": np.zeros((6, 3, 3, 3), np.float32)})
    src = tmp_path / "m.onnx"
    src.write_bytes(model.SerializeToString())
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--explain", "fuse_conv_bias"]) == 0
    assert "explain: fuse_conv_bias: Add '': addend 'z' is not a constant" in capsys.readouterr().out


def test_cli_write_fusion_switch_from_settings(tmp_path, capsys):
    f = tmp_path / "atc.json"
    assert main(["passes", "--write-fusion-switch", str(f), "--fusion-off", "--enable", "fuse_conv_bias"]) == 0
    doc = json.loads(f.read_text())["Switch"]
    assert doc["GraphFusion"]["AABiasaddConvFusion"] == "on" and doc["GraphFusion"]["ConvBatchnormFusionPass"] == "off"
    assert main(["passes", "--write-fusion-switch", str(f), "--disable", "no_such"]) == 2
