"""PostgreSQL array literals for statement parameters: cheaper to send than lists."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def int_array(values: Iterable[int]) -> str:
    """A PostgreSQL array literal of integers: cheaper to send than a list parameter."""
    return "{" + ",".join(map(str, values)) + "}"


def text_array(values: Iterable[str | None]) -> str:
    """A PostgreSQL array literal of strings (None becomes NULL)."""
    return "{" + ",".join("NULL" if v is None else text_element(v) for v in values) + "}"


def repeated_text_array(values: Sequence[str]) -> str:
    """`text_array` of values drawn from a few strings (queue names, outcomes): each
    distinct one is quoted once."""
    elements = {value: text_element(value) for value in set(values)}
    return "{" + ",".join(map(elements.__getitem__, values)) + "}"


def text_element(value: str) -> str:
    """One string as an element of a PostgreSQL array literal (quoted, escaped)."""
    if '"' in value or "\\" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{value}"'
