"""Ordering is declared data (Pass.runs_after / runs_before) that pipelines.build checks."""

import pytest
from onnx import helper

import graphpass as gp
from graphpass.passes import pipelines
from graphpass.errors import UsageError
from graphpass.passes.framework import PassKind
from graphpass.testing import make_model


def test_every_built_in_pipeline_keeps_the_declared_order():
    everything = set(gp.all_passes())
    for name, names in pipelines.PIPELINES.items():
        pipelines.check_order(list(names))
        built = pipelines.build(name, enable=everything)  # every other pass added, in the declared order
        assert set(built) == everything and [n for n in built if n in names] == list(names)


def test_declared_needs_are_data_on_the_passes():
    P = gp.all_passes()
    assert P["fuse_conv_bias"].runs_after == ("fold_batchnorm",)
    assert P["eliminate_transdata"].runs_after == ("propagate_layout",)
    assert set(P["propagate_layout"].runs_after) == {PassKind.LOWERING, PassKind.FUSION}
    assert PassKind.FUSION in P["lower_dynamic_topk"].runs_before
    assert set(P["place_and_sink"].runs_after) == {PassKind.LOWERING, PassKind.FUSION, PassKind.LAYOUT}


def test_a_pass_before_what_it_needs_is_a_usage_error():
    with pytest.raises(UsageError, match=r"'fuse_conv_bias' must run after 'fold_batchnorm', but comes before "
                                         r"'fold_batchnorm'; move it later"):
        pipelines.build(passes=["fuse_conv_bias", "fold_batchnorm"])
    with pytest.raises(UsageError, match=r"'place_and_sink' must run after every fusion pass, but comes before "
                                         r"'fuse_gelu'"):
        pipelines.build(passes=["place_and_sink", "fuse_gelu"])
    with pytest.raises(UsageError, match=r"'lower_dynamic_topk' must run before every fusion pass, but comes "
                                         r"after 'fuse_gelu'; move it earlier"):
        pipelines.build(passes=["fuse_gelu", "lower_dynamic_topk"])
    with pytest.raises(UsageError, match="'propagate_layout' must run after every lowering pass"):
        pipelines.build(passes=["propagate_layout", "lower_dynamic_topk"])  # an explicit list is never reordered


def test_enabled_passes_join_where_their_order_puts_them():
    assert pipelines.build("layout", enable={"lower_dynamic_topk"}) == [
        "lower_dynamic_topk", "propagate_layout", "eliminate_transdata"]
    assert pipelines.build("cleanup", enable={"mixed_precision"})[-1] == "mixed_precision"  # no need: the end
    assert pipelines.build(enable={"mixed_precision"}) == list(pipelines.PIPELINES["default"]) + ["mixed_precision"]


def test_absent_passes_impose_nothing_and_repeats_are_judged_first():
    assert pipelines.build(passes=["fuse_conv_bias"]) == ["fuse_conv_bias"]
    assert pipelines.build(passes=["fold_batchnorm", "fuse_conv_bias", "fold_batchnorm"])
    assert pipelines.build(passes=["propagate_layout", "eliminate_transdata", "eliminate_identity"])


def test_optimize_and_the_cli_refuse_a_wrong_order(tmp_path, capsys):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2]}, {"y": [2]})
    with pytest.raises(UsageError, match="must run after 'fold_batchnorm'"):
        gp.optimize(model, passes=["fuse_conv_bias", "fold_batchnorm"])
    import onnx
    from graphpass.cli import main

    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    assert main(["optimize", str(src), "-o", str(tmp_path / "o.onnx"), "--passes", "fuse_conv_bias,fold_batchnorm"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "must run after 'fold_batchnorm'" in err
    assert not (tmp_path / "o.onnx").exists()
