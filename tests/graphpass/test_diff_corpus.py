"""The review corpus (diff_corpus.py) through ``graphpass diff --exit-code``: 1 on every pair that
computes or stores other values, 0 on every pair that differs only in storage or order."""

import onnx
import pytest

from graphpass.cli import main
from graphpass.testing import ort_run

from diff_corpus import DIFFERENT, SAME, feeds_for


def _run_diff(capsys, a, b) -> tuple[int, str]:
    code = main(["diff", str(a), str(b), "--exit-code", "--target", "none"])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("case", DIFFERENT, ids=repr)
def test_diff_exit_code_is_1_on_every_pair_that_differs(case, tmp_path, capsys):
    a, b = case.build(tmp_path)
    code, out = _run_diff(capsys, a, b)
    assert code == 1, out
    assert "no changes" not in out


@pytest.mark.parametrize("case", SAME, ids=repr)
def test_diff_exit_code_is_0_on_every_pair_stored_differently(case, tmp_path, capsys):
    a, b = case.build(tmp_path)
    code, out = _run_diff(capsys, a, b)
    assert code == 0, out
    assert out.splitlines()[1] == "no changes"


@pytest.mark.parametrize("case", SAME, ids=repr)
def test_storage_only_pairs_really_compute_the_same(case, tmp_path):
    """The corpus itself: onnxruntime gives bitwise-equal outputs on both models of a 'same' pair."""
    a, b = case.build(tmp_path)
    ma, mb = onnx.load(str(a)), onnx.load(str(b))
    feeds = feeds_for(ma)
    ra, rb = ort_run(ma, feeds), ort_run(mb, {k: feeds[k] for k in feeds})
    assert list(ra) == list(rb)
    for k in ra:
        assert ra[k].dtype == rb[k].dtype and ra[k].shape == rb[k].shape
        assert ra[k].tobytes() == rb[k].tobytes(), k
