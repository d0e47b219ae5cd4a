"""One set of checks for seconds, counts and names, wherever such a value comes in.

The PGQUEUE setting, the worker's options, handler registration, the Tasks backend,
retry policies, `RetryLater` and enqueue() all check their values here, so what one
entry point refuses every other refuses too. A check returns the cleaned value or
raises `error` (ValueError unless the caller passes its own class, such as
ConfigurationError or CommandError) with a message naming the value as the caller
calls it, what came, and what was expected.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

logger = logging.getLogger(__name__)

# The longest duration anything accepts, in seconds: 10 years (of 366 days). Every
# delay, lease, interval and timeout ends up as `now() + interval` in PostgreSQL, whose
# timestamps end in the year 294276: 1e13 seconds from now is already out of range,
# and a failed statement there would strand its job. A duration this long is a unit
# mistake anyway (milliseconds given as seconds).
MAX_SECONDS = 10 * 366 * 24 * 3600
MAX_SECONDS_TEXT = f"at most {MAX_SECONDS:,} (10 years)"

MIN_PRIORITY = -100
MAX_PRIORITY = 100
MAX_ATTEMPTS = 1000
MAX_CONCURRENCY = 1000
MAX_ASYNC_CONCURRENCY = 10_000
MAX_BATCH_SIZE = 10_000
MAX_WEIGHT = 1000
# The longest step name or event key of a durable handler; the step and event tables'
# CHECKs hold the same bound.
MAX_DURABLE_NAME = 200

# \A and \Z, not ^ and $: `$` also matches before a trailing newline, so "email\n"
# would pass and then fail in the database's CHECK constraint.
QUEUE_NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}\Z")
TYPE_NAME_RE = re.compile(r"\A[A-Za-z_][A-Za-z0-9_.:-]{0,254}\Z")
# What a refused name is told, after the name and the value.
QUEUE_NAME_RULE = (
    "is not a valid queue name: use 1 to 63 letters, digits, '_', '.', ':' or '-', "
    "starting with a letter or digit."
)
TYPE_NAME_RULE = (
    "is not a valid job type: use 1 to 255 letters, digits, '_', '.', ':' or '-', "
    "starting with a letter or '_' (e.g. 'payments.charge')."
)


def seconds(
    value: Any, name: str, *, allow_zero: bool = False, error: type[Exception] = ValueError
) -> float:
    """Return `value` as float seconds: a number > 0 (>= 0 with `allow_zero`) up to MAX_SECONDS."""
    # Comparisons, not math.isfinite: NaN fails every one of them, and an int too
    # large for a float (10**400) compares without overflowing.
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or not ((value >= 0 if allow_zero else value > 0) and value <= MAX_SECONDS):
        lowest = ">= 0" if allow_zero else "> 0"
        raise error(
            f"{name} must be a finite number of seconds {lowest} and {MAX_SECONDS_TEXT}, "
            f"got {value!r}."
        )
    return float(value)


def clamp_seconds(value: float, what: str) -> float:
    """Return `value` within 0..MAX_SECONDS, logging a warning when it was outside.

    For delays a handler or a retry policy computes while a job runs: refusing one
    there would leave the job without an outcome, so it is brought into range instead.
    NaN and negative values become 0 (retry now), anything above the maximum (infinity
    included) becomes MAX_SECONDS.
    """
    if 0 <= value <= MAX_SECONDS:
        return float(value)
    clamped = float(MAX_SECONDS) if value > MAX_SECONDS else 0.0
    logger.warning(
        "%s is %r seconds, outside 0..%d (10 years); using %.0fs instead",
        what,
        value,
        MAX_SECONDS,
        clamped,
    )
    return clamped


def count(
    value: Any,
    name: str,
    low: int = 1,
    high: int | None = None,
    *,
    error: type[Exception] = ValueError,
) -> int:
    """Return `value` if it is an int (not a bool) from `low` to `high` (None: no top)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        expected = f"from {low} to {high}" if high is not None else f">= {low}"
        raise error(f"{name} must be an integer {expected}, got {value!r}.")
    return value


def flag(value: Any, name: str, *, error: type[Exception] = ValueError) -> bool:
    """Return `value` if it is True or False (not 0, 1 or "yes")."""
    if not isinstance(value, bool):
        raise error(f"{name} must be True or False, got {value!r}.")
    return value


def mapping(
    value: Any, name: str, known: Collection[str], *, error: type[Exception] = ValueError
) -> Mapping[Any, Any]:
    """Return `value` if it is a dict whose keys are all among `known`."""
    if not isinstance(value, Mapping):
        raise error(f"{name} must be a dict, got {type(value).__name__} {value!r}.")
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise error(
            f"{name} has unknown key(s) {', '.join(map(repr, unknown))}; "
            f"known keys: {', '.join(known)}."
        )
    return value


def entries(
    value: Any,
    name: str,
    valid_key: Callable[[Any], bool],
    keys_are: str,
    *,
    error: type[Exception] = ValueError,
) -> Iterator[tuple[Any, Any, str]]:
    """Each (key, entry, how to name the entry) of a dict whose keys are `keys_are`.

    A key `valid_key` refuses raises `error` when the loop reaches it.
    """
    if not isinstance(value, Mapping):
        raise error(f"{name} must map {keys_are} to their settings, got {value!r}.")
    for key, entry in value.items():
        if not valid_key(key):
            raise error(f"{name} keys must be {keys_are}, got {key!r}.")
        yield key, entry, f"{name}[{key!r}]"


def is_queue_name(value: Any) -> bool:
    """True when `value` is a valid queue name."""
    return isinstance(value, str) and QUEUE_NAME_RE.match(value) is not None


def is_type_name(value: Any) -> bool:
    """True when `value` is a valid job type."""
    return isinstance(value, str) and TYPE_NAME_RE.match(value) is not None


def queue_name(value: Any, name: str = "queue", *, error: type[Exception] = ValueError) -> str:
    """Return `value` if it is a queue name: 1 to 63 of [A-Za-z0-9_.:-], not led by [_.:-]."""
    return _named(value, name, is_queue_name, QUEUE_NAME_RULE, error)


def type_name(value: Any, name: str = "type", *, error: type[Exception] = ValueError) -> str:
    """Return `value` if it is a job type: 1 to 255 of [A-Za-z0-9_.:-], led by a letter or _."""
    return _named(value, name, is_type_name, TYPE_NAME_RULE, error)


def _named(
    value: Any, name: str, valid: Callable[[Any], bool], rule: str, error: type[Exception]
) -> str:
    if not isinstance(value, str):
        raise error(f"{name} must be a string, got {type(value).__name__} {value!r}.")
    if not valid(value):
        raise error(f"{name} {value!r} {rule}")
    return value
