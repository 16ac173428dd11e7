"""The CANN release data (cost_model/data/cann_atc.toml, cann_onnx_ops.toml) and its reader."""

import pytest

from graphpass.cost_model import cann
from graphpass.errors import UsageError


def test_releases_cover_a_6x_7x_and_the_newest_with_their_documented_opset_ranges():
    rel = cann.releases()
    assert {"6.0", "7.0"} <= set(rel)
    assert rel["6.0"].opset == (9, 13) and rel["7.0"].opset == (9, 18)
    assert cann.release().name == cann.NEWEST == max(rel, key=lambda n: tuple(map(int, n.split("."))))
    for r in rel.values():
        assert r.src and r.tag in "PDE"
        assert r.ops and all(min(v) >= r.opset[0] and max(v) <= r.opset[1] for v in r.ops.values())


def test_every_option_has_its_document_and_a_kind():
    for r in cann.releases().values():
        for o in r.options.values():
            assert o.src and o.tag in "PDE" and r.name in o.versions
            if o.kind == "enum":
                assert o.values


def test_precision_mode_v2_is_not_an_option_of_6_0():
    assert cann.release("6.0").option("precision_mode_v2") is None
    assert cann.release("7.0").option("precision_mode_v2") is not None


def test_version_names_and_an_unknown_one():
    assert cann.release("7").name == "7.0" and cann.release("7.0.0").name == "7.0"
    with pytest.raises(UsageError, match="known: 6.0"):
        cann.release("3.3")


def test_op_list_answers_by_the_models_opset():
    r6, r7 = cann.release("6.0"), cann.release("7.0")
    assert r6.supports("Conv", 13) and not r6.supports("Conv", 14)   # 6.0 stops at v13
    assert r7.supports("Conv", 18) and not r7.supports("Conv", 19)
    assert not r7.supports("Loop", 17)                                 # no parser registers Loop
    assert r7.supports("Constant", 17)                                 # the parser's own
    assert cann.soc_version("ascend910b2") == "Ascend910B2" and cann.soc_version("nope") is None


def _resize(tmp=None, **attrs):
    import numpy as np
    from onnx import helper

    from graphpass.testing import make_model

    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], name="rs", **attrs)]
    return make_model(nodes, {"x": [1, 1, 2, 2]}, {"y": [1, 1, 4, 4]}, {"scales": np.float32([1, 1, 2, 2])})


def test_documented_attribute_constraints_refuse_by_name_and_release():
    from graphpass.atc import check_ops

    r7, r9 = cann.release("7.0"), cann.release("9.2")
    assert check_ops(_resize(mode="linear"), r9).refused == []
    cubic = check_ops(_resize(mode="cubic"), r7).refused
    assert [(x.node, x.op_type) for x in cubic] == [("rs", "Resize")] and "mode=cubic" in cubic[0].reason
    # nearest with ONNX's default nearest_mode (round_prefer_floor): only 9.2's page forbids it
    assert check_ops(_resize(), r7).refused == []
    assert "nearest_mode=round_prefer_floor" in check_ops(_resize(), r9).refused[0].reason
    assert check_ops(_resize(nearest_mode="round_prefer_ceil"), r9).refused == []


def test_a_resize_whose_scales_are_computed_is_refused():
    from onnx import helper

    from graphpass.atc import check_ops
    from graphpass.testing import make_model

    nodes = [helper.make_node("Resize", ["x", "", "s"], ["y"], name="rs", mode="linear")]
    m = make_model(nodes, {"x": [1, 1, 2, 2], "s": [4]}, {"y": [1, 1, 4, 4]})
    refused = check_ops(m, cann.release("7.0")).refused
    assert len(refused) == 1 and "input 2 (s) must be a constant" in refused[0].reason
