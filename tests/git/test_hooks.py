"""The pre-commit hooks of ``.pre-commit-hooks.yaml``, run as pre-commit runs them (entry + args +
the staged files its ``files`` pattern selects), and once through pre-commit itself when installed."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import helper

import graphpass
from graphpass.testing import make_model

from gitrepo import BIN, conv_bn_model, repo  # noqa: F401 - repo: the fixture

ROOT = Path(__file__).resolve().parents[2]
HOOKS = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}


def _model(scale: float = 1.0, opset: int = 17) -> onnx.ModelProto:
    w = np.arange(9, dtype=np.float32).reshape(3, 3) * scale
    return make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [3, 3]}, {"y": [3, 3]}, {"w": w},
                      opset=opset)


def run_hook(repo, hook_id: str, args: list[str] = ()) -> subprocess.CompletedProcess:
    """What pre-commit does for a hook: the staged files matching ``files``, appended to entry + args."""
    hook = HOOKS[hook_id]
    staged = repo.git("diff", "--cached", "--name-only", "--diff-filter=ACMR").stdout.split()
    files = [f for f in staged if re.search(hook["files"], f)]
    if not files:
        return subprocess.CompletedProcess([], 0, "", "")  # pre-commit skips a hook with no files
    cmd = shlex.split(hook["entry"]) + list(args or hook.get("args", [])) + files
    return repo.run(*cmd)


def test_hooks_file_declares_the_two_hooks():
    assert set(HOOKS) == {"graphpass-check-model", "graphpass-verify-changed"}
    for h in HOOKS.values():
        assert h["language"] == "python" and h["entry"].split()[0] == "graphpass"
        assert re.search(h["files"], "models/a.onnx") and not re.search(h["files"], "a.onnx.txt")


def test_check_model_hook(repo):
    onnx.save(_model(), repo.path / "good.onnx")
    (repo.path / "notes.txt").write_text("not a model")
    repo.git("add", "-A")
    p = run_hook(repo, "graphpass-check-model")
    assert p.returncode == 0 and p.stdout == "", p.stdout + p.stderr
    p = run_hook(repo, "graphpass-check-model", ["--max-size", "100"])
    assert p.returncode == 1 and "over the limit of 100" in p.stdout
    p = run_hook(repo, "graphpass-check-model", ["--max-opset", "13"])
    assert p.returncode == 1 and "opset 17 is above 13" in p.stdout
    p = run_hook(repo, "graphpass-check-model", ["--external-data", "require"])
    assert p.returncode == 0  # a 36-byte weight need not be external
    (repo.path / "junk.onnx").write_bytes(b"\x00\x01junk")
    repo.git("add", "junk.onnx")
    p = run_hook(repo, "graphpass-check-model")
    assert p.returncode == 1 and "junk.onnx: not an ONNX model" in p.stdout and "Traceback" not in p.stderr


def test_check_model_hook_external_data(repo):
    big = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [64, 64]}, {"y": [64, 64]},
                     {"w": np.ones((64, 64), np.float32)})
    onnx.save(big, repo.path / "inline.onnx")
    onnx.save(big, repo.path / "ext.onnx", save_as_external_data=True, location="ext.data", size_threshold=0)
    repo.git("add", "-A")
    assert run_hook(repo, "graphpass-check-model").returncode == 0
    p = run_hook(repo, "graphpass-check-model", ["--external-data", "forbid"])
    assert p.returncode == 1 and "ext.onnx: 1 tensors in external data" in p.stdout
    p = run_hook(repo, "graphpass-check-model", ["--external-data", "require"])
    assert p.returncode == 1 and "inline.onnx: 1 weights over 1 KiB stored inline" in p.stdout
    (repo.path / "ext.data").unlink()
    p = run_hook(repo, "graphpass-check-model")
    assert p.returncode == 1 and "external data file 'ext.data'" in p.stdout and "missing" in p.stdout


def test_verify_changed_hook(repo):
    model = conv_bn_model(blocks=4)
    onnx.save(model, repo.path / "m.onnx")
    repo.commit("add")
    # without --reference the hook is configured to do nothing
    onnx.save(_model(), repo.path / "m.onnx")
    repo.git("add", "m.onnx")
    p = run_hook(repo, "graphpass-verify-changed")
    assert p.returncode == 0 and "no --reference configured" in p.stdout
    # an optimization that keeps the outputs: passes
    folded = graphpass.optimize(model, passes=["fold_batchnorm"], target="none").model.to_proto()
    onnx.save(folded, repo.path / "m.onnx")
    repo.git("add", "m.onnx")
    p = run_hook(repo, "graphpass-verify-changed", ["--reference", "HEAD"])
    assert p.returncode == 0 and "outputs match HEAD" in p.stdout, p.stdout + p.stderr
    # a change of a weight: fails, naming the model
    broken = onnx.ModelProto()
    broken.CopyFrom(model)
    w = next(t for t in broken.graph.initializer if t.name == "layer2.conv.weight")
    w.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(w) * 1.5, w.name))
    onnx.save(broken, repo.path / "m.onnx")
    repo.git("add", "m.onnx")
    p = run_hook(repo, "graphpass-verify-changed", ["--reference", "HEAD"])
    assert p.returncode == 1 and "m.onnx: 1 of 1 outputs differ from HEAD" in p.stdout
    # a new model: nothing to verify against
    onnx.save(_model(), repo.path / "new.onnx")
    repo.git("add", "new.onnx")
    repo.git("checkout", "HEAD", "--", "m.onnx")
    p = run_hook(repo, "graphpass-verify-changed", ["--reference", "HEAD"])
    assert p.returncode == 0 and "new.onnx: new at HEAD" in p.stdout


def test_verify_changed_takes_external_data_from_the_revision(repo):
    model = conv_bn_model(blocks=2, channels=16)
    onnx.save(model, repo.path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    repo.commit("add")
    folded = graphpass.optimize(str(repo.path / "m.onnx"), passes=["fold_batchnorm"], target="none").model.to_proto()
    onnx.save(folded, repo.path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    repo.git("add", "-A")
    p = run_hook(repo, "graphpass-verify-changed", ["--reference", "HEAD"])
    assert p.returncode == 0 and "outputs match HEAD" in p.stdout, p.stdout + p.stderr


@pytest.mark.skipif(shutil.which("pre-commit", path=BIN) is None and shutil.which("pre-commit") is None,
                    reason="pre-commit is not installed")
def test_hooks_through_pre_commit(repo):
    """pre-commit itself, with the hooks as local hooks (language: system: the graphpass on PATH,
    so pre-commit need not build an environment from the network)."""
    hooks = []
    for h in HOOKS.values():
        local = {k: v for k, v in h.items() if k in ("id", "name", "entry", "files", "types")}
        local["language"] = "system"
        if h["id"] == "graphpass-verify-changed":
            local["args"] = ["--reference=HEAD"]
        hooks.append(local)
    (repo.path / ".pre-commit-config.yaml").write_text(yaml.safe_dump({"repos": [{"repo": "local", "hooks": hooks}]}))
    onnx.save(_model(), repo.path / "m.onnx")
    repo.commit("add")
    exe = shutil.which("pre-commit", path=BIN) or shutil.which("pre-commit")
    env_cache = {"PRE_COMMIT_HOME": str(repo.path.parent / "pc-cache")}
    onnx.save(_model(scale=2.0), repo.path / "m.onnx")
    repo.git("add", "m.onnx")
    p = subprocess.run([exe, "run"], cwd=repo.path, env=dict(repo.env, **env_cache), capture_output=True, text=True)
    assert p.returncode == 1, p.stdout + p.stderr
    assert re.search(r"graphpass check-model.*Passed", p.stdout) and re.search(r"graphpass verify-changed.*Failed", p.stdout)
    assert "outputs differ from HEAD" in p.stdout
    repo.git("checkout", "HEAD", "--", "m.onnx")
    onnx.save(_model(), repo.path / "m.onnx")
    repo.git("add", "m.onnx")
    p = subprocess.run([exe, "run", "--all-files"], cwd=repo.path, env=dict(repo.env, **env_cache),
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_check_model_bad_arguments_are_exit_2(tmp_path):
    onnx.save(_model(), tmp_path / "m.onnx")
    for argv in (["--max-size", "12Q", "m.onnx"], ["--min-opset", "20", "--max-opset", "3", "m.onnx"], ["missing.onnx"],
                 ["--external-data", "sometimes", "m.onnx"]):
        p = subprocess.run(["graphpass", "check-model", *argv], cwd=tmp_path, capture_output=True, text=True,
                           env={**__import__("os").environ, "PATH": BIN + ":" + __import__("os").environ["PATH"]})
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, argv
