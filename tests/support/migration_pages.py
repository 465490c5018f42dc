"""The settings tables of the migration pages (docs/migration/*.md), which the drop-in producers' tests hold
against the code's."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MIGRATION = ROOT / "docs" / "migration"


def settings_tables(page: Path) -> tuple[set[str], set[str], set[str]]:
    """The settings a migration page lists: with no meaning here, honoured (or refused), and the daemon's (each
    table's first column, in backquotes)."""
    text = page.read_text()
    tables = {}
    for heading in ("Settings with no meaning here", "Settings honoured", "Settings the daemon owns"):
        section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
        tables[heading] = {name for row in re.findall(r"^\|([^|\n]+)\|", section, re.M)
                           for name in re.findall(r"`([^`]+)`", row)}
    return (tables["Settings with no meaning here"], tables["Settings honoured"],
            tables["Settings the daemon owns"])
