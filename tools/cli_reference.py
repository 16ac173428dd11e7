"""Render the README's CLI reference from graphpass's argument parser.

    python tools/cli_reference.py            print it
    python tools/cli_reference.py --write    replace the README section between the markers
    python tools/cli_reference.py --check    exit 1 when the README differs (what tests/cli/test_readme.py checks)
"""

from __future__ import annotations

import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- cli-reference:begin -->", "<!-- cli-reference:end -->"


def rendered() -> str:
    from graphpass.cli import reference_markdown

    return reference_markdown()


def section(text: str) -> str:
    """What the README holds between the markers (without them)."""
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{README}: the markers {BEGIN} / {END} are missing")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def main(argv: list[str]) -> int:
    body = rendered().strip("\n")
    text = README.read_text(encoding="utf-8")
    if "--check" in argv:
        if section(text) != body:
            print(f"{README.name}: the CLI reference differs from the parser; run python tools/cli_reference.py --write",
                  file=sys.stderr)
            return 1
        return 0
    if "--write" in argv:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        README.write_text(f"{head}{BEGIN}\n{body}\n{END}{tail}", encoding="utf-8")
        return 0
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
