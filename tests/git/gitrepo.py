"""Helpers for the git-integration tests (imported by them; not a conftest, whose module name the
other test folders import): a real git repository in tmp_path, graphpass on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from graphpass.testing import make_model

if shutil.which("git") is None:  # pragma: no cover - git is installed where these tests run
    pytest.skip("git is not installed", allow_module_level=True)

BIN = str(Path(sys.executable).parent)


def git_env(home: Path) -> dict[str, str]:
    """An environment where git reads no user or system config but ``home``'s (made here: git
    cannot write a --global setting into a home that does not exist), and finds graphpass."""
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update({"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "GIT_CONFIG_NOSYSTEM": "1",
                "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@example.com", "PATH": BIN + os.pathsep + env.get("PATH", ""),
                "GRAPHPASS_NO_BROWSER": "1", "GIT_PAGER": "cat", "PAGER": "cat", "NO_COLOR": "1"})
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    return env


class Repo:
    def __init__(self, path: Path, home: Path):
        self.path = path
        self.env = git_env(home)
        path.mkdir(parents=True, exist_ok=True)
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run(["git", *args], cwd=self.path, env=self.env, capture_output=True, text=True)
        if check and p.returncode != 0:
            raise AssertionError(f"git {' '.join(args)} failed ({p.returncode}): {p.stderr}")
        return p

    def run(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        p = subprocess.run(list(args), cwd=self.path, env=self.env, capture_output=True, text=True)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({p.returncode}): {p.stdout}{p.stderr}")
        return p

    def commit(self, message: str, *paths: str) -> None:
        self.git("add", *(paths or ["-A"]))
        self.git("commit", "-q", "-m", message)


@pytest.fixture
def repo(tmp_path) -> Repo:
    return Repo(tmp_path / "repo", tmp_path / "home")


def graphpass_cmd(*args: str) -> list[str]:
    return [os.path.join(BIN, "graphpass"), *args]


def conv_bn_model(blocks: int = 100, channels: int = 4, seed: int = 0) -> onnx.ModelProto:
    """``blocks`` x (Conv -> BatchNormalization -> Relu): 3 * blocks nodes, exporter-like names."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], {}
    x = "input"
    for i in range(blocks):
        p = f"/layer{i}"
        inits[f"layer{i}.conv.weight"] = rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.2
        for k, v in (("weight", rng.uniform(0.5, 1.5, channels)), ("bias", rng.standard_normal(channels) * 0.1),
                     ("running_mean", rng.standard_normal(channels) * 0.1), ("running_var", rng.uniform(0.5, 2, channels))):
            inits[f"layer{i}.bn.{k}"] = v.astype(np.float32)
        nodes.append(helper.make_node("Conv", [x, f"layer{i}.conv.weight"], [f"{p}/conv/Conv_output_0"],
                                      name=f"{p}/conv/Conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3]))
        nodes.append(helper.make_node("BatchNormalization", [f"{p}/conv/Conv_output_0"] +
                                      [f"layer{i}.bn.{k}" for k in ("weight", "bias", "running_mean", "running_var")],
                                      [f"{p}/bn/BatchNormalization_output_0"], name=f"{p}/bn/BatchNormalization"))
        out = "output" if i == blocks - 1 else f"{p}/relu/Relu_output_0"
        nodes.append(helper.make_node("Relu", [f"{p}/bn/BatchNormalization_output_0"], [out], name=f"{p}/relu/Relu"))
        x = out
    m = make_model(nodes, {"input": [1, channels, 8, 8]}, {"output": [1, channels, 8, 8]}, inits)
    m.producer_name = "pytorch"
    m.producer_version = "2.4.0"
    return m


def shuffled(model: onnx.ModelProto, seed: int = 1) -> onnx.ModelProto:
    """The same model with its nodes, initializers and metadata written in another order."""
    rng = np.random.default_rng(seed)
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for field in (m.graph.node, m.graph.initializer, m.metadata_props):
        items = list(field)
        order = rng.permutation(len(items))
        del field[:]
        field.extend([items[i] for i in order])
    return m
