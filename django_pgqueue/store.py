"""The data layer: the only code that runs the queue's SQL.

`Store` owns one dedicated psycopg connection in autocommit mode, made from the Django
database settings but outside Django's connection handling, so CONN_MAX_AGE never
closes it between jobs. Each method runs one statement from `sql/queries.sql`; a
lost connection surfaces as `DatabaseUnavailable` and the next call reconnects.

The enqueue side (`insert_job`, `insert_jobs`) runs on the caller's Django connection
instead, so a job exists only if the caller's transaction commits.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connections

from .exceptions import DatabaseUnavailable, PgQueueError
from .sql import QUERIES

logger = logging.getLogger(__name__)

NOTIFY_CHANNEL = "pgqueue"

# Connection-level errors: the session is gone or unusable. Anything else (a bad
# value, a constraint) is a statement error and leaves an autocommit session usable.
_CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)


def connection_params(alias: str, application_name: str) -> dict[str, Any]:
    """psycopg connect() arguments for the Django database `alias`."""
    params = dict(connections[alias].get_connection_params())
    # Server-side binding: our statements carry explicit casts, and arrays of
    # thousands of values travel as parameters instead of literals.
    params.pop("cursor_factory", None)
    params.setdefault("application_name", application_name[:63])
    # Notice a dead peer (a failed-over server, a cut network) within about a minute.
    params.setdefault("keepalives", 1)
    params.setdefault("keepalives_idle", 30)
    params.setdefault("keepalives_interval", 10)
    params.setdefault("keepalives_count", 3)
    params.setdefault("connect_timeout", 10)
    return params


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    job_id: int
    queue: str
    type: str
    payload: str
    priority: int
    attempt: int
    max_attempts: int
    lease_version: int
    idempotency_key: str | None
    created_at: Any
    run_at: Any


class Backoff:
    """Full-jitter exponential backoff for reconnects: uniform(0, min(cap, base * 2**n))."""

    def __init__(self, cap: float, base: float = 0.05) -> None:
        self.cap = cap
        self.base = base
        self.failures = 0

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.base * 2 ** min(self.failures, 30))
        self.failures += 1
        return random.uniform(ceiling / 4, ceiling)

    def reset(self) -> None:
        self.failures = 0


class Store:
    """Runs the worker's statements on one dedicated connection."""

    def __init__(self, alias: str, application_name: str) -> None:
        self.alias = alias
        self.application_name = application_name
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    # -- connection ---------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def connect(self) -> None:
        """Open the connection if it is not open; DatabaseUnavailable if that fails."""
        if self.connected:
            return
        try:
            self._conn = psycopg.connect(
                **connection_params(self.alias, self.application_name), autocommit=True
            )
        except _CONNECTION_ERRORS as exc:
            self._conn = None
            raise DatabaseUnavailable(f"cannot connect to the queue database: {exc}") from exc

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    @property
    def raw(self) -> psycopg.Connection[Any]:
        self.connect()
        assert self._conn is not None
        return self._conn

    def _run(self, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self._lock:
            conn = self.raw
            try:
                with conn.cursor() as cursor:
                    cursor.execute(QUERIES[name], params)
                    return cursor.fetchall() if cursor.description else []
            except _CONNECTION_ERRORS as exc:
                self.close()
                raise DatabaseUnavailable(f"{name}: lost the database connection: {exc}") from exc

    # -- worker statements ----------------------------------------------------------

    def claim(self, queue: str, limit: int, worker_id: str, lease: float) -> list[ClaimedRow]:
        rows = self._run(
            "job_claim",
            {"queue": queue, "limit": limit, "worker_id": worker_id, "lease": lease},
        )
        return [ClaimedRow(*row) for row in rows]

    def complete(self, done: Sequence[tuple[int, int, str | None]]) -> set[int]:
        """Complete (job_id, lease_version, result_json) triples; return the job ids completed."""
        if not done:
            return set()
        job_ids, versions, results = (list(column) for column in zip(*done, strict=True))
        rows = self._run(
            "job_complete",
            {"job_ids": job_ids, "lease_versions": versions, "results": results},
        )
        return {row[0] for row in rows}

    def fail(
        self,
        job_id: int,
        lease_version: int,
        *,
        permanent: bool,
        delay: float,
        error_class: str,
        error_message: str,
        traceback: str,
        last_error: str,
    ) -> tuple[str, Any] | None:
        """Record a failure; return (new status, run_at), or None if the lease was lost."""
        rows = self._run(
            "job_fail",
            {
                "job_id": job_id,
                "lease_version": lease_version,
                "permanent": permanent,
                "delay": delay,
                "error_class": error_class,
                "error_message": error_message,
                "traceback": traceback,
                "last_error": last_error,
            },
        )
        return (rows[0][0], rows[0][1]) if rows else None

    def renew(self, held: Sequence[tuple[int, int]], lease: float) -> set[int]:
        """Extend the leases of (job_id, lease_version) pairs; return the job ids still held."""
        if not held:
            return set()
        job_ids, versions = (list(column) for column in zip(*held, strict=True))
        rows = self._run(
            "lease_renew", {"job_ids": job_ids, "lease_versions": versions, "lease": lease}
        )
        return {row[0] for row in rows}

    def release(self, held: Sequence[tuple[int, int]]) -> set[int]:
        """Hand back claimed, never-started jobs; return the job ids released."""
        if not held:
            return set()
        job_ids, versions = (list(column) for column in zip(*held, strict=True))
        rows = self._run("job_release", {"job_ids": job_ids, "lease_versions": versions})
        return {row[0] for row in rows}

    def sweep(self, limit: int = 1000) -> list[tuple[int, str, int, str]]:
        """Requeue (or kill) jobs whose lease ran out: [(job_id, queue, lost_version, status)]."""
        return [tuple(row) for row in self._run("lease_sweep", {"limit": limit})]  # type: ignore[misc]

    def attempt_statuses(self, held: Sequence[tuple[int, int]]) -> dict[tuple[int, int], str]:
        """Status of the attempt rows of (job_id, lease_version) pairs."""
        if not held:
            return {}
        job_ids, versions = (list(column) for column in zip(*held, strict=True))
        rows = self._run("attempt_outcome", {"job_ids": job_ids, "lease_versions": versions})
        return {(row[0], row[1]): row[2] for row in rows}

    # -- LISTEN / NOTIFY ------------------------------------------------------------

    def listen(self) -> None:
        with self._lock:
            try:
                self.raw.execute(f"LISTEN {NOTIFY_CHANNEL}")
            except _CONNECTION_ERRORS as exc:
                self.close()
                raise DatabaseUnavailable(f"LISTEN: lost the database connection: {exc}") from exc

    def notifications(self, timeout: float) -> Iterator[str]:
        """Yield queue names notified within `timeout` seconds (stops early after one burst)."""
        conn = self.raw
        try:
            for notify in conn.notifies(timeout=timeout, stop_after=1):
                yield notify.payload
            # Collect what else already arrived without waiting again.
            for notify in conn.notifies(timeout=0.0):
                yield notify.payload
        except _CONNECTION_ERRORS as exc:
            self.close()
            raise DatabaseUnavailable(f"listening: lost the database connection: {exc}") from exc


def wait_for(store: Store, stop: threading.Event, backoff: Backoff, what: str) -> bool:
    """Reconnect `store` with jittered backoff until it works or `stop` is set."""
    while not stop.is_set():
        try:
            store.connect()
        except DatabaseUnavailable as exc:
            delay = backoff.next_delay()
            logger.warning("%s: database unavailable (%s); retrying in %.2fs", what, exc, delay)
            stop.wait(delay)
            continue
        if backoff.failures:
            logger.warning("%s: reconnected to the database", what)
        backoff.reset()
        return True
    return False


# -- enqueue, on the caller's Django connection ------------------------------------

_LOOKUP_RETRIES = 5


def insert_job(alias: str, params: dict[str, Any]) -> tuple[int, bool, Any]:
    """Run job_enqueue on Django's connection `alias`; return (job id, created, created_at)."""
    with connections[alias].cursor() as cursor:
        for _ in range(_LOOKUP_RETRIES):
            cursor.execute(QUERIES["job_enqueue"], params)
            row = cursor.fetchone()
            if row is not None:
                return int(row[0]), bool(row[1]), row[2]
            # A concurrent transaction took the idempotency key after this statement's
            # snapshot and committed; the next statement sees it.
    raise PgQueueError(
        f"Could not enqueue: the idempotency key {params['idempotency_key']!r} on queue "
        f"{params['queue']!r} keeps changing hands; try again."
    )


def insert_jobs(alias: str, columns: dict[str, list[Any]]) -> list[tuple[int, bool]]:
    """Run job_enqueue_many on Django's connection `alias`; return [(job id, created)]."""
    with connections[alias].cursor() as cursor:
        cursor.execute(QUERIES["job_enqueue_many"], columns)
        rows = cursor.fetchall()
        results: list[tuple[int, bool]] = []
        for position, job_id, created in rows:
            if job_id is None:
                # Held by a transaction that committed after our snapshot: read again.
                queue = columns["queues"][position - 1]
                key = columns["idempotency_keys"][position - 1]
                cursor.execute(QUERIES["job_live_by_key"], {"queue": queue, "idempotency_key": key})
                found = cursor.fetchone()
                if found is None:
                    raise PgQueueError(
                        f"Could not enqueue: the idempotency key {key!r} on queue {queue!r} "
                        "keeps changing hands; try again."
                    )
                job_id = found[0]
            results.append((int(job_id), bool(created)))
        return results


# -- operator actions, on Django's connection ------------------------------------------


def retry_jobs(alias: str, job_ids: Sequence[int]) -> set[int]:
    """Make dead, cancelled or pending jobs due now with fresh attempts; return those changed."""
    with connections[alias].cursor() as cursor:
        cursor.execute(QUERIES["job_retry_now"], {"job_ids": list(job_ids)})
        return {row[0] for row in cursor.fetchall()}


def cancel_jobs(alias: str, job_ids: Sequence[int]) -> set[int]:
    """Cancel pending jobs; return those changed. Running jobs are never touched."""
    with connections[alias].cursor() as cursor:
        cursor.execute(QUERIES["job_cancel"], {"job_ids": list(job_ids)})
        return {row[0] for row in cursor.fetchall()}
