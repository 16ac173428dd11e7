"""The pull-request comment: summary table first, details collapsed, under the size limit; the
example GitHub Actions workflow's diff step run as the runner would run it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import helper

import graphpass
from graphpass.gitint import COMMENT_LIMIT, pr_comment
from graphpass.testing import make_model

from gitrepo import Repo, conv_bn_model, graphpass_cmd, repo  # noqa: F401 - repo: the fixture

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "examples" / "ci" / "graphpass-review.yml"


def _pr_repo(repo) -> None:
    """main: three models; branch pr: one folded, one with a new output shape, one removed, one added."""
    model = conv_bn_model(blocks=10)
    onnx.save(model, repo.path / "net.onnx")
    small = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [2, 3]}, {"y": [2, 3]})
    onnx.save(small, repo.path / "head.onnx")
    onnx.save(small, repo.path / "old.onnx")
    (repo.path / "README").write_text("models\n")
    repo.commit("models")
    repo.git("checkout", "-q", "-b", "pr")
    folded = graphpass.optimize(model, passes=["fold_batchnorm"], target="none").model.to_proto()
    onnx.save(folded, repo.path / "net.onnx")
    wider = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": [4, 3]}, {"y": [4, 3]})
    onnx.save(wider, repo.path / "head.onnx")
    (repo.path / "old.onnx").unlink()
    onnx.save(small, repo.path / "added.onnx")
    (repo.path / "README").write_text("models, folded\n")
    repo.commit("fold")


def test_comment_opens_with_the_summary_table_and_collapses_details(repo):
    _pr_repo(repo)
    comment, full = pr_comment("main", "pr", cwd=repo.path)
    assert comment == full and len(comment) < COMMENT_LIMIT
    lines = comment.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("|"))
    end = next(i for i in range(first, len(lines)) if not lines[i].startswith("|"))
    table = lines[first:end]
    assert lines.index(table[0]) < min(i for i, ln in enumerate(lines) if ln.startswith("<details>"))
    assert table[0].startswith("| model | change | nodes | ops changed | outputs | est. µs ascend")
    rows = {re.match(r"\| `([^`]+)`", ln).group(1): ln for ln in table[2:]}
    assert set(rows) == {"added.onnx", "head.onnx", "net.onnx", "old.onnx"}  # README is no model
    assert "| 30 → 20 |" in rows["net.onnx"] and "BatchNormalization 10→0" in rows["net.onnx"]
    assert "| unchanged |" in rows["net.onnx"]
    assert "1 changed" in rows["head.onnx"]  # the output's shape
    assert "| added |" in rows["added.onnx"] and "| removed |" in rows["old.onnx"]
    assert re.search(r"\d[\d,.]* → [\d,.]+ \([-+]", rows["net.onnx"])  # estimated cost per target
    assert comment.count("<details>") == comment.count("</details>") >= 2


def test_every_table_row_has_the_header_s_cells_with_and_without_targets(repo):
    """Under --target none the table has no cost column: a row had one empty cell more than its
    header (a table GitHub renders wrong)."""
    _pr_repo(repo)
    for targets in (["none"], None, ["ascend910a", "ascend310p3"]):
        comment, _ = pr_comment("main", "pr", targets=targets, cwd=repo.path)
        table = [ln for ln in comment.splitlines() if ln.startswith("|")]
        cells = {ln.count("|") for ln in table[:6]}
        assert len(cells) == 1, (targets, table[:6])
        assert ("est. µs" in table[0]) == (targets != ["none"])


def test_over_the_limit_is_summarised_and_the_full_diff_is_a_file(repo, tmp_path):
    _pr_repo(repo)
    out, full = tmp_path / "c.md", tmp_path / "full.md"
    p = repo.run(*graphpass_cmd("pr-comment", "--base", "main", "--head", "pr", "--max-chars", "1500",
                                "-o", str(out), "--full", str(full)))
    assert p.returncode == 0, p.stderr
    comment, whole = out.read_text(), full.read_text()
    assert len(comment) <= 1500 < len(whole)
    assert "graphpass-diff-full.md" in comment and comment.lstrip().startswith("## graphpass: model changes")
    assert "| `net.onnx` |" in comment  # the summary table is kept whole
    assert "BatchNormalization" in whole and whole.count("<details>") >= 2


def test_bad_revision_is_one_line_exit_2(repo):
    _pr_repo(repo)
    p = repo.run(*graphpass_cmd("pr-comment", "--base", "no-such-branch"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_workflow_example_diff_step_runs(tmp_path):
    """Run the workflow's diff step as the runner would: in a clone checked out at the PR head,
    with the step's env (``${{ github.base_ref }}`` = main) and its ``run`` in bash."""
    flow = yaml.safe_load(WORKFLOW.read_text())
    assert flow[True if True in flow else "on"]["pull_request"]["paths"] == ["**.onnx"]
    steps = flow["jobs"]["model-diff"]["steps"]
    step = next(s for s in steps if s.get("id") == "diff")
    assert any(s.get("uses", "").startswith("actions/upload-artifact") and s["with"]["path"] == "graphpass-diff-full.md"
               for s in steps)
    assert any("gh pr comment" in s.get("run", "") and "graphpass-comment.md" in s["run"] for s in steps)
    upstream = Repo(tmp_path / "upstream", tmp_path / "home")
    _pr_repo(upstream)
    ci = tmp_path / "ci"
    upstream.git("clone", "-q", str(upstream.path), str(ci))
    subprocess.run(["git", "checkout", "-q", "pr"], cwd=ci, env=upstream.env, check=True)
    env = dict(upstream.env)
    for k, v in step.get("env", {}).items():
        env[k] = v.replace("${{ github.base_ref }}", "main")
    p = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=ci, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    comment = (ci / "graphpass-comment.md").read_text()
    assert comment.startswith("## graphpass: model changes") and len(comment) < COMMENT_LIMIT
    assert "(origin/main → HEAD)" in comment and "| `net.onnx` | modified |" in comment
    assert (ci / "graphpass-diff-full.md").read_text() == comment
