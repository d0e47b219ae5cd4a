"""Statements made ready for EXPLAIN: the worker's claim as a server-side prepared
statement (its generic plan), and the reads of a query text a page sent."""

from __future__ import annotations

import re
from typing import Any

_PARAM = re.compile(r"%\((\w+)\)s")


def prepare(cursor: Any, name: str, query: str) -> list[str]:
    """PREPARE `query` (written with %(name)s parameters) as `name`; its parameter names,
    in the order EXECUTE takes them."""
    names = list(dict.fromkeys(_PARAM.findall(query)))
    statement = _PARAM.sub(lambda m: f"${names.index(m.group(1)) + 1}", query)
    cursor.execute(f"PREPARE {name} AS {statement}")
    return names


def execute_args(names: list[str]) -> str:
    """The placeholders of EXECUTE's arguments, for a client-side-binding cursor."""
    return ", ".join(["%s"] * len(names))


# One captured text can hold several statements, sent in one round trip (fetch_after).
_NEXT_STATEMENT = re.compile(r";\s*\n(?=--)")


def statements(text: str) -> list[str]:
    """The read statements (SELECT, WITH) of one query text, without their comment lines."""
    found = []
    for part in _NEXT_STATEMENT.split(text):
        body = "\n".join(line for line in part.splitlines() if not line.startswith("--"))
        if body.lstrip().upper().startswith(("SELECT", "WITH")):
            found.append(body.rstrip().rstrip(";"))
    return found
