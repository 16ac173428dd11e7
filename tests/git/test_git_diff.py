"""``git diff`` / ``git log -p`` through textconv, ``git difftool -x 'graphpass diff'`` and
``git diff`` with graphpass as the external diff driver, in a real repository."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest

import graphpass
from graphpass.testing import make_model
from onnx import helper

from gitrepo import conv_bn_model, graphpass_cmd, repo  # noqa: F401 - repo: the fixture


def _changed_lines(diff: str) -> list[str]:
    return [ln for ln in diff.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]


def _install(repo) -> None:
    repo.run(*graphpass_cmd("install-git"), check=True)


def test_fold_of_every_batchnorm_is_ten_lines_a_block(repo):
    """fold_batchnorm over the whole 300-node model: per folded block only its BN, the BN's
    parameters, the Conv (rewired, new weight and bias) and the weight hashes change."""
    model = conv_bn_model(blocks=100)
    assert len(model.graph.node) == 300
    onnx.save(model, repo.path / "model.onnx")
    _install(repo)
    repo.commit("add model")
    result = graphpass.optimize(str(repo.path / "model.onnx"), passes=["fold_batchnorm"], target="none")
    folded = result.model.to_proto()
    assert sum(n.op_type == "BatchNormalization" for n in folded.graph.node) == 0
    onnx.save(folded, repo.path / "model.onnx")
    repo.commit("fold batchnorm")
    diff = repo.git("diff", "HEAD~1", "HEAD", "--", "model.onnx").stdout
    assert "Binary files" not in diff
    changed = _changed_lines(diff)
    removed_bn = [ln for ln in changed if ln.startswith("-BatchNormalization")]
    assert len(removed_bn) == 100
    # every changed line is one of: a removed BN, a removed BN parameter, a changed conv weight /
    # added conv bias, a node line whose wiring changed because its BN went, the counts line
    allowed = re.compile(r"^[-+](BatchNormalization |init layer\d+\.bn\.|init |Conv |Relu |graph |producer )")
    assert [ln for ln in changed if not allowed.match(ln)] == []
    assert not [ln for ln in changed if ln.startswith(("+BatchNormalization", "-opset", "+opset", "-input", "+input",
                                                        "-output", "+output"))]
    # per folded block: -BN, -4 BN params, -/+ Conv, -/+ weight, +bias = 10 lines; plus the counts line
    assert len(changed) <= 10 * 100 + 2
    per_block = [ln for ln in changed if re.match(r"^[-+](\w+ /layer7/|init /?layer7[./])", ln)]
    assert any(ln.startswith("-BatchNormalization /layer7/bn/") for ln in per_block)
    assert any(ln.startswith("-init layer7.conv.weight") for ln in per_block)
    assert len(per_block) <= 10


def test_fold_of_a_few_batchnorms_is_a_few_dozen_lines(repo):
    """The issue's bar: a commit that folds BatchNorm into Conv (here 3 of the 100 blocks: the pass's
    result spliced into the original) in a 300-node model shows a few dozen lines naming the
    removed BNs and the changed weight hashes, and nothing else."""
    model = conv_bn_model(blocks=100)
    onnx.save(model, repo.path / "model.onnx")
    _install(repo)
    repo.commit("add model")
    result = graphpass.optimize(str(repo.path / "model.onnx"), passes=["fold_batchnorm"], target="none")
    folded = result.model.to_proto()
    # splice: blocks 0..2 from the folded model, the rest from the original (same names)
    keep = {f"/layer{i}/" for i in range(3)}

    def in_first(n):
        return any(n.name.startswith(k) for k in keep)

    fn = [n for n in folded.graph.node if in_first(n)]
    on = [n for n in model.graph.node if not in_first(n)]
    used = {x for n in fn + on for x in n.input}
    inits = {t.name: t for t in model.graph.initializer}
    inits.update({t.name: t for t in folded.graph.initializer if any(t.name.startswith(f"layer{i}.") or
                                                                     t.name in {x for n in fn for x in n.input}
                                                                     for i in range(3))})
    mixed = onnx.ModelProto()
    mixed.CopyFrom(model)
    del mixed.graph.node[:]
    mixed.graph.node.extend(fn + on)
    del mixed.graph.initializer[:]
    mixed.graph.initializer.extend(t for name, t in sorted(inits.items()) if name in used)
    onnx.checker.check_model(mixed, full_check=True)
    assert sum(n.op_type == "BatchNormalization" for n in mixed.graph.node) == 97
    onnx.save(mixed, repo.path / "model.onnx")
    repo.commit("fold 3 batchnorms")
    diff = repo.git("diff", "HEAD~1", "HEAD").stdout
    changed = _changed_lines(diff)
    assert 3 * 5 <= len(changed) <= 40, diff
    assert sorted(ln.split()[1] for ln in changed if ln.startswith("-BatchNormalization")) == [
        f"/layer{i}/bn/BatchNormalization" for i in range(3)]
    for i in range(3):
        assert any(ln.startswith(f"-init layer{i}.conv.weight ") for ln in changed)
    # nothing of layers 3..99 and no header line shows
    assert not [ln for ln in changed if re.search(r"layer([3-9]|\d\d)[./]", ln)]
    assert not [ln for ln in changed if ln[1:].startswith(("opset", "input", "output", "ir_version", "producer"))]


def _small(w_scale: float = 1.0, out_name: str = "y", mid: str = "t", shape=(1, 3, 4, 4)) -> onnx.ModelProto:
    w = (np.arange(9, dtype=np.float32).reshape(3, 3) * w_scale)
    nodes = [helper.make_node("Relu", ["x"], [mid], name="relu"),
             helper.make_node("MatMul", [mid, "w"], [out_name], name="mm")]
    return make_model(nodes, {"x": list(shape)}, {out_name: list(shape)}, {"w": w})


@pytest.mark.parametrize("change", ["weight", "rename", "shape"])
def test_git_diff_shows_exactly_the_change(repo, change):
    onnx.save(_small(), repo.path / "m.onnx")
    _install(repo)
    repo.commit("add")
    new = {"weight": _small(w_scale=2.0), "rename": _small(mid="relu_out"), "shape": _small(shape=(2, 3, 4, 3))}[change]
    onnx.save(new, repo.path / "m.onnx")
    diff = repo.git("diff").stdout
    changed = _changed_lines(diff)
    if change == "weight":
        assert [ln.split()[:3] for ln in changed] == [["-init", "w", "float32[3,3]"], ["+init", "w", "float32[3,3]"]]
    elif change == "rename":
        assert len(changed) == 4 and all(("relu_out" in ln) == ln.startswith("+") for ln in changed)
        # with canonical names (a textconv flag) a rename-only change diffs as nothing
        repo.git("config", "diff.onnx.textconv", "graphpass textconv --lenient --canonical-names")
        assert _changed_lines(repo.git("diff").stdout) == []
    else:
        assert changed and all(ln[1:].startswith(("input", "output", "Relu", "MatMul")) for ln in changed)
        assert any("float32[2,3,4,3]" in ln for ln in changed if ln.startswith("+input"))


def test_git_log_p_survives_a_blob_that_is_no_model(repo):
    (repo.path / "m.onnx").write_bytes(b"not a model at all")
    _install(repo)
    repo.commit("junk")
    onnx.save(_small(), repo.path / "m.onnx")
    repo.commit("real")
    p = repo.git("log", "-p", "--", "m.onnx")
    assert "# not an ONNX model" in p.stdout and "+MatMul mm" in p.stdout


def test_difftool_x_runs_graphpass_diff(repo):
    onnx.save(_small(), repo.path / "m.onnx")
    repo.commit("add")
    onnx.save(_small(w_scale=3.0), repo.path / "m.onnx")
    p = repo.git("difftool", "--no-prompt", "-x", "graphpass diff --target none", "--", "m.onnx")
    assert "weight w changed" in p.stdout, p.stdout + p.stderr


def test_ext_diff_driver_seven_arguments(repo):
    onnx.save(_small(), repo.path / "m.onnx")
    repo.commit("add")
    onnx.save(_small(w_scale=3.0), repo.path / "m.onnx")
    env = dict(repo.env, GIT_EXTERNAL_DIFF="graphpass diff --target none")
    import subprocess

    p = subprocess.run(["git", "diff", "--ext-diff"], cwd=repo.path, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "graphpass diff a/m.onnx b/m.onnx" in p.stdout and "weight w changed" in p.stdout
    # an added and a deleted model (/dev/null on one side)
    onnx.save(_small(out_name="z"), repo.path / "new.onnx")
    repo.git("add", "-N", "new.onnx")
    (repo.path / "m.onnx").unlink()
    p = subprocess.run(["git", "diff", "--ext-diff", "--no-renames"], cwd=repo.path, env=env, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    assert "graphpass diff new.onnx: added model" in p.stdout
    assert "graphpass diff m.onnx: deleted model" in p.stdout
    assert "+MatMul mm" in p.stdout and "-MatMul mm" in p.stdout
    # a rename: git passes nine arguments (the new path and the similarity message)
    repo.git("add", "-A")
    onnx.save(_small(), repo.path / "moved.onnx")
    repo.git("add", "-A")
    p = subprocess.run(["git", "diff", "--ext-diff", "-M", "--cached", "HEAD"], cwd=repo.path, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "m.onnx => moved.onnx" in p.stdout and "no changes" in p.stdout


def test_ext_diff_html_writes_the_page_without_a_browser(repo):
    onnx.save(_small(), repo.path / "m.onnx")
    repo.commit("add")
    onnx.save(_small(w_scale=3.0), repo.path / "m.onnx")
    import subprocess

    env = dict(repo.env, GIT_EXTERNAL_DIFF="graphpass diff --target none --format html")
    p = subprocess.run(["git", "diff", "--ext-diff"], cwd=repo.path, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    page = re.search(r"wrote (\S+\.html)", p.stdout)
    assert page, p.stdout
    text = open(page.group(1), encoding="utf-8").read()
    assert text.lstrip().lower().startswith("<!doctype html") and "m.onnx" in text
    import os

    os.unlink(page.group(1))


def test_ext_diff_bad_arguments_and_unreadable_sides(repo, tmp_path):
    onnx.save(_small(), tmp_path / "a.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\x00junk")
    # three positional arguments: neither form
    p = repo.run(*graphpass_cmd("diff", str(tmp_path / "a.onnx"), str(tmp_path / "a.onnx"), "x"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "seven arguments" in p.stderr
    # the seven-argument form never fails git's run on a file it cannot read
    p = repo.run(*graphpass_cmd("diff", "--target", "none", "m.onnx", str(tmp_path / "a.onnx"), "0" * 40, "100644",
                                str(tmp_path / "junk.onnx"), "1" * 40, "100644"))
    assert p.returncode == 0, p.stderr
    assert "structural diff not possible" in p.stdout and "# not an ONNX model" in p.stdout
    # the two-argument form on a bad model is an error as usual
    p = repo.run(*graphpass_cmd("diff", str(tmp_path / "a.onnx"), str(tmp_path / "junk.onnx")))
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_diff_driver_from_git_config(repo):
    """``diff.onnx.command`` (as the README shows): git calls graphpass for .onnx files only."""
    onnx.save(_small(), repo.path / "m.onnx")
    (repo.path / "notes.txt").write_text("a\n")
    _install(repo)
    repo.commit("add")
    onnx.save(_small(w_scale=3.0), repo.path / "m.onnx")
    (repo.path / "notes.txt").write_text("b\n")
    p = repo.git("-c", "diff.onnx.command=graphpass diff --target none", "diff")
    assert "graphpass diff a/m.onnx b/m.onnx" in p.stdout and "weight w changed" in p.stdout
    assert "-a\n+b" in p.stdout  # other files: git's own diff
