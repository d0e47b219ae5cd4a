"""The worker's claim as a server-side prepared statement, for EXPLAIN of its generic plan."""

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
