"""PostgreSQL array literals for statement parameters: cheaper to send than lists."""

from __future__ import annotations

from collections.abc import Iterable


def int_array(values: Iterable[int]) -> str:
    """A PostgreSQL array literal of integers: cheaper to send than a list parameter."""
    return "{" + ",".join(map(str, values)) + "}"


def text_array(values: Iterable[str | None]) -> str:
    """A PostgreSQL array literal of strings (None becomes NULL)."""
    return "{" + ",".join("NULL" if v is None else _quote(v) for v in values) + "}"


def _quote(value: str) -> str:
    if '"' in value or "\\" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{value}"'
