"""The statements in queries.sql, by name.

A block starts with a line ``-- name: <name>``; the statement runs until the next
block. Comment lines inside a block are kept (PostgreSQL ignores them).
"""

from __future__ import annotations

import re
from pathlib import Path

_HEADER = re.compile(r"^-- name: ([a-z][a-z_]*)$", re.MULTILINE)


def load(text: str) -> dict[str, str]:
    """Split a queries file into {name: statement}."""
    queries: dict[str, str] = {}
    matches = list(_HEADER.finditer(text))
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following else len(text)
        statement = text[match.start() : end].strip().rstrip(";").strip()
        name = match.group(1)
        if name in queries:
            raise ValueError(f"queries.sql defines {name!r} twice")
        queries[name] = statement
    return queries


QUERIES: dict[str, str] = load((Path(__file__).parent / "queries.sql").read_text("utf-8"))
