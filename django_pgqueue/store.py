"""The data layer: the only code that runs the queue's SQL.

`Store` owns one dedicated psycopg connection in autocommit mode, made from the Django
database settings but outside Django's connection handling, so CONN_MAX_AGE never
closes it between jobs; its statements are prepared unless
PGQUEUE["WORKER_PREPARED_STATEMENTS"] is False. Each method runs one statement from
`sql/queries.sql`; a lost connection surfaces as `DatabaseUnavailable` and the next
call reconnects.

The enqueue side (`insert_job`, `insert_jobs`) runs on the caller's Django connection
instead, so a job exists only if the caller's transaction commits.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import psycopg
from django.db import connections

from .conf import get_settings
from .exceptions import DatabaseUnavailable, PgQueueError
from .executor import Failure
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
    # psycopg's own (C) loaders: Django's adapters parse timestamps in Python, and the
    # worker reads no model fields.
    params.pop("context", None)
    params.setdefault("application_name", application_name[:63])
    # Notice a dead peer (a failed-over server, a cut network) within about a minute.
    params.setdefault("keepalives", 1)
    params.setdefault("keepalives_idle", 30)
    params.setdefault("keepalives_interval", 10)
    params.setdefault("keepalives_count", 3)
    params.setdefault("connect_timeout", 10)
    return params


class ClaimedRow(NamedTuple):
    """One row of job_claim, in its column order."""

    job_id: int
    queue: str
    type: str
    payload: str
    priority: int
    attempt: int
    max_attempts: int
    lease_version: int
    attempt_id: int
    idempotency_key: str | None
    created_at: Any
    run_at: Any
    traceparent: str | None = None

    def order(self) -> tuple[int, Any, int]:
        """A sort key for claim order: ORDER BY priority DESC, run_at, job_id."""
        return (-self.priority, self.run_at, self.job_id)


# Where a claim resumes: the (priority, run_at, job_id) of a row claimed before.
ClaimKey = tuple[int, Any, int]


def _claim_statement(
    queue: str, limit: int, worker_id: str, lease: float, after: ClaimKey | None
) -> tuple[str, dict[str, Any]]:
    params = {"queue": queue, "limit": limit, "worker_id": worker_id, "lease": lease}
    if after is None:
        return "job_claim", params
    priority, run_at, job_id = after
    return "job_claim_after", {
        **params,
        "after_priority": priority,
        "after_run_at": run_at,
        "after_job_id": job_id,
    }


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


def _owned(held: Iterable[tuple[int, int]]) -> dict[str, str]:
    """Parameters naming the (job_id, lease_version) pairs a worker holds."""
    held = list(held)
    return {
        "job_ids": int_array(job_id for job_id, _ in held),
        "owned": "{" + ",".join(f'"{job_id}":{version}' for job_id, version in held) + "}",
    }


def _complete_params(done: Sequence[tuple[int, int, int, str | None]]) -> dict[str, str]:
    results = ",".join(f'"{attempt}":{result}' for _, _, attempt, result in done if result)
    return {
        **_owned((job_id, version) for job_id, version, _, _ in done),
        "attempt_ids": int_array(attempt for _, _, attempt, _ in done),
        "results": "{" + results + "}",
    }


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
        params = connection_params(self.alias, self.application_name)
        # The worker runs the same few statements thousands of times on a connection it
        # owns: prepared on first use, each is parsed and planned once per session.
        params["prepare_threshold"] = 0 if get_settings().WORKER_PREPARED_STATEMENTS else None
        try:
            self._conn = psycopg.connect(**params, autocommit=True)
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

    def claim(
        self,
        queue: str,
        limit: int,
        worker_id: str,
        lease: float,
        after: ClaimKey | None = None,
    ) -> list[ClaimedRow]:
        """Claim up to `limit` due jobs of `queue`, each with a new lease and attempt.

        With `after`, a (priority, run_at, job_id) key, only jobs of that priority
        after it in claim order are taken (`job_claim_after`).
        """
        name, params = _claim_statement(queue, limit, worker_id, lease, after)
        return [ClaimedRow._make(row) for row in self._run(name, params)]

    def complete(self, done: Sequence[tuple[int, int, int, str | None]]) -> set[int]:
        """Complete (job_id, lease_version, attempt_id, result_json); return the job ids done."""
        if not done:
            return set()
        return {row[0] for row in self._run("job_complete", _complete_params(done))}

    def complete_and_claim(
        self,
        done: Sequence[tuple[int, int, int, str | None]],
        queue: str,
        limit: int,
        worker_id: str,
        lease: float,
        after: ClaimKey | None = None,
    ) -> tuple[set[int], list[ClaimedRow]]:
        """`complete` then `claim`, pipelined: one round trip, one transaction, one commit.

        Both statements share the transaction, so an error in either undoes both and
        raises; the caller then writes them one at a time.
        """
        claim_name, claim = _claim_statement(queue, limit, worker_id, lease, after)
        with self._lock:
            conn = self.raw
            try:
                with conn.cursor() as done_cur, conn.cursor() as claim_cur:
                    with conn.pipeline():
                        done_cur.execute(QUERIES["job_complete"], _complete_params(done))
                        claim_cur.execute(QUERIES[claim_name], claim)
                    completed = {row[0] for row in done_cur.fetchall()}
                    return completed, [ClaimedRow._make(row) for row in claim_cur.fetchall()]
            except _CONNECTION_ERRORS as exc:
                self.close()
                raise DatabaseUnavailable(
                    f"job_complete + job_claim: lost the database connection: {exc}"
                ) from exc

    def fail(
        self, job_id: int, lease_version: int, attempt_id: int, failure: Failure
    ) -> tuple[str, Any] | None:
        """Record a failed attempt; return (new status, run_at), or None if the lease was lost."""
        rows = self._run(
            "job_fail",
            {
                "job_id": job_id,
                "lease_version": lease_version,
                "attempt_id": attempt_id,
                "permanent": failure.permanent,
                "delay": failure.delay,
                "error_class": failure.error_class,
                "error_message": failure.message,
                "traceback": failure.traceback,
                "last_error": failure.last_error,
            },
        )
        return (rows[0][0], rows[0][1]) if rows else None

    def renew(self, held: Sequence[tuple[int, int]], lease: float) -> set[int]:
        """Extend the leases of (job_id, lease_version) pairs; return the job ids still held."""
        if not held:
            return set()
        rows = self._run("lease_renew", {**_owned(held), "lease": lease})
        return {row[0] for row in rows}

    def release(self, held: Sequence[tuple[int, int, int]]) -> set[int]:
        """Hand back claimed, never-started (job_id, lease_version, attempt_id); return job ids."""
        if not held:
            return set()
        rows = self._run(
            "job_release",
            {
                **_owned((job_id, version) for job_id, version, _ in held),
                "attempt_ids": int_array(attempt for _, _, attempt in held),
            },
        )
        return {row[0] for row in rows}

    def sweep(self, limit: int = 1000) -> list[tuple[int, str, int, str]]:
        """Requeue (or kill) jobs whose lease ran out: [(job_id, queue, lost_version, status)]."""
        return [tuple(row) for row in self._run("lease_sweep", {"limit": limit})]  # type: ignore[misc]

    def attempt_statuses(self, attempt_ids: Sequence[int]) -> dict[int, str]:
        """Status of attempts, by attempt id."""
        if not attempt_ids:
            return {}
        rows = self._run("attempt_outcome", {"attempt_ids": int_array(attempt_ids)})
        return {row[0]: row[1] for row in rows}

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


# -- enqueue and operator actions, on the caller's Django connection ------------------


@contextmanager
def django_cursor(alias: str) -> Iterator[Any]:
    """A cursor on Django's connection `alias` that binds parameters on the server.

    It is Django's own cursor wrapper (error translation, execute_wrappers, query
    logging, the broken-transaction check), around a psycopg cursor with server-side
    binding: Django's default psycopg cursor merges parameters into the SQL text on
    the client, which for these long statements costs more than running them.
    """
    db = connections[alias]
    db.ensure_connection()
    raw_connection = db.connection
    if not isinstance(raw_connection, psycopg.Connection):  # psycopg2: Django's own cursor
        with db.cursor() as cursor:
            yield cursor
        return
    db.validate_thread_sharing()
    with db.wrap_database_errors:
        raw = psycopg.Cursor(raw_connection)
    cursor = db.make_debug_cursor(raw) if db.queries_logged else db.make_cursor(raw)
    try:
        yield cursor
    finally:
        cursor.close()


_LOOKUP_RETRIES = 5


def insert_job(alias: str, params: dict[str, Any]) -> tuple[int, bool, Any]:
    """Insert one job on Django's connection `alias`; return (job id, created, created_at)."""
    keyed = params["idempotency_key"] is not None
    with django_cursor(alias) as cursor:
        for _ in range(_LOOKUP_RETRIES if keyed else 1):
            cursor.execute(QUERIES["job_enqueue_keyed" if keyed else "job_enqueue"], params)
            row = cursor.fetchone()
            if row is not None:
                return int(row[0]), bool(row[1]), row[2]
            # A concurrent transaction took the idempotency key after this statement's
            # snapshot and committed; the next statement sees it.
    raise PgQueueError(
        f"Could not enqueue: the idempotency key {params['idempotency_key']!r} on queue "
        f"{params['queue']!r} keeps changing hands; try again."
    )


# Jobs per enqueue_many statement: large enough to amortize a round trip and a plan,
# small enough that the plan's estimated cost stays well below jit_above_cost.
BULK_CHUNK = 20_000

BulkRow = tuple[str, str, int, Any, float, int, "str | None"]


def insert_jobs(
    alias: str,
    rows: Sequence[BulkRow],
    payloads: Sequence[str],
    traceparent: str | None = None,
) -> list[tuple[int, bool]]:
    """Insert validated jobs on Django's connection `alias`; return [(job id, created)].

    `rows` are (type, queue, priority, run_at, delay, max_attempts, idempotency_key);
    `payloads` the JSON array text of each BULK_CHUNK slice of them; `traceparent`
    the trace context every one of them is stored with.
    """
    results: list[tuple[int, bool]] = []
    with django_cursor(alias) as cursor:
        for index, payload_text in enumerate(payloads):
            chunk = rows[index * BULK_CHUNK : (index + 1) * BULK_CHUNK]
            params = {
                "types": text_array(row[0] for row in chunk),
                "queues": text_array(row[1] for row in chunk),
                "priorities": int_array(row[2] for row in chunk),
                "run_ats": text_array(
                    None if row[3] is None else row[3].isoformat() for row in chunk
                ),
                "delays": "{" + ",".join(repr(row[4]) for row in chunk) + "}",
                "max_attempts": int_array(row[5] for row in chunk),
                "payloads": payload_text,
                "traceparent": traceparent,
            }
            if all(row[6] is None for row in chunk):
                cursor.execute(QUERIES["job_enqueue_many"], params)
                results.extend((int(job_id), True) for (job_id,) in cursor.fetchall())
            else:
                results.extend(_insert_keyed(cursor, chunk, params))
    return results


def _insert_keyed(
    cursor: Any, chunk: Sequence[BulkRow], params: dict[str, str | None]
) -> list[tuple[int, bool]]:
    cursor.execute(
        QUERIES["job_enqueue_many_keyed"],
        {**params, "idempotency_keys": text_array(row[6] for row in chunk)},
    )
    created = {position: int(job_id) for position, job_id in cursor.fetchall()}
    found: dict[int, int] = {}
    for _ in range(_LOOKUP_RETRIES):
        missing = [p for p in range(1, len(chunk) + 1) if p not in created and p not in found]
        if not missing:
            break
        # Holders of the keys that were skipped: earlier positions of this call (the
        # statement above is visible to this one) or live jobs inserted before it.
        cursor.execute(
            QUERIES["job_live_by_keys"],
            {
                "queues": text_array(chunk[p - 1][1] for p in missing),
                "idempotency_keys": text_array(chunk[p - 1][6] for p in missing),
            },
        )
        for index, job_id in cursor.fetchall():
            if job_id is not None:
                found[missing[index - 1]] = int(job_id)
    if len(created) + len(found) < len(chunk):
        raise PgQueueError(
            "Could not enqueue: some idempotency keys keep changing hands; try again."
        )
    return [
        (created[p], True) if p in created else (found[p], False) for p in range(1, len(chunk) + 1)
    ]


def retry_jobs(alias: str, job_ids: Sequence[int]) -> set[int]:
    """Make dead, cancelled or pending jobs due now with fresh attempts; return those changed."""
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["job_retry_now"], {"job_ids": list(job_ids)})
        return {row[0] for row in cursor.fetchall()}


def cancel_jobs(alias: str, job_ids: Sequence[int]) -> set[int]:
    """Cancel pending jobs; return those changed. Running jobs are never touched."""
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["job_cancel"], {"job_ids": list(job_ids)})
        return {row[0] for row in cursor.fetchall()}


# -- figures and maintenance for the admin and the ops commands, on Django's connection --


def _fetch(alias: str, name: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    # Django's own cursor, which binds on the client: these statements have optional
    # filters ("%(queue)s IS NULL OR ...") and a LIMIT that the planner should see as
    # values, and they run rarely, so an inlined plan beats a reusable generic one.
    with connections[alias].cursor() as cursor:
        cursor.execute(QUERIES[name], params or {})
        return cursor.fetchall() if cursor.description else []


def live_stats(alias: str) -> list[tuple[str, str, int, int, int, float | None]]:
    """Count unfinished and failed jobs: (queue, status, jobs, due, expired, oldest due s)."""
    return [
        (queue, status, int(jobs), int(due), int(expired), oldest)
        for queue, status, jobs, due, expired, oldest in _fetch(alias, "stats_by_queue")
    ]


def completed_counts(alias: str) -> dict[str, int]:
    """Count each queue's completed jobs exactly (reads the whole state table)."""
    return {queue: int(jobs) for queue, jobs in _fetch(alias, "stats_completed_by_queue")}


def estimate_job_count(alias: str) -> int | None:
    """Estimate the number of jobs from the table's statistics; None if it has none yet."""
    rows = _fetch(alias, "job_count_estimate")
    return None if not rows or rows[0][0] is None else int(rows[0][0])


def clock_ago(alias: str, seconds: float) -> Any:
    """Return the database's now() minus `seconds` (an aware datetime)."""
    return _fetch(alias, "clock_ago", {"seconds": seconds})[0][0]


def count_prunable(alias: str, cutoff: Any, statuses: Sequence[str]) -> dict[str, int]:
    """Count, by status, the finished jobs that finished before `cutoff`."""
    rows = _fetch(alias, "job_prune_count", {"cutoff": cutoff, "statuses": list(statuses)})
    return {status: int(jobs) for status, jobs in rows}


def prune_batch(
    alias: str, cutoff: Any, statuses: Sequence[str], limit: int, after_id: int = 0
) -> tuple[dict[str, int], int]:
    """Delete at most `limit` finished jobs older than `cutoff` with ids above `after_id`.

    Returns (counts by status, the highest job id deleted, or after_id if none).
    """
    rows = _fetch(
        alias,
        "job_prune_batch",
        {"cutoff": cutoff, "statuses": list(statuses), "limit": limit, "after_id": after_id},
    )
    counts: dict[str, int] = {}
    for job_id, status in rows:
        counts[status] = counts.get(status, 0) + 1
        after_id = max(after_id, job_id)
    return counts, after_id


def dead_job_page(
    alias: str,
    *,
    until: Any,
    after: tuple[Any, int] | None,
    limit: int,
    since: Any = None,
    queue: str | None = None,
    type: str | None = None,
) -> list[tuple[int, Any]]:
    """One page of (job id, finished_at) of dead jobs, oldest death first, after `after`."""
    after_finished, after_id = after if after is not None else ("-infinity", 0)
    rows = _fetch(
        alias,
        "job_dead_page",
        {
            "until": until,
            "since": since,
            "queue": queue,
            "type": type,
            "after_finished": after_finished,
            "after_id": after_id,
            "limit": limit,
        },
    )
    return [(int(job_id), finished_at) for job_id, finished_at in rows]
