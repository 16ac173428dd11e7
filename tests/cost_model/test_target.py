"""graphpass.Target: one object for a target's hardware facts, loaded from the data files."""

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import graphpass as gp
from graphpass.cost_model import (
    DEFAULT_TARGET,
    KNOWN_TARGETS,
    PRECISION_MODES,
    AscendCostModel,
    NullCostModel,
    Target,
    create,
    get_target,
    load_precision_modes,
    load_ub_fusion,
)
from graphpass.cost_model.profiles import DATA_DIR
from graphpass.passes.fusion_switch import read_switch_file, write_switch_file
from graphpass.passes.framework import PassContext, all_passes
from graphpass.ir import annotations as A
from graphpass.testing import make_model

ROOT = Path(__file__).resolve().parents[2]


def _conv_relu():
    return make_model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), helper.make_node("Relu", ["c"], ["y"], name="relu")],
                      {"x": [1, 16, 8, 8]}, {"y": [1, 16, 8, 8]}, initializers={"w": np.ones((16, 16, 1, 1), np.float32)})


# -- loading ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", KNOWN_TARGETS)
def test_every_shipped_target_loads_with_all_its_facts(name):
    t = Target.load(name)
    assert t.name == name and t.has_hardware and t.estimates
    assert t.profile.name == name and t.default_precision_mode in t.precision_mode_names()
    assert t.op_table.lookup("Conv", "").ascend and len(t.op_table) > 50
    assert isinstance(t.cost_model, AscendCostModel) and t.cost_model.target == name
    assert t.estimate(gp.load(_conv_relu())).total_us > 0
    assert repr(t) == f"Target({name!r})" and str(t) == name


def test_loading_is_cached_and_every_way_in_gives_the_same_object():
    t = Target.load("ascend910b2")
    assert get_target("ascend910b2") is t and Target.load(t) is t and Target.resolve("ascend910b2") is t
    assert create("ascend910b2") is t.cost_model
    assert gp.Target is Target
    assert Target.load() is get_target() is get_target(DEFAULT_TARGET)
    assert KNOWN_TARGETS[0] == DEFAULT_TARGET


def test_a_profile_file_path_loads_as_a_target(tmp_path):
    path = tmp_path / "mychip.toml"
    path.write_text((DATA_DIR / "ascend310p3.toml").read_text())
    t = Target.load(path)
    assert t.has_hardware and t.profile.ai_core_count == 8


@pytest.mark.parametrize("bad", ["ascend999", "", "Ascend910A", "op_info", "precision_modes", "ub_fusion"])
def test_an_unknown_target_is_one_clear_line_listing_the_known_ones(bad):
    with pytest.raises(gp.UsageError) as e:
        Target.load(bad)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"unknown target '{bad}'; known targets: ")
    assert all(k in msg for k in KNOWN_TARGETS) and msg.endswith(", none")
    with pytest.raises(gp.UsageError, match="unknown target"):
        PassContext(target=bad)
    with pytest.raises(gp.UsageError, match="unknown target"):
        gp.optimize(_conv_relu(), target=bad)


def test_a_target_of_the_wrong_type_is_a_usage_error():
    with pytest.raises(gp.UsageError, match="a target is a name .* not int"):
        Target.load(3)


def test_cli_unknown_target_is_exit_2_without_traceback(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(_conv_relu().SerializeToString())
    for argv in (["cost", str(model), "--target", "ascend999"], ["diff", str(model), str(model), "--target", "ascend999"],
                 ["optimize", str(model), "-o", str(tmp_path / "o.onnx"), "--target", "ascend999"]):
        r = subprocess.run([sys.executable, "-m", "graphpass", *argv], capture_output=True, text=True)
        assert r.returncode == 2, (argv, r.stderr)
        assert "Traceback" not in r.stderr and "ascend999" in r.stderr


# -- the none target ------------------------------------------------------------------------

def test_the_none_target_is_explicit_and_has_no_hardware_facts():
    t = Target.load("none")
    assert t is Target.none() is Target.resolve(None) is PassContext().target
    assert (t.name, t.profile, t.op_table, t.default_precision_mode) == ("none", None, None, None)
    assert not t.has_hardware and not t.estimates and isinstance(t.cost_model, NullCostModel)
    graph = gp.load(_conv_relu()).graph
    assert t.estimate(graph).total_us is None
    for ask in (lambda: t.format_oracle(graph), lambda: t.placement(graph)):
        with pytest.raises(gp.UsageError, match=r"needs a hardware target and the target is 'none'"):
            ask()
    # the toolchain's vocabulary belongs to no chip: the none target knows it too
    assert t.precision_mode_names() == PRECISION_MODES and t.ub_fusion == get_target().ub_fusion


def test_optimize_under_target_none_skips_the_hardware_passes_and_says_why():
    res = gp.optimize(_conv_relu(), target="none")
    ran = {r.name for r in res.report.passes}
    needs = {n for n, c in all_passes().items() if c.needs_target}
    assert needs == {"propagate_layout", "place_and_sink", "lower_reflect_pad", "lower_conv1d_to_conv2d", "split_avgpool",
                     "split_large_kernel_conv", "transpose_wide_conv", "gather_to_split", "narrow_int64",
                     "split_qkv_matmul", "resize_to_nearest"}
    assert not ran & needs
    for name in needs - {"resize_to_nearest"}:  # default off: not in the run at all
        assert f"{name} skipped: needs a hardware target (target 'none' has none)" in res.report.notes
    assert res.report.target == "none" and res.report.cost_before_us is None
    assert not any(A.get_engine(n) or A.get_format(t) for n in res.graph.nodes for t in n.outputs)
    # the default target runs them (those whose ops the model holds: a Conv + Relu model has
    # no AveragePool, Pad, Gather or MatMul for split_avgpool, lower_reflect_pad, gather_to_split,
    # split_qkv_matmul; resize_to_nearest is default off)
    full = gp.optimize(_conv_relu())
    absent = {"split_avgpool", "lower_reflect_pad", "gather_to_split", "split_qkv_matmul", "resize_to_nearest"}
    assert needs - absent <= {r.name for r in full.report.passes} and full.report.target == DEFAULT_TARGET
    assert not absent & {r.name for r in full.report.passes}
    assert not any("skipped" in n for n in full.report.notes)


def test_a_disabled_hardware_pass_is_not_reported_as_unavailable():
    res = gp.optimize(_conv_relu(), target="none", disable=["place_and_sink"])
    assert "place_and_sink" in res.report.skipped
    assert not any(n.startswith("place_and_sink skipped") for n in res.report.notes)


# -- the context --------------------------------------------------------------------------------

def test_the_context_resolves_a_name_once_and_its_cost_model_is_the_targets():
    ctx = PassContext(target="ascend310p3")
    assert ctx.target is get_target("ascend310p3") and ctx.cost_model is ctx.target.cost_model
    ctx.target = "ascend910b2"
    assert ctx.target is get_target("ascend910b2") and ctx.cost_model is ctx.target.cost_model
    ctx.target = None
    assert ctx.target is Target.none() and not ctx.target.estimates
    assert dataclasses.replace(PassContext(target="ascend910b2")).target is get_target("ascend910b2")


def test_a_cost_model_given_to_the_context_replaces_only_the_estimates():
    null = NullCostModel("test")
    ctx = PassContext(target="ascend910b2", cost_model=null)
    assert ctx.cost_model is null and ctx.target.cost_model is null and not ctx.target.estimates
    assert ctx.target.profile is get_target("ascend910b2").profile and ctx.target.has_hardware
    assert get_target("ascend910b2").estimates  # the cached target is untouched
    graph = gp.load(_conv_relu()).graph
    assert ctx.target.placement(graph)[0]  # placement still comes from the hardware facts


# -- the vocabulary in data files ---------------------------------------------------------------

def test_precision_modes_come_from_the_data_file_with_their_sources():
    modes = load_precision_modes()
    assert tuple(m.name for m in modes) == PRECISION_MODES == (
        "force_fp16", "allow_fp32_to_fp16", "allow_mix_precision", "allow_mix_precision_bf16", "allow_fp32_to_bf16",
        "must_keep_origin_dtype", "force_fp32")
    assert all(m.src and m.tag == "P" and m.summary for m in modes)
    from graphpass.passes.precision.mixed_precision import MODES

    assert MODES == get_target().precision_mode_names(mixed_precision=True) == PRECISION_MODES[:6]
    assert get_target().precision_mode_names(mixed_precision=True, lowers=True) == PRECISION_MODES[:3]


def test_ub_fusion_names_come_from_the_data_file():
    ub = load_ub_fusion()
    old = {"ATbeMatMulElemwiseFusionPass", "TbeConv2DReluv2Pass", "TbeEltwiseFusionPass",
           "TbeConvBnreduceFusionPass", "TbeBatchMatmulElementWiseFusionPass"}
    assert old <= ub and "ConvBatchnormFusionPass" not in ub


def test_the_switch_file_sections_follow_the_targets_ub_fusion_names(tmp_path):
    path = write_switch_file(tmp_path / "s.json", {})
    assert '"TbeConv2DReluv2Pass"' in path.read_text().split('"UBFusion"')[1]
    other = dataclasses.replace(get_target(), ub_fusion=frozenset())
    path = write_switch_file(tmp_path / "t.json", {}, target=other)
    assert '"TbeConv2DReluv2Pass"' in path.read_text().split('"UBFusion"')[0]
    (tmp_path / "u.json").write_text('{"Switch": {"UBFusion": {"ALL": "off"}}}')
    assert read_switch_file(tmp_path / "u.json")["fuse_conv_activation"] is False
    assert "fuse_conv_activation" not in read_switch_file(tmp_path / "u.json", target=other)


@pytest.mark.parametrize("name, old, new, message", [
    ("precision_modes.toml", 'src = "ATC-PM"\n', "", r"precision_modes.toml: key 'force_fp16.src': expected a non-empty string"),
    ("precision_modes.toml", "lowers = true\n", 'lowers = "yes"\n', r"key 'force_fp16.lowers': expected true or false, got 'yes'"),
    ("precision_modes.toml", 'tag = "P"\n', 'tag = "P"\nlower = true\n', r"key 'force_fp16.lower': expected no such field"),
    ("ub_fusion.toml", 'tag = "P"\n', 'tag = "X"\n', r"ub_fusion.toml: key 'TbeConvBnreduceFusionPass.tag': expected one of P, D, T, E"),
    ("ub_fusion.toml", "[TbeEltwiseFusionPass]", "[TbeEltwiseFusionPass", r"ub_fusion.toml: not valid TOML"),
])
def test_a_malformed_vocabulary_file_names_file_and_key(tmp_path, name, old, new, message):
    text = (DATA_DIR / name).read_text()
    assert old in text
    bad = tmp_path / name
    bad.write_text(text.replace(old, new, 1))
    load = load_precision_modes if name.startswith("precision") else load_ub_fusion
    with pytest.raises(gp.UsageError, match=message):
        load(bad)


# -- one definition of the default ---------------------------------------------------------------

def test_the_default_target_name_is_written_once_in_python():
    name = DEFAULT_TARGET
    hits = [f"{p.relative_to(ROOT)}:{i}"
            for folder in ("graphpass", "passes", "cost_model")
            for p in sorted((ROOT / folder).rglob("*.py"))
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if name in line]
    assert hits == ["cost_model/target.py:" + str(_definition_line())], hits


def _definition_line() -> int:
    lines = (ROOT / "cost_model" / "target.py").read_text(encoding="utf-8").splitlines()
    found = [i for i, line in enumerate(lines, 1) if re.match(r'^DEFAULT_TARGET = "\w+"$', line)]
    assert len(found) == 1
    return found[0]


# -- needs_target on a user's pass ---------------------------------------------------------------

class _CountEngines(gp.Pass):
    """A user's pass that reads the target's op table (not registered)."""

    name = "test_count_engines"
    summary = "count AI CPU ops"
    kind = gp.PassKind.ANALYSIS
    promise = gp.passes.framework.pass_base.EXACT
    needs_target = True

    def run(self, graph, ctx):
        aicpu = sum(1 for n in graph.nodes if (i := ctx.target.op_table.lookup(n.op, n.domain)) and i.engine == "AICPU")
        return gp.PassResult(False, {"aicpu": aicpu})


def test_a_users_pass_that_needs_a_target_raises_without_one_and_is_skipped_by_the_manager():
    graph = gp.load(_conv_relu()).graph
    with pytest.raises(gp.UsageError, match="^pass 'test_count_engines' needs a hardware target"):
        _CountEngines().apply(graph, PassContext())
    assert _CountEngines().apply(graph, PassContext(target="ascend910b2")).stats == {"aicpu": 0}
    run = gp.PassManager([_CountEngines, "eliminate_dead_nodes"])(graph, PassContext(target="none"))
    assert run.unavailable == {"test_count_engines": "needs a hardware target (target 'none' has none)"}
    assert [r.name for r in run.records] == ["eliminate_dead_nodes"]
    run = gp.PassManager([_CountEngines])(graph, PassContext(target="ascend910b2"))
    assert not run.unavailable and [r.name for r in run.records] == ["test_count_engines"]


@pytest.mark.parametrize("target", ["ascend910b2", "none"])
def test_a_misspelled_estimate_option_is_a_type_error(target):
    # gp.estimate(m, precison_mode=...) estimated with the profile's default mode without a word
    with pytest.raises(TypeError, match=r"precison_mode.*options: precision_mode, iterations_per_loop, loop_trips, input_shapes"):
        gp.estimate(_conv_relu(), target=target, precison_mode="force_fp16")
    with pytest.raises(TypeError, match="loop_trip"):
        Target.load(target).estimate(_conv_relu(), loop_trip=3)
