"""Checks on what goes into the queue, run before anything is written.

Each function returns the cleaned value or raises `EnqueueError` / `PayloadError`
with a message that names the argument, the bad value and what was expected.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from django.conf import settings
from django.utils import timezone

from . import validators
from .encoding import dumps as _dumps
from .exceptions import EnqueueError, PayloadError
from .validators import MAX_PRIORITY, MAX_SECONDS, MIN_PRIORITY

# Deeper JSON is refused: the worker decodes payloads with Python's json module, and
# walking them here is recursive. Far deeper than any real payload needs.
MAX_PAYLOAD_DEPTH = 500

# isinstance() with a tuple: a `dict | list | tuple` union is built anew at each call.
_CONTAINERS = (dict, list, tuple)
_SEQUENCES = (list, tuple)


# Names already found valid (exact str only): a name's validity depends on nothing
# else, and most programs enqueue a handful of types to a handful of queues.
_VALID_QUEUES: set[str] = set()
_VALID_TYPES: set[str] = set()
_MAX_REMEMBERED = 10_000


def queue_name(value: Any, argument: str = "queue") -> str:
    if value.__class__ is str and value in _VALID_QUEUES:
        return value
    value = validators.queue_name(value, argument, error=EnqueueError)
    if value.__class__ is str and len(_VALID_QUEUES) < _MAX_REMEMBERED:
        _VALID_QUEUES.add(value)
    return value


def type_name(value: Any) -> str:
    if value.__class__ is str and value in _VALID_TYPES:
        return value
    value = validators.type_name(value, "type", error=EnqueueError)
    if value.__class__ is str and len(_VALID_TYPES) < _MAX_REMEMBERED:
        _VALID_TYPES.add(value)
    return value


def priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise EnqueueError(f"priority must be an integer, got {type(value).__name__} {value!r}.")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise EnqueueError(
            f"priority {value} is out of range: use {MIN_PRIORITY}..{MAX_PRIORITY} "
            "(higher runs first)."
        )
    return value


def max_attempts(value: Any) -> int:
    return validators.count(value, "max_attempts", 1, validators.MAX_ATTEMPTS, error=EnqueueError)


def idempotency_key(value: Any) -> str | None:
    return key(value, "idempotency_key")


def key(value: Any, name: str) -> str | None:
    """A job's key (idempotency, unique): None, or 1 to 255 characters without NUL."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 255:
        raise EnqueueError(
            f"{name} must be a non-empty string of at most 255 characters, got {value!r}."
        )
    _check_text(value, name, EnqueueError)
    return value


def schedule(run_at: Any, delay: Any) -> tuple[dt.datetime | None, float]:
    """Return (run_at, delay_seconds); exactly one of them decides when the job is due."""
    if run_at is not None and delay is not None:
        raise EnqueueError("Pass run_at or delay, not both.")
    if run_at is not None:
        if not isinstance(run_at, dt.datetime):
            raise EnqueueError(
                f"run_at must be a datetime, got {type(run_at).__name__} {run_at!r}."
            )
        if timezone.is_naive(run_at):
            if settings.USE_TZ:
                raise EnqueueError(
                    f"run_at {run_at.isoformat()} is a naive datetime; pass an aware one "
                    "(e.g. django.utils.timezone.now() + timedelta(...))."
                )
            run_at = timezone.make_aware(run_at)
        ahead = (run_at - timezone.now()).total_seconds()
        if ahead > MAX_SECONDS:
            raise EnqueueError(f"run_at {run_at.isoformat()} is more than 10 years ahead.")
        return run_at, 0.0
    if delay is None:
        return None, 0.0
    if isinstance(delay, dt.timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        seconds = delay  # not float(): an int too large for one is refused below
    else:
        raise EnqueueError(
            f"delay must be seconds (int or float) or a timedelta, got {type(delay).__name__}."
        )
    return None, validators.seconds(seconds, "delay", allow_zero=True, error=EnqueueError)


def payload(value: Any, max_bytes: int | None, name: str = "payload") -> str:
    """Serialize a payload to JSON text, or explain exactly which part cannot be stored.

    `name` is how messages call the value (the Tasks backend checks ``args`` and
    ``kwargs`` on their own, so its errors name the task's argument).
    """
    try:
        text = _dumps(value)
    except (TypeError, ValueError, RecursionError) as exc:
        _explain(value, name, set())
        raise PayloadError(f"{name} is not JSON-serializable: {exc}", name) from exc
    size = len(text) if text.isascii() else _utf8_size(text)  # ASCII: a byte a character
    if size is None or "\\u0000" in text or not _plain(value):
        _explain(value, name, set())
    if max_bytes is not None and size is not None and size > max_bytes:
        raise _too_large(name, size, max_bytes)
    return text


def payloads(values: list[Any], max_bytes: int | None, offset: int = 0) -> str:
    """Serialize many payloads as one JSON array (one pass of the C encoder).

    Checks each payload as payload() does, but pays per item only where the whole
    array shows a sign of trouble. Errors name the item: ``payload[3]['x']``.
    """
    try:
        text = _dumps(values)
    except (TypeError, ValueError, RecursionError):
        for position, value in enumerate(values, offset):
            _item(value, position, None)
        raise  # not reached: one item failed above
    for position, value in enumerate(values, offset):
        if not _plain(value):
            _item(value, position, None)
    size = _utf8_size(text)
    if "\\u0000" in text or size is None:
        for position, value in enumerate(values, offset):
            _item(value, position, None)
    # The array is larger than any of its items: only a large array needs sizing. The
    # limit is in UTF-8 bytes, not characters ("é" is one character, two bytes).
    if max_bytes is not None and size is not None and size > max_bytes:
        for position, value in enumerate(values, offset):
            _item(value, position, max_bytes)
    return text


def _item(value: Any, position: int, max_bytes: int | None) -> None:
    try:
        payload(value, max_bytes)
    except PayloadError as exc:
        raise PayloadError(f"enqueue_many item {position}: {exc}", exc.path) from exc


def _utf8_size(text: str) -> int | None:
    """The length of text in UTF-8 bytes; None when it holds a lone surrogate."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def _plain(value: Any) -> bool:
    """True when every dict inside value has only str keys (the encoder converts others)
    and nothing nests deeper than MAX_PAYLOAD_DEPTH."""
    if type(value) is dict:  # the common payload, a flat dict: one pass, no stack
        for key, child in value.items():
            if type(key) is not str:
                return False
            if isinstance(child, _CONTAINERS):
                break
        else:
            return True
    elif not isinstance(value, _CONTAINERS):
        return True
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_PAYLOAD_DEPTH:
            return False
        if isinstance(item, dict):
            for key, child in item.items():
                if type(key) is not str:
                    return False
                if isinstance(child, _CONTAINERS):
                    stack.append((child, depth + 1))
        elif isinstance(item, _SEQUENCES):
            stack.extend((child, depth + 1) for child in item if isinstance(child, _CONTAINERS))
    return True


def _too_large(path: str, size: int, max_bytes: int) -> PayloadError:
    return PayloadError(
        f"{path} is {size:,} bytes as JSON, over the limit of {max_bytes:,} "
        "(PGQUEUE['MAX_PAYLOAD_BYTES']). Store large data elsewhere and pass its id.",
        path,
    )


def _check_text(text: str, path: str, error: type[Exception] = PayloadError) -> None:
    if "\x00" in text:
        raise _error(
            error, f"{path} contains a NUL character (\\x00), which PostgreSQL cannot store.", path
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _error(
            error,
            f"{path} contains {text[exc.start : exc.end]!r}, a lone surrogate that is not valid "
            "UTF-8 and cannot be stored.",
            path,
        ) from None


def _error(error: type[Exception], message: str, path: str) -> Exception:
    return PayloadError(message, path) if error is PayloadError else error(message)


_HINTS: dict[str, str] = {
    "Decimal": "pass str(value) and convert back in the handler",
    "datetime": "pass value.isoformat()",
    "date": "pass value.isoformat()",
    "time": "pass value.isoformat()",
    "timedelta": "pass value.total_seconds()",
    "UUID": "pass str(value)",
    "set": "pass a sorted list",
    "frozenset": "pass a sorted list",
    "bytes": "pass base64 text, or store the bytes elsewhere and pass a reference",
    "bytearray": "pass base64 text, or store the bytes elsewhere and pass a reference",
}


def _explain(value: Any, path: str, seen: set[int]) -> None:
    """Walk a value that failed (or may fail) JSON encoding; raise naming the culprit."""
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(
                f"{path} is {value!r}; JSON has no NaN or Infinity. Use None or a string.", path
            )
        return
    if isinstance(value, str):
        _check_text(value, path)
        return
    if isinstance(value, dict | list | tuple):
        # `seen` holds the containers on the path down to here: its size is the depth.
        if len(seen) >= MAX_PAYLOAD_DEPTH:
            root = path.partition("[")[0]
            raise PayloadError(
                f"{root} is nested more than {MAX_PAYLOAD_DEPTH} levels deep (lists and dicts "
                "inside each other); flatten it.",
                root,
            )
        if id(value) in seen:
            raise PayloadError(f"{path} contains itself (a circular reference).", path)
        seen.add(id(value))
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise PayloadError(
                        f"{path} has the key {key!r} of type {type(key).__name__}; JSON object "
                        "keys must be strings (it would come back as a different key).",
                        path,
                    )
                _check_text(key, f"{path} key {key!r}")
                _explain(item, f"{path}[{key!r}]", seen)
        else:
            for index, item in enumerate(value):
                _explain(item, f"{path}[{index}]", seen)
        seen.discard(id(value))
        return
    kind = type(value).__name__
    if hasattr(value, "_meta") and hasattr(value, "pk"):
        hint = f"pass its primary key ({value.pk!r}) and load it in the handler"
        kind = f"{kind} model instance"
    else:
        hint = _HINTS.get(
            type(value).__name__, "convert it to str, int, float, bool, None, list or dict"
        )
    raise PayloadError(
        f"{path} is a {kind} ({value!r:.80}), which is not JSON-serializable: {hint}.", path
    )
