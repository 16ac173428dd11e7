"""The profile and op-info data files: complete, sourced, and refused with a clear error when not."""

import os
import re
from pathlib import Path

import onnx
import pytest

from graphpass.cost_model import load_op_table, load_profile
from graphpass.cost_model.op_info import parse_op_table
from graphpass.cost_model.profiles import DATA_DIR, PROFILE_FIELDS, known_targets
from graphpass.errors import UsageError


@pytest.mark.parametrize("target", known_targets())
def test_every_profile_value_has_unit_source_and_tag(target):
    p = load_profile(target)
    assert set(p.values) == set(PROFILE_FIELDS)
    for key, (src, tag) in p.sources.items():
        assert src and tag in "PDTE", key


def test_profiles_carry_the_published_numbers():
    a, b, p = load_profile("ascend910a"), load_profile("ascend910b2"), load_profile("ascend310p3")
    assert (a.ai_core_count, a.cube_freq_mhz, a.cube_fp32) == (32, 1000, False)
    assert (b.ai_core_count, b.cube_freq_mhz, b.cube_fp32) == (24, 1800, True)
    assert (p.ai_core_count, p.cube_freq_mhz) == (8, 1060)
    assert a.gm_bytes_per_us == pytest.approx(1.024e6)  # ~1.0 TB/s (D)


def test_op_table_covers_the_light_models_and_the_seed_ops():
    table = load_op_table()
    light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    ops = {n.op_type for f in os.listdir(light) if f.endswith(".onnx") for n in onnx.load(os.path.join(light, f)).graph.node}
    seeds = {"Conv", "ConvTranspose", "MatMul", "Gemm", "BatchNormalization", "Relu", "Sigmoid", "Concat", "Split", "Slice",
             "Gather", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "MaxPool", "AveragePool", "Softmax",
             "TopK", "Resize", "ReduceSum", "ReduceMean", "Cast", "NonZero", "NonMaxSuppression", "Loop", "If", "Scan"}
    missing = sorted(op for op in ops | seeds if table.lookup(op, "") is None)
    assert not missing
    assert table.lookup("ExtractImagePatches", "any.domain").ascend == "ExtractImagePatches"
    assert table.lookup("TransData", "graphpass.ascend").cost == "transdata"


def _broken_copy(tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = (DATA_DIR / name).read_text()
    assert old in text
    out = tmp_path / name
    out.write_text(text.replace(old, new, 1))
    return out


def test_profile_with_mistyped_field_names_file_and_key(tmp_path):
    bad = _broken_copy(tmp_path, "ascend910a.toml", "value = 32\n", 'value = "thirty-two"\n')
    with pytest.raises(UsageError, match=r"ascend910a.toml: key 'ai_core_count.value': expected a int, got 'thirty-two'"):
        load_profile(bad)
    missing = tmp_path / "gone.toml"
    missing.write_text(re.sub(r"\[l2_mib\][^\[]*", "", (DATA_DIR / "ascend910a.toml").read_text()))
    with pytest.raises(UsageError, match="gone.toml: key 'l2_mib'"):
        load_profile(missing)
    untagged = _broken_copy(tmp_path, "ascend910a.toml", 'tag = "E"', 'tag = "maybe"')
    with pytest.raises(UsageError, match="tag': expected one of P, D, T, E"):
        load_profile(untagged)


def test_op_table_with_mistyped_field_names_file_and_key(tmp_path):
    bad = _broken_copy(tmp_path, "op_info.toml", 'engine = "AICORE"', 'engine = "GPU"')
    with pytest.raises(UsageError, match=r"op_info.toml: key 'ops.Conv.engine': expected one of AICORE, AICPU, HOST, got 'GPU'"):
        parse_op_table(bad)
    typo = _broken_copy(tmp_path, "op_info.toml", "fp16_only = true", "fp16_onyl = true")
    with pytest.raises(UsageError, match="fp16_onyl': expected no such field"):
        parse_op_table(typo)
