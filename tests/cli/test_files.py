"""Issue 23: every file graphpass writes gets the user's umask, all alike (model, external data,
report, dumps and their folder, html, cost/diff outputs, fusion switch, bisect models); ``-o`` onto
the input's own path never leaves the input's external data behind."""

import os
import stat
from pathlib import Path

import onnx
import pytest
from onnx import helper

from graphpass.cli import main
from graphpass.passes.framework import registry
from graphpass.testing import make_model

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "models" / "shufflenet_v2_x0_5.onnx")
WITH_DATA = ROOT / "tests" / "data" / "exporters" / "resnet18.dynamo.onnx"

BREAKER = '''
from graphpass.passes.framework import Pass, PassKind, PassResult, register


@register
class BreakSecondRelu(Pass):
    name = "t_files_break_second_relu"
    summary = "wrong on purpose (tests)"
    kind = PassKind.CLEANUP
    default_enabled = False

    def run(self, graph, ctx):
        relus = [n for n in graph.nodes if n.op == "Relu"]
        if len(relus) < 2 or graph.__dict__.get("_broken"):
            return PassResult(False)
        relus[1].op = "Neg"
        graph.__dict__["_broken"] = True
        return PassResult(True, {"broken": 1})
'''


@pytest.fixture
def umask():
    old = os.umask(0o022)
    os.umask(old)

    def set_(mask):
        os.umask(mask)

    yield set_
    os.umask(old)
    registry.unregister("t_files_break_second_relu")


def _modes(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode) for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077])
def test_every_writer_gives_the_umask_default_mode(mask, umask, tmp_path, capsys):
    umask(mask)
    out = tmp_path / "w"
    out.mkdir()
    os.chmod(out, 0o755)
    relus = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                       {"x": [2, 3]}, {"y": [2, 3]})
    onnx.save(relus, tmp_path / "relus.onnx")
    (tmp_path / "breaker.py").write_text(BREAKER)
    runs = [
        ["optimize", EXAMPLE, "-o", str(out / "m.onnx"), "--report", str(out / "r.json"), "--dump-dir",
         str(out / "dumps" / "deep"), "-q"],
        ["optimize", EXAMPLE, "-o", str(out / "m2.onnx"), "--report", str(out / "r.md"), "-q"],
        ["optimize", str(WITH_DATA), "-o", str(out / "big.onnx"), "-q"],  # with external data
        ["cost", EXAMPLE, "-o", str(out / "c.txt")],
        ["diff", EXAMPLE, str(out / "m.onnx"), "--format", "html", "-o", str(out / "d.html")],
        ["diff", EXAMPLE, str(out / "m.onnx"), "-o", str(out / "d.txt")],
        ["passes", "--write-fusion-switch", str(out / "fs.json")],
        ["bisect", str(tmp_path / "relus.onnx"), "--plugin", str(tmp_path / "breaker.py"), "--passes",
         "t_files_break_second_relu", "--target", "none", "--out-dir", str(out / "bisect")],
    ]
    for argv in runs:
        assert main(argv) in (0, 1), argv
    capsys.readouterr()
    modes = _modes(out)
    files = {k: v for k, v in modes.items() if (out / k).is_file()}
    folders = {k: v for k, v in modes.items() if (out / k).is_dir()}
    assert {"m.onnx", "r.json", "r.md", "big.onnx", "big.onnx.data", "c.txt", "d.html", "d.txt", "fs.json",
            "bisect/last_good.onnx", "bisect/first_bad.onnx"} <= set(files), sorted(files)
    assert any(k.startswith("dumps/deep/") for k in files)
    assert set(files.values()) == {0o666 & ~mask}, files
    assert set(folders.values()) == {0o777 & ~mask}, folders  # dumps/, dumps/deep/, bisect/


def test_o_onto_the_input_with_external_data_is_refused_and_leaves_all_as_it_was(tmp_path, capsys):
    for f in (WITH_DATA, WITH_DATA.with_name(WITH_DATA.name + ".data")):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    model = tmp_path / WITH_DATA.name
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert main(["optimize", str(model), "-o", str(model)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "external data" in err[0] and "-o" in err[0], err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing orphaned, nothing changed
    # the same file by another name (./, a symlink) is the same input
    os.symlink(model, tmp_path / "link.onnx")
    assert main(["optimize", str(model), "-o", str(tmp_path / "link.onnx")]) == 2
    capsys.readouterr()


def test_o_onto_the_input_without_external_data_is_fine(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    model.write_bytes(Path(EXAMPLE).read_bytes())
    assert main(["optimize", str(model), "-o", str(model), "-q"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    onnx.checker.check_model(onnx.load(model), full_check=True)
