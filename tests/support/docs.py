"""The examples of the documentation's pages (docs/**/*.md), as tests/integration/test_docs.py runs them and
tests/unit/test_typing.py type-checks them: the rules are in test_docs's docstring."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[ \t]*(?P<info>[^\n`]*)$")
_RUN_AS = {"python": "python", "bash": "bash", "sh": "bash"}


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    language: str  # "python", "spark" or "bash"
    code: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def examples() -> Iterator[Example]:
    """Every example of the pages, in page order (see the module's docstring)."""
    for path in sorted(DOCS.rglob("*.md")):
        lines = path.read_text().splitlines()
        number = 0
        while number < len(lines):
            opening = _FENCE.match(lines[number])
            number += 1
            if opening is None:
                continue
            indent, fence, info = opening["indent"], opening["fence"], opening["info"].strip()
            start = number
            while number < len(lines) and not re.fullmatch(rf"{re.escape(indent)}{fence[0]}{{{len(fence)},}}\s*",
                                                           lines[number]):
                number += 1
            body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[start:number]]
            number += 1
            language, _, attributes = info.partition(" ")
            classes = re.findall(r"\.([\w-]+)", attributes)
            kind = _RUN_AS.get(language.lower())
            if kind is None or "no-run" in classes:
                continue
            if kind == "python" and "spark" in classes:
                kind = "spark"
            yield Example(str(path.relative_to(DOCS)), start, kind, "\n".join(body) + "\n")
