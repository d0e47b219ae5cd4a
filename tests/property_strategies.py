"""Hypothesis strategies for what callers pass to the queue, valid and not.

Shared by the database-free property tests (tests/unit) and the ones that enqueue and
run jobs (tests/integration). Each invalid strategy is invalid by construction, so a
test can say which argument a refusal must name.
"""

from __future__ import annotations

import math
import os
import string
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from django_pgqueue.validators import MAX_SECONDS

# Modest in `make test`; PGQUEUE_RELIABILITY=full searches harder.
FULL = os.environ.get("PGQUEUE_RELIABILITY") == "full"
PROPERTY_SETTINGS = settings(
    max_examples=1000 if FULL else 150,
    deadline=None,
    database=None,  # no .hypothesis/ directory in the checkout
    suppress_health_check=[HealthCheck.too_slow],
)

NAME_TAIL = string.ascii_letters + string.digits + "_.:-"
QUEUE_HEAD = string.ascii_letters + string.digits
TYPE_HEAD = string.ascii_letters + "_"

# Characters a name must not contain, the trailing-newline case first.
BAD_NAME_CHARS = ["\n", "\r", " ", "\t", "\x00", "/", "é", "'", ";", "\u2028"]


def queue_names() -> st.SearchStrategy[str]:
    return st.builds(
        lambda head, tail: head + tail,
        st.sampled_from(QUEUE_HEAD),
        st.text(NAME_TAIL, max_size=62),
    )


def type_names(prefix: str = "") -> st.SearchStrategy[str]:
    head = st.just(prefix) if prefix else st.sampled_from(TYPE_HEAD)
    return st.builds(
        lambda head, tail: head + tail,
        head,
        st.text(NAME_TAIL, max_size=255 - max(len(prefix), 1)),
    )


def broken(names: st.SearchStrategy[str], longest: int) -> st.SearchStrategy[Any]:
    """Names made invalid: a bad character anywhere, empty, too long, or not a str."""
    with_bad_char = st.builds(
        lambda name, char, where: name[:where] + char + name[where:],
        names,
        st.sampled_from(BAD_NAME_CHARS),
        st.integers(0, 300),
    )
    return st.one_of(
        with_bad_char,
        names.map(lambda name: name + "\n"),
        st.just(""),
        st.text(NAME_TAIL, min_size=longest + 1, max_size=longest + 20).map(lambda t: "a" + t),
        st.integers(),
        st.binary(max_size=5),
    )


# JSON the queue stores: what json.dumps writes and jsonb keeps. Text avoids NUL and
# lone surrogates (PostgreSQL refuses both); numbers are finite.
json_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    json_text,
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(json_text, children, max_size=5),
    ),
    max_leaves=25,
)

# One value JSON or PostgreSQL cannot hold, placed somewhere inside valid JSON.
unstorable_leaves = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf]),
    st.text(min_size=1).map(lambda t: t + "\x00"),
    st.sampled_from(["\ud800", "a\udfff"]),
    st.binary(max_size=4),
    st.sets(st.integers(), max_size=3),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.dictionaries(st.integers(), st.none(), min_size=1, max_size=2),
)


def unstorable_values() -> st.SearchStrategy[Any]:
    return st.one_of(
        unstorable_leaves,
        st.builds(lambda bad, key: {key: bad}, unstorable_leaves, json_text),
        st.builds(lambda bad, items: [*items, bad], unstorable_leaves, st.lists(json_values)),
    )


def same_json(stored: Any, original: Any) -> bool:
    """True when a value read back from jsonb is the one written.

    jsonb keeps numbers as numeric and prints them in full, so a float written as
    1e+23 comes back as the int 10**23: numbers compare by value as floats.
    """
    if isinstance(original, bool) or original is None or isinstance(original, str):
        return type(stored) is type(original) and stored == original
    if isinstance(original, int | float):
        if isinstance(stored, bool) or not isinstance(stored, int | float):
            return False
        if isinstance(original, int) and isinstance(stored, int):
            return stored == original
        return float(stored) == float(original)
    if isinstance(original, list | tuple):
        return (
            isinstance(stored, list)
            and len(stored) == len(original)
            and all(same_json(s, o) for s, o in zip(stored, original, strict=True))
        )
    if isinstance(original, dict):
        return (
            isinstance(stored, dict)
            and stored.keys() == original.keys()
            and all(same_json(stored[key], original[key]) for key in original)
        )
    return False


good_seconds = st.one_of(
    st.floats(min_value=0, max_value=MAX_SECONDS, allow_nan=False),
    st.integers(0, MAX_SECONDS),
)
bad_seconds = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 1e13, 1e308, 10**400, MAX_SECONDS + 1]),
    st.floats(max_value=-1e-9),
    st.floats(min_value=MAX_SECONDS + 1, allow_infinity=False),
    st.integers(max_value=-1),
    st.integers(min_value=MAX_SECONDS + 1),
    st.booleans(),
    st.text(max_size=5),
)
