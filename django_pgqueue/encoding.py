"""How the queue writes JSON: the one encoder for payloads and results.

Compact (no spaces), UTF-8 text rather than \\u escapes, and no NaN or Infinity, which
are not JSON and which jsonb refuses. Raises TypeError for values JSON cannot hold and
ValueError for NaN/Infinity, like `json.dumps`; RecursionError for a value that
contains itself (the callers then say where: validation._explain).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

try:
    from _json import make_encoder as _make_encoder
except ImportError:  # no C accelerator (another Python implementation)
    _make_encoder = None

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _make_dumps() -> Callable[[Any], str]:
    if _make_encoder is None:
        return _encoder.encode
    # The C encoder json.dumps builds on every call, built once: an enqueue's payload
    # is encoded in a third of the time. No markers dict (a dict reused across calls
    # would keep the entries of a call that failed half-way), so a value that contains
    # itself ends in RecursionError rather than ValueError.
    encode = _make_encoder(
        None,  # markers
        _encoder.default,
        json.encoder.encode_basestring,  # ensure_ascii=False
        None,  # indent
        ":",
        ",",
        False,  # sort_keys
        False,  # skipkeys
        False,  # allow_nan
    )

    def dumps(value: Any) -> str:
        return "".join(encode(value, 0))

    return dumps


dumps: Callable[[Any], str] = _make_dumps()
