"""Library errors name API arguments, never CLI flags; the CLI names the flag that fixes them.
Also: cli and fusion_switch no longer import each other, and no file cites the missing DESIGN.md."""

import ast
import pathlib
import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

import graphpass
from graphpass.check import verify as V
from graphpass.cli import error_text, main
from graphpass.errors import BadModelError, UsageError
from graphpass.testing import make_model

ROOT = pathlib.Path(graphpass.__file__).parent
REPO = ROOT.parent
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")


def _relu(shape):
    return make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": shape}, {"y": shape})


def test_load_inputs_names_input_shapes_and_the_cli_names_the_flag(tmp_path, capsys):
    npz = tmp_path / "in.npz"
    np.savez(npz, x=np.ones((2, 3), np.float32))
    model = _relu(["N", 3])
    with pytest.raises(UsageError) as e:
        V.load_inputs(str(npz), V.session(model), {"x": [5, 3]})
    assert "input_shapes says [5, 3]" in str(e.value) and not FLAG.search(str(e.value))
    assert e.value.option == "input_shapes"
    assert error_text(e.value).endswith("--input-shape says [5, 3]")
    p = tmp_path / "m.onnx"
    onnx.save(model, str(p))
    assert main(["verify", str(p), str(p), "--inputs", str(npz), "--input-shape", "x:5,3"]) == 2
    assert "--input-shape says [5, 3]" in capsys.readouterr().err


def test_a_failing_original_names_feeds_and_the_cli_names_inputs(tmp_path, capsys):
    m = make_model([helper.make_node("Neg", ["i"], ["j"]), helper.make_node("Gather", ["d", "j"], ["y"])],
                   {"i": (T.INT64, [5])}, {"y": [5, 2]},
                   {"d": np.arange(4, dtype=np.float32).reshape(2, 2)})
    with pytest.raises(BadModelError) as e:
        V.verify_models(m, m)
    assert "other values can be given as feeds" in str(e.value) and not FLAG.search(str(e.value))
    p = tmp_path / "m.onnx"
    onnx.save(m, str(p))
    assert main(["verify", str(p), str(p)]) == 2
    assert "other values can be given as --inputs FILE.npz" in capsys.readouterr().err


def test_error_text_follows_wrapped_errors_and_leaves_other_words_alone():
    try:
        try:
            raise UsageError("input_shapes names 'z'; my_input_shapes stays", option="input_shapes")
        except UsageError as inner:
            raise BadModelError(f"model A: {inner}") from None
    except BadModelError as outer:
        assert error_text(outer) == "model A: --input-shape names 'z'; my_input_shapes stays"
    assert error_text(UsageError("rtol nan: a tolerance is a finite number >= 0")) == \
        "rtol nan: a tolerance is a finite number >= 0"


def _error_messages(path: pathlib.Path):
    """String pieces of the messages raised in ``path`` (raise X(...) calls)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            for arg in node.exc.args:
                for c in ast.walk(arg):
                    if isinstance(c, ast.Constant) and isinstance(c.value, str):
                        yield node.lineno, c.value


#: The CLI (cli.py and its verbs in cli_git.py, cli_atc.py, cli_tools.py) is the one place errors may name flags.
KNOWN = {"cli.py", "cli_git.py", "cli_atc.py", "cli_tools.py", "cli_zoo.py"}


def test_library_errors_name_no_cli_flag():
    found = []
    for root in (ROOT, REPO / "passes", REPO / "cost_model"):
        for path in root.rglob("*.py"):
            rel = path.relative_to(ROOT) if root == ROOT else path.relative_to(REPO)
            if str(rel) in KNOWN:
                continue
            found += [f"{rel}:{line}: {text!r}" for line, text in _error_messages(path) if FLAG.search(text)]
    assert not found, "\n".join(found)


def test_fusion_switch_does_not_import_the_cli():
    mods = set()
    for node in ast.walk(ast.parse((REPO / "passes" / "fusion_switch.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            mods.add(node.module)
        elif isinstance(node, ast.Import):
            mods |= {a.name for a in node.names}
    assert "graphpass.cli" not in mods and "graphpass.outputs" not in mods and "graphpass.ir.files" in mods


def test_switch_file_is_written_atomically_by_the_one_writer(tmp_path, monkeypatch):
    from graphpass.ir import files
    from graphpass.passes import fusion_switch

    calls = []
    real = files.write_text_atomic
    monkeypatch.setattr(fusion_switch, "write_text_atomic", lambda p, t: (calls.append(p), real(p, t)))
    path = fusion_switch.write_switch_file(tmp_path / "switch.cfg", {})
    assert calls == [path] and path.read_text().strip()
    with pytest.raises(UsageError, match="cannot write"):  # a write error is one exit-2 line
        fusion_switch.write_switch_file(tmp_path / "missing" / "x.cfg", {})


def test_no_file_cites_the_missing_design_doc():
    assert not (REPO / "DESIGN.md").exists()
    cited = [str(p.relative_to(REPO)) for d in ("graphpass", "passes", "cost_model", "benchmarks", "examples", "tests")
             for p in (REPO / d).rglob("*") if p.suffix in (".py", ".md", ".toml")
             and p.name != "test_error_wording.py" and "DESIGN.md" in p.read_text(errors="ignore")]
    cited += [n for n in ("README.md", "ARCHITECTURE.md") if "DESIGN.md" in (REPO / n).read_text()]
    assert not cited, cited
