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
        block = text[match.start() : end]
        name = match.group(1)
        # The statement ends at its last ';'; only comments may follow it (a comment
        # there would otherwise end up inside the statement).
        body, semicolon, rest = block.rpartition(";")
        stray = [
            line
            for line in rest.splitlines()
            if line.strip() and not line.lstrip().startswith("--")
        ]
        if not semicolon or stray:
            raise ValueError(f"queries.sql block {name!r} must end with ';' (then comments only)")
        if name in queries:
            raise ValueError(f"queries.sql defines {name!r} twice")
        queries[name] = body.strip()
    return queries


QUERIES: dict[str, str] = load((Path(__file__).parent / "queries.sql").read_text("utf-8"))
