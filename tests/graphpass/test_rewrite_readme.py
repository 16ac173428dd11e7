"""The README's "Writing your own rewrite rule" example runs verbatim, so the docs cannot rot."""

import re
from pathlib import Path

from graphpass.passes.framework.registry import unregister

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- rewrite-rule-example"


def _example() -> str:
    text = README.read_text(encoding="utf-8")
    assert MARKER in text, "the README lost its rewrite-rule example marker"
    block = re.search(r"```python\n(.*?)```", text[text.index(MARKER):], re.S)
    assert block is not None
    return block.group(1)


def test_readme_rewrite_rule_example_runs(capsys):
    namespace: dict = {}
    try:
        exec(compile(_example(), "README.md:rewrite-rule-example", "exec"), namespace)  # noqa: S102
    finally:
        unregister("my_cleanup")
    counts = namespace["result"].report.passes[0].stats["rules"]
    assert counts["relu_of_relu"]["rewritten"] == 1 and counts["times_one"]["rewritten"] == 1
    assert "relu_of_relu 1/1, times_one 1/1" in capsys.readouterr().out
