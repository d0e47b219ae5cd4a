"""Queue limits as settings and arguments: parsed and checked, no database here.

``PGQUEUE["QUEUES"] = {"reports": {"limit": 3, "key_limit": 1, "rate": "100/s"}}``:
`limit` is the most running jobs of the queue across every worker (None: no limit),
`key_limit` the most running jobs sharing one concurrency key (default 1), `rate` the
most jobs claimed in any window of the given length ("N/s", "N/m", "N/h", or "N/<x>s"
for a window of x seconds; None: no rate limit). `types` sets a key limit and a rate
per job type within the queue: ``{"types": {"sms.bulk": {"key_limit": 2, "rate":
"10/s"}}}`` (a type's key_limit replaces the queue's for its jobs; its rate holds
besides the queue's).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from . import validators
from .exceptions import ConfigurationError, EnqueueError

QUEUE_KEYS = ("limit", "key_limit", "rate", "types")
TYPE_KEYS = ("key_limit", "rate")
# Per-type entries of one queue, bounded: the controlled claim reads them all.
MAX_TYPES = 100
MAX_LIMIT = 100_000
# The rate window keeps one timestamp per start in the queue's row: bounded.
MAX_RATE_COUNT = 10_000
MAX_RATE_PERIOD = 86_400.0
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([smh])\s*$")


@dataclass(frozen=True)
class TypeLimits:
    """One job type's limits within a queue (None: the queue's key limit, no own rate)."""

    key_limit: int | None = None
    rate_count: int | None = None
    rate_period: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "key_limit": self.key_limit,
            "rate_count": self.rate_count,
            "rate_period": self.rate_period,
        }


@dataclass(frozen=True)
class QueueLimits:
    """One queue's configured limits."""

    limit: int | None = None
    key_limit: int = 1
    rate_count: int | None = None
    rate_period: float | None = None
    types: dict[str, TypeLimits] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The form stored in queue_controls.configured."""
        configured: dict[str, Any] = {
            "limit": self.limit,
            "key_limit": self.key_limit,
            "rate_count": self.rate_count,
            "rate_period": self.rate_period,
        }
        if self.types:  # absent rather than empty: rows written before types stay equal
            configured["types"] = {name: t.as_json() for name, t in sorted(self.types.items())}
        return configured


def parse_rate(value: Any, what: str = "rate") -> tuple[int, float] | None:
    """Parse "100/s", "5/m", "10/2.5s" into (count, period seconds); None stays None."""
    if value is None:
        return None
    match = _RATE.match(value) if isinstance(value, str) else None
    if match is None:
        raise ConfigurationError(
            f"{what} must look like '100/s', '5/m', '1/h' or '10/2.5s', got {value!r}."
        )
    count = int(match.group(1))
    period = float(match.group(2) or 1) * _UNITS[match.group(3)]
    if not 1 <= count <= MAX_RATE_COUNT:
        raise ConfigurationError(
            f"{what}: the count must be between 1 and {MAX_RATE_COUNT}, got {count}."
        )
    if not (math.isfinite(period) and 0 < period <= MAX_RATE_PERIOD):
        raise ConfigurationError(
            f"{what}: the period must be > 0 and at most {MAX_RATE_PERIOD:g}s, got {period:g}s."
        )
    return count, period


def check_limit(value: Any, what: str, *, low: int = 0) -> int | None:
    """Check a concurrency limit (an integer >= low) or None."""
    if value is None:
        return None
    return validators.count(value, f"{what} (or None)", low, MAX_LIMIT, error=ConfigurationError)


def parse_queues(raw: Any, queue_name: re.Pattern[str]) -> dict[str, QueueLimits]:
    """Check PGQUEUE["QUEUES"] and return {queue: QueueLimits}."""
    if raw is None:
        return {}
    queues: dict[str, QueueLimits] = {}
    for queue, entry, where in validators.entries(
        raw,
        "PGQUEUE['QUEUES']",
        lambda key: isinstance(key, str) and queue_name.match(key) is not None,
        f"queue names matching {queue_name.pattern}",
        error=ConfigurationError,
    ):
        validators.mapping(entry, where, QUEUE_KEYS, error=ConfigurationError)
        key_limit = check_limit(entry.get("key_limit", 1), f"{where}['key_limit']", low=1)
        rate = parse_rate(entry.get("rate"), f"{where}['rate']")
        queues[queue] = QueueLimits(
            limit=check_limit(entry.get("limit"), f"{where}['limit']"),
            key_limit=1 if key_limit is None else key_limit,
            rate_count=None if rate is None else rate[0],
            rate_period=None if rate is None else rate[1],
            types=parse_types(entry.get("types"), f"{where}['types']"),
        )
    return queues


def parse_types(raw: Any, where: str) -> dict[str, TypeLimits]:
    """Check a queue's "types" entry: {type name: {"key_limit": n, "rate": "N/s"}}."""
    if raw is None:
        return {}
    if isinstance(raw, dict) and len(raw) > MAX_TYPES:
        raise ConfigurationError(f"{where}: at most {MAX_TYPES} types per queue, got {len(raw)}.")
    types: dict[str, TypeLimits] = {}
    for name, entry, here in validators.entries(
        raw,
        where,
        validators.is_type_name,
        f"job type names matching {validators.TYPE_NAME_RE.pattern}",
        error=ConfigurationError,
    ):
        validators.mapping(entry, here, TYPE_KEYS, error=ConfigurationError)
        if not entry:
            raise ConfigurationError(f"{here} sets nothing; give key_limit, rate or both.")
        rate = parse_rate(entry.get("rate"), f"{here}['rate']")
        types[name] = TypeLimits(
            key_limit=check_limit(entry.get("key_limit"), f"{here}['key_limit']", low=1),
            rate_count=None if rate is None else rate[0],
            rate_period=None if rate is None else rate[1],
        )
    return types


def type_name(value: Any, what: str = "type") -> str:
    """Check a job type name given to a per-type limit."""
    if not validators.is_type_name(value):
        raise ConfigurationError(
            f"{what}: expected a job type name matching {validators.TYPE_NAME_RE.pattern}, "
            f"got {value!r}."
        )
    return value


def concurrency_key(value: Any) -> str | None:
    """Check an enqueue() concurrency key: None, or a string of 1..255 characters, no NUL."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 255 or "\x00" in value:
        raise EnqueueError(
            "concurrency_key must be a non-empty string of at most 255 characters without "
            f"NUL, got {value!r}."
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise EnqueueError(f"concurrency_key is not valid UTF-8: {value!r}.") from exc
    return value


def describe_type(row: dict[str, Any]) -> str:
    """One line for a job type's limits within a queue."""
    rate = "-"
    if row.get("rate_count") is not None:
        rate = f"{row['rate_count']}/{row['rate_period']:g}s"
    key_limit = "queue's" if row.get("key_limit") is None else row["key_limit"]
    return f"type {row['type']}: key_limit={key_limit} rate={rate}"


def parse_fair_queues(value: Any) -> dict[str, dict[str, int]]:
    """{queue: {key: weight}} from PGQUEUE["FAIR_QUEUES"] (a queue whose claims take turns
    across its jobs' fairness keys; a key's weight is the jobs it takes a turn)."""
    setting = "PGQUEUE['FAIR_QUEUES']"
    expected = "a dict of {queue name: {} or {'weights': {key: weight 1..1000}}}"
    if not isinstance(value, dict):
        raise ConfigurationError(f"{setting} must be {expected}, got {value!r}.")
    fair: dict[str, dict[str, int]] = {}
    for queue, options in value.items():
        validators.queue_name(queue, f"{setting} queue", error=ConfigurationError)
        weights = options.get("weights", {}) if isinstance(options, dict) else None
        if (
            not isinstance(options, dict)
            or set(options) - {"weights"}
            or not isinstance(weights, dict)
            or not all(isinstance(key, str) and 0 < len(key) <= 255 for key in weights)
        ):
            raise ConfigurationError(f"{setting}[{queue!r}] must be {expected}, got {options!r}.")
        fair[queue] = {
            key: validators.count(
                weight,
                f"{setting}[{queue!r}] weight of {key!r}",
                1,
                validators.MAX_WEIGHT,
                error=ConfigurationError,
            )
            for key, weight in weights.items()
        }
    return fair
