"""Issue 23: the README's CLI reference is the parser's (it fails when they drift), its tables are
whole, and every link and every file path it names resolves inside the repository."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without fenced code blocks (their brackets are code, not links)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_the_cli_reference_is_the_parsers():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import cli_reference
    finally:
        sys.path.pop(0)
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert cli_reference.section(text) == cli_reference.rendered().strip("\n"), \
        "README's CLI reference drifted: run python tools/cli_reference.py --write"
    for verb in ("optimize", "cost", "diff", "precision", "verify", "bisect", "inspect", "passes", "calibrate"):
        assert f"#### `graphpass {verb}`" in text
    assert "`--max-rounds` N | `4` |" in text  # defaults are shown


def test_the_check_script_fails_on_a_drifted_readme(tmp_path):
    tool = (ROOT / "tools" / "cli_reference.py").read_text()
    readme = (ROOT / "README.md").read_text().replace("| `--max-rounds` N | `4` |", "| `--max-rounds` N | `5` |")
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "cli_reference.py").write_text(tool)
    (tmp_path / "README.md").write_text(readme)
    run = subprocess.run([sys.executable, str(tmp_path / "tools" / "cli_reference.py"), "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 1 and "--write" in run.stderr


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_table_is_whole(doc):
    lines = doc.read_text(encoding="utf-8").splitlines()
    k = 0
    while k < len(lines):
        if lines[k].lstrip().startswith("|") and (k == 0 or not lines[k - 1].lstrip().startswith("|")):
            head = lines[k].strip()
            sep = lines[k + 1].strip() if k + 1 < len(lines) else ""
            assert re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", sep), f"{doc.name}:{k + 1}: a table without its header: {head[:80]}"
        k += 1


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_link_resolves_inside_the_repository(doc):
    text = doc.read_text(encoding="utf-8")
    anchors = {_slug(h) for h in re.findall(r"^#+\s+(.*)$", _prose(text), flags=re.M)}
    anchors |= set(re.findall(r'<a id="([^"]+)"', text))  # explicit anchors
    bad = []
    for target in LINK.findall(_prose(text)):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        if not path:
            if anchor not in anchors:
                bad.append(f"#{anchor}: no such heading")
            continue
        resolved = (doc.parent / path).resolve()
        if ROOT not in resolved.parents and resolved != ROOT:
            bad.append(f"{target}: outside the repository")
        elif not resolved.exists():
            bad.append(f"{target}: no such file")
    assert not bad, bad


def test_no_path_outside_the_repository_is_cited():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "../shared" not in text and "/work/" not in text
    for data in (ROOT / "cost_model" / "data").glob("*.toml"):
        assert "../shared" not in data.read_text(encoding="utf-8"), data.name


def test_every_repository_file_the_readme_names_exists():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:graphpass|passes|cost_model|tests|benchmarks|examples|docs|tools)/[\w./-]+\.(?:py|toml|md|json|onnx))`", text))
    assert len(named) > 10
    missing = sorted(p for p in named if not (ROOT / p).exists() and not (ROOT / "graphpass" / p).exists())
    assert not missing, missing
