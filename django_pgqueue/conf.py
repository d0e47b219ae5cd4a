"""The PGQUEUE setting: defaults, validation, and the resolved values.

Every key of ``settings.PGQUEUE`` is listed in `SETTINGS` with its default and a
one-line description (the reference documentation is checked against this table).
`get_settings()` validates the whole dict once and raises `ConfigurationError`
naming the key, the value and what was expected.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed

from . import prune_policy, validators
from .exceptions import ConfigurationError
from .limits import QueueLimits, parse_fair_queues, parse_queues
from .queue_routes import QueueDatabases, Routes
from .validators import (
    MAX_ASYNC_CONCURRENCY,
    MAX_ATTEMPTS,
    MAX_BATCH_SIZE,
    MAX_CONCURRENCY,
    MAX_PRIORITY,
    MIN_PRIORITY,
)


@dataclass(frozen=True)
class Setting:
    default: Any
    help: str


SETTINGS: dict[str, Setting] = {
    "DATABASE": Setting(
        "default", "Database alias holding the queue tables (of every queue not routed below)."
    ),
    "QUEUE_DATABASES": Setting(
        {},
        "Queues on other databases: {queue or glob: alias}, e.g. {'payments': 'payments_db', "
        "'mail.*': 'bulk'}; an exact name first, then the globs in order; the rest on DATABASE.",
    ),
    "READ_DATABASE": Setting(
        None,
        "An alias (a replica) the admin's lists and counts, queue_stats and metrics read "
        "from; None: each queue's own database. Never used by workers or for writes.",
    ),
    "DEFAULT_QUEUE": Setting("default", "Queue used when enqueue() is given none."),
    "ROUTES": Setting(
        {},
        "Queues for job types enqueued without queue=: {type or glob: queue}, e.g. "
        "{'billing.*': 'payments'}; an exact type first, then the globs in order.",
    ),
    "STRICT_TYPES": Setting(
        False, "Refuse to enqueue a type no handler or task is known for (EnqueueError)."
    ),
    "DEFAULT_PRIORITY": Setting(0, "Priority used when enqueue() is given none (-100..100)."),
    # With the backoff below, 20 attempts span up to 56.5 hours (see the settings page).
    "MAX_ATTEMPTS": Setting(20, "Attempts a job gets unless its handler or enqueue() says."),
    "RETRY_BACKOFF_BASE": Setting(
        15.0, "Seconds; full-jitter backoff waits uniform(0, min(cap, base * 2**(attempt-1)))."
    ),
    "RETRY_BACKOFF_CAP": Setting(21600.0, "Seconds; the longest a backoff delay can be."),
    "MAX_PAYLOAD_BYTES": Setting(1_048_576, "Largest payload, as UTF-8 JSON; None for no limit."),
    "LEASE": Setting(30.0, "Seconds a claim holds a job before another worker may take it."),
    "HEARTBEAT_INTERVAL": Setting(None, "Seconds between lease renewals; None means LEASE / 3."),
    "SWEEP_INTERVAL": Setting(
        10.0, "Seconds between sweeps that requeue jobs whose lease ran out."
    ),
    "POLL_INTERVAL": Setting(1.0, "Seconds an idle worker waits for a NOTIFY before polling."),
    "CONCURRENCY": Setting(10, "Handler threads per worker process."),
    "ASYNC_CONCURRENCY": Setting(
        100, "Async handlers (async def) in flight at once on the worker's event loop."
    ),
    "BATCH_SIZE": Setting(
        None, "Most jobs one claim statement takes; None: the worker's concurrency."
    ),
    "SHUTDOWN_GRACE": Setting(30.0, "Seconds running handlers get to finish after SIGTERM."),
    "JOB_TIMEOUT": Setting(None, "Seconds a handler may run before it is failed; None: no limit."),
    "SOFT_TIME_LIMIT": Setting(None, "Seconds before SoftTimeLimitExceeded; None: never."),
    "TIME_LIMIT": Setting(None, "Seconds before a handler's process is ended; None: never."),
    "RECONNECT_MAX_DELAY": Setting(2.0, "Seconds; cap of the jittered backoff between reconnects."),
    "WORKER_PREPARED_STATEMENTS": Setting(
        True,
        "Prepare the worker's statements on its own connections; False behind a "
        "transaction-pooling PgBouncer older than 1.21.",
    ),
    "SCHEDULES": Setting(
        {}, "Recurring jobs: {name: {type, cron or every, queue, payload, timezone, ...}}."
    ),
    "QUEUES": Setting(
        {},
        "Per-queue limits, e.g. {'reports': {'limit': 3, 'key_limit': 1, 'rate': '100/s', "
        "'types': {'reports.big': {'key_limit': 2, 'rate': '1/s'}}}}; written to "
        "queue_controls at worker start.",
    ),
    "FAIR_QUEUES": Setting(
        {},
        "Queues whose claims take turns across the jobs' fairness keys: {queue: {} or "
        "{'weights': {key: n}}} (a key of weight n takes n jobs a turn; 1 by default).",
    ),
    "METRICS_TOKEN": Setting(
        None,
        "A secret the metrics view accepts as 'Authorization: Bearer <token>'; None: only "
        "users with the view_job permission.",
    ),
    "METRICS_CACHE_SECONDS": Setting(
        5.0, "Seconds scrapes of one process share a reading of the queues' figures; 0: none."
    ),
    "EXTENSIONS": Setting(
        (
            "django_pgqueue.control.extension.QueueControl",
            "django_pgqueue.schedules.extension.Schedules",
            "django_pgqueue.observability.extension.Observability",
        ),
        "Dotted paths of the features enqueue and the workers load "
        "(django_pgqueue.extensions.Extension); leave one out to turn it off.",
    ),
    "PRUNE": Setting(
        dict(prune_policy.DEFAULTS),
        "The built-in schedule that deletes finished jobs: {'every': '1h', 'completed': "
        "'14d', 'cancelled': '14d', 'dead': '90d'} (given keys replace these; a status "
        "set to None is kept for ever; 'cron' instead of 'every'; 'queue'); None: off.",
    ),
    "INDEX_UPKEEP_INTERVAL": Setting(
        300.0,
        "Seconds between a worker's looks at the hot indexes' bloat (a bloated one is "
        "rebuilt with REINDEX CONCURRENTLY); None: never.",
    ),
}


@dataclass(frozen=True)
class QueueSettings:
    DATABASE: str
    DEFAULT_QUEUE: str
    DEFAULT_PRIORITY: int
    MAX_ATTEMPTS: int
    RETRY_BACKOFF_BASE: float
    RETRY_BACKOFF_CAP: float
    MAX_PAYLOAD_BYTES: int | None
    LEASE: float
    HEARTBEAT_INTERVAL: float
    SWEEP_INTERVAL: float
    POLL_INTERVAL: float
    CONCURRENCY: int
    BATCH_SIZE: int | None
    SHUTDOWN_GRACE: float
    JOB_TIMEOUT: float | None
    RECONNECT_MAX_DELAY: float
    WORKER_PREPARED_STATEMENTS: bool
    SCHEDULES: dict[str, Any]  # each entry is checked by django_pgqueue.schedules.checks
    QUEUES: dict[str, QueueLimits] = field(default_factory=dict)
    FAIR_QUEUES: dict[str, dict[str, int]] = field(default_factory=dict)
    EXTENSIONS: tuple[str, ...] = ()
    METRICS_TOKEN: str | None = None
    METRICS_CACHE_SECONDS: float = 5.0
    INDEX_UPKEEP_INTERVAL: float | None = 300.0
    PRUNE: prune_policy.PrunePolicy | None = None
    SOFT_TIME_LIMIT: float | None = None
    TIME_LIMIT: float | None = None
    ROUTES: Routes = field(default_factory=lambda: Routes({}, ()))
    STRICT_TYPES: bool = False

    def route(self, type_: str) -> str | None:
        """The queue ROUTES gives job type `type_`, or None when no route matches."""
        return self.ROUTES.queue(type_)

    ASYNC_CONCURRENCY: int = 100
    QUEUE_DATABASES: QueueDatabases = field(default_factory=lambda: QueueDatabases({}, ()))
    READ_DATABASE: str | None = None

    def database_for(self, queue: str) -> str:
        """The database alias holding `queue`'s jobs (QUEUE_DATABASES, else DATABASE)."""
        return self.QUEUE_DATABASES.alias(queue, self.DATABASE)

    @property
    def queue_databases(self) -> tuple[str, ...]:
        """Every alias that holds queues: DATABASE first, then those QUEUE_DATABASES names."""
        return tuple(dict.fromkeys((self.DATABASE, *self.QUEUE_DATABASES.aliases())))

    def read_database(self, alias: str) -> str:
        """The alias to read lists and counts of `alias`'s queues from (READ_DATABASE
        when set and `alias` is DATABASE, else `alias` itself)."""
        if self.READ_DATABASE is not None and alias == self.DATABASE:
            return self.READ_DATABASE
        return alias


def _name(key: str) -> str:
    return f"PGQUEUE[{key!r}]"


def _fail(key: str, value: Any, expected: str) -> ConfigurationError:
    return ConfigurationError(f"{_name(key)} must be {expected}, got {value!r}.")


def _int(key: str, value: Any, low: int, high: int | None = None) -> int:
    return validators.count(value, _name(key), low, high, error=ConfigurationError)


def _seconds(key: str, value: Any, *, positive: bool = True) -> float:
    return validators.seconds(value, _name(key), allow_zero=not positive, error=ConfigurationError)


def validate(raw: Any) -> QueueSettings:
    """Check a PGQUEUE dict and return the resolved settings."""
    if raw is None:
        raw = {}
    validators.mapping(raw, "settings.PGQUEUE", SETTINGS, error=ConfigurationError)
    values = {key: raw.get(key, setting.default) for key, setting in SETTINGS.items()}

    database = values["DATABASE"]
    if not isinstance(database, str) or not database:
        raise _fail("DATABASE", database, "a database alias (a non-empty string)")
    queue = values["DEFAULT_QUEUE"]
    validators.queue_name(queue, _name("DEFAULT_QUEUE"), error=ConfigurationError)
    priority = _int("DEFAULT_PRIORITY", values["DEFAULT_PRIORITY"], MIN_PRIORITY, MAX_PRIORITY)
    max_attempts = _int("MAX_ATTEMPTS", values["MAX_ATTEMPTS"], 1, MAX_ATTEMPTS)
    base = _seconds("RETRY_BACKOFF_BASE", values["RETRY_BACKOFF_BASE"], positive=False)
    cap = _seconds("RETRY_BACKOFF_CAP", values["RETRY_BACKOFF_CAP"], positive=False)
    if cap < base:
        raise _fail("RETRY_BACKOFF_CAP", cap, f">= RETRY_BACKOFF_BASE ({base:g})")
    max_payload = values["MAX_PAYLOAD_BYTES"]
    if max_payload is not None:
        max_payload = _int("MAX_PAYLOAD_BYTES", max_payload, 2)
    lease = _seconds("LEASE", values["LEASE"])
    heartbeat = values["HEARTBEAT_INTERVAL"]
    heartbeat = lease / 3 if heartbeat is None else _seconds("HEARTBEAT_INTERVAL", heartbeat)
    if heartbeat > lease / 2:
        raise _fail(
            "HEARTBEAT_INTERVAL",
            heartbeat,
            f"at most half the LEASE ({lease / 2:g}s) so a lease is renewed well before it ends",
        )
    timeout = values["JOB_TIMEOUT"]
    if timeout is not None:
        timeout = _seconds("JOB_TIMEOUT", timeout)
    soft_limit = _optional_seconds("SOFT_TIME_LIMIT", values["SOFT_TIME_LIMIT"])
    hard_limit = _optional_seconds("TIME_LIMIT", values["TIME_LIMIT"])
    if soft_limit and hard_limit and soft_limit >= hard_limit:
        raise _fail("SOFT_TIME_LIMIT", soft_limit, f"below TIME_LIMIT ({hard_limit:g}s)")
    strict = values["STRICT_TYPES"]
    if not isinstance(strict, bool):
        raise _fail("STRICT_TYPES", strict, "True or False")
    routes = _routes(values["ROUTES"])
    prepared = values["WORKER_PREPARED_STATEMENTS"]
    if not isinstance(prepared, bool):
        raise _fail("WORKER_PREPARED_STATEMENTS", prepared, "True or False")
    return QueueSettings(
        DATABASE=database,
        DEFAULT_QUEUE=queue,
        DEFAULT_PRIORITY=priority,
        MAX_ATTEMPTS=max_attempts,
        RETRY_BACKOFF_BASE=base,
        RETRY_BACKOFF_CAP=cap,
        MAX_PAYLOAD_BYTES=max_payload,
        LEASE=lease,
        HEARTBEAT_INTERVAL=heartbeat,
        SWEEP_INTERVAL=_seconds("SWEEP_INTERVAL", values["SWEEP_INTERVAL"]),
        POLL_INTERVAL=_seconds("POLL_INTERVAL", values["POLL_INTERVAL"]),
        CONCURRENCY=_int("CONCURRENCY", values["CONCURRENCY"], 1, MAX_CONCURRENCY),
        BATCH_SIZE=(
            None
            if values["BATCH_SIZE"] is None
            else _int("BATCH_SIZE", values["BATCH_SIZE"], 1, MAX_BATCH_SIZE)
        ),
        ASYNC_CONCURRENCY=_int(
            "ASYNC_CONCURRENCY", values["ASYNC_CONCURRENCY"], 1, MAX_ASYNC_CONCURRENCY
        ),
        SHUTDOWN_GRACE=_seconds("SHUTDOWN_GRACE", values["SHUTDOWN_GRACE"], positive=False),
        JOB_TIMEOUT=timeout,
        SOFT_TIME_LIMIT=soft_limit,
        TIME_LIMIT=hard_limit,
        RECONNECT_MAX_DELAY=_seconds("RECONNECT_MAX_DELAY", values["RECONNECT_MAX_DELAY"]),
        WORKER_PREPARED_STATEMENTS=prepared,
        SCHEDULES=_schedules(values["SCHEDULES"]),
        QUEUES=parse_queues(values["QUEUES"], validators.QUEUE_NAME_RE),
        FAIR_QUEUES=parse_fair_queues(values["FAIR_QUEUES"]),
        EXTENSIONS=_extensions(values["EXTENSIONS"]),
        METRICS_TOKEN=_token(values["METRICS_TOKEN"]),
        METRICS_CACHE_SECONDS=_seconds(
            "METRICS_CACHE_SECONDS", values["METRICS_CACHE_SECONDS"], positive=False
        ),
        INDEX_UPKEEP_INTERVAL=_optional_seconds(
            "INDEX_UPKEEP_INTERVAL", values["INDEX_UPKEEP_INTERVAL"]
        ),
        PRUNE=prune_policy.parse(values["PRUNE"], _name("PRUNE"), error=ConfigurationError),
        ROUTES=routes,
        STRICT_TYPES=strict,
        QUEUE_DATABASES=_queue_databases(values["QUEUE_DATABASES"], database),
        READ_DATABASE=_read_database(values["READ_DATABASE"], database),
    )


def _optional_seconds(key: str, value: Any) -> float | None:
    return None if value is None else _seconds(key, value)


GLOB_CHARS = frozenset("*?[")
# A glob is a job type's (or a queue's) characters plus fnmatch's *, ?, [...] and [!...].
GLOB_RE = re.compile(r"\A[A-Za-z0-9_.:*?\[\]!-]{1,255}\Z")


def _routes(value: Any) -> Routes:
    if not isinstance(value, dict):
        raise _fail("ROUTES", value, "a dict of job types (or globs such as 'billing.*') to queues")
    exact: dict[str, str] = {}
    globs: list[tuple[str, str]] = []
    for pattern, queue in value.items():
        where = f"{_name('ROUTES')}[{pattern!r}]"
        if _is_glob("ROUTES", pattern, "job type", "type's", "billing.*"):
            globs.append((pattern, validators.queue_name(queue, where, error=ConfigurationError)))
        else:
            validators.type_name(pattern, f"{_name('ROUTES')} key", error=ConfigurationError)
            exact[pattern] = validators.queue_name(queue, where, error=ConfigurationError)
    return Routes(exact, tuple(globs))


def _is_glob(setting: str, pattern: Any, what: str, whose: str, example: str) -> bool:
    """Whether a key of `setting` (ROUTES, QUEUE_DATABASES) is a glob of a `what`; an
    error naming it when it has a glob's characters but is not one."""
    if not (isinstance(pattern, str) and GLOB_CHARS.intersection(pattern)):
        return False
    if not GLOB_RE.match(pattern) or pattern.count("[") != pattern.count("]"):
        raise ConfigurationError(
            f"{_name(setting)} has the key {pattern!r}, which is neither a {what} nor a "
            f"glob of one: use a {whose} letters, digits, '_', '.', ':' or '-', with *, ? "
            f"or [...] (e.g. {example!r})."
        )
    return True


def _alias(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(
            f"{where} must be a database alias (a non-empty string), got {value!r}."
        )
    return value


def _queue_databases(value: Any, default: str) -> QueueDatabases:
    if not isinstance(value, dict):
        raise _fail(
            "QUEUE_DATABASES", value, "a dict of queue names (or globs) to database aliases"
        )
    exact: dict[str, str] = {}
    globs: list[tuple[str, str]] = []
    for pattern, alias in value.items():
        where = f"{_name('QUEUE_DATABASES')}[{pattern!r}]"
        alias = _alias(where, alias)
        if _is_glob("QUEUE_DATABASES", pattern, "queue name", "queue's", "mail.*"):
            globs.append((pattern, alias))
        else:
            validators.queue_name(
                pattern, f"{_name('QUEUE_DATABASES')} key", error=ConfigurationError
            )
            exact[pattern] = alias
    return QueueDatabases(exact, tuple(globs))


def _read_database(value: Any, default: str) -> str | None:
    if value is None:
        return None
    alias = _alias(_name("READ_DATABASE"), value)
    if alias == default:
        raise _fail("READ_DATABASE", value, f"None or an alias other than DATABASE ({default!r})")
    return alias


def _token(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or len(value) < 16):
        raise _fail("METRICS_TOKEN", "<hidden>", "None or a secret string of 16 characters or more")
    return value


def _extensions(value: Any) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(path, str) and path for path in value
    ):
        raise _fail("EXTENSIONS", value, "a list of dotted paths to Extension classes")
    return tuple(value)


def _schedules(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or not all(isinstance(name, str) for name in value):
        raise _fail("SCHEDULES", value, "a dict of schedule names to their declarations")
    return value


_cached: QueueSettings | None = None


def get_settings() -> QueueSettings:
    """Return the validated PGQUEUE settings (cached until the setting changes)."""
    global _cached
    if _cached is None:
        _cached = validate(getattr(django_settings, "PGQUEUE", None))
    return _cached


def _reset(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting == "PGQUEUE":
        _cached = None


setting_changed.connect(_reset)
