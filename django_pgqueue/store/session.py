"""One dedicated connection of a worker: opened, lost, re-opened; named statements and
pipelines run on it; its prepared statements' plans kept fit for the tables' size.

`Session` owns one psycopg connection in autocommit mode, made from the Django
database settings but outside Django's connection handling, so CONN_MAX_AGE never
closes it between jobs; its statements are prepared unless `prepared` is False
(PGQUEUE["WORKER_PREPARED_STATEMENTS"]). A lost connection surfaces as
`DatabaseUnavailable`, and the next call reconnects.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connections

from ..exceptions import DatabaseUnavailable
from ..sql import QUERIES
from . import errors
from .connection import configure_session, connection_params

logger = logging.getLogger(__name__)

LOST = "lost the database connection"
# How often a session looks at the size of the tables its prepared statements read (a
# round trip that reads two file sizes), and by what factor they must have grown (or
# shrunk) for it to discard the plans. Empty tables can grow past the factor several
# times within seconds of a burst: the look comes often.
PLAN_CHECK = 1.0
PLAN_GROWTH = 2.0
# After PostgreSQL refused the look (a lock held on a table, a timeout), the next is
# this far off: a refusal that lasts is then logged once a minute, not every second.
PLAN_CHECK_REFUSED = 60.0
# Below this size (bytes) a table read whole costs little: its growth is counted from
# here. Small, because a plan that reads a table whole does so at every execution: 1 MB
# of queue_attempts is about 10,000 row versions, read at every claim cycle.
PLAN_FLOOR = 1 << 16


class Session:
    """One dedicated connection, for one thread of a worker at a time."""

    def __init__(self, alias: str, application_name: str, *, prepared: bool = True) -> None:
        self.alias = alias
        self.application_name = application_name
        self.prepared = prepared
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        # Each table's size when this connection's plans were made (see refresh_plans).
        self._planned_size: tuple[int, ...] | None = None
        self._plan_check_due = 0.0

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
        params["prepare_threshold"] = 0 if self.prepared else None
        try:
            conn = psycopg.connect(**params, autocommit=True)
        except psycopg.Error as exc:  # refused, unreachable, starting up: try again later
            raise DatabaseUnavailable(f"cannot connect to the queue database: {exc}") from exc
        try:
            configure_session(conn, connections[self.alias].settings_dict.get("OPTIONS", {}))
        except psycopg.Error as exc:
            with contextlib.suppress(Exception):
                conn.close()
            raise DatabaseUnavailable(f"cannot set up the worker's session: {exc}") from exc
        self._conn = conn

    def refresh_plans(self, now: float) -> bool:
        """Discard this connection's cached plans if one of the job tables doubled or
        halved since they were made (at most every PLAN_CHECK seconds); True if it did.

        A generic plan built on a nearly empty table reads it whole for ever (until
        ANALYZE). Each table counts on its own: a queue filled before the workers start
        has a large queue_job_state beside an empty queue_attempts, whose growth their
        sum hides. The functions' plans are made again at their next call, and each
        statement is prepared again at its next use, planned as in a new session.
        """
        if now < self._plan_check_due or not self.prepared:
            return False
        if self._conn is not None and self._conn.prepare_threshold is None:
            return False  # preparing was turned off (a pooler): no plans are kept
        self._plan_check_due = now + PLAN_CHECK_REFUSED  # until the probe answers
        sizes = tuple(max(PLAN_FLOOR, int(size)) for size in self.run("plan_size_probe", {})[0])
        self._plan_check_due = now + PLAN_CHECK
        known = self._planned_size
        self._planned_size = sizes if known is None else known
        if known is None or all(
            was / PLAN_GROWTH < size < was * PLAN_GROWTH
            for was, size in zip(known, sizes, strict=True)
        ):
            return False
        self.run("plan_discard", {})
        self.run("plan_deallocate", {})
        self._planned_size = sizes
        return True

    def close(self) -> None:
        conn, self._conn = self._conn, None
        self._planned_size = None  # a new connection plans afresh
        self._plan_check_due = 0.0  # and looks at the size at once
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    @contextmanager
    def _unavailable(self, *what: str) -> Iterator[None]:
        """Turn a lost connection into DatabaseUnavailable("<what>: <error>").

        The connection is dropped, so the next call reconnects. Whether the connection
        is lost is decided by its state and the SQLSTATE (`errors.classify`); any other
        error is a statement error that leaves an autocommit session usable, raised as
        it came for the caller to classify.
        """
        try:
            yield
        except psycopg.Error as exc:
            if errors.classify(exc, self._conn) != errors.LOST:
                raise
            self.close()
            raise DatabaseUnavailable(": ".join([*what, str(exc)])) from exc

    @property
    def raw(self) -> psycopg.Connection[Any]:
        self.connect()
        assert self._conn is not None
        return self._conn

    @contextmanager
    def holding(self, what: str) -> Iterator[psycopg.Connection[Any]]:
        """The connection, for this thread alone; losing it raises DatabaseUnavailable."""
        with self._lock:
            conn = self.raw
            with self._unavailable(what, LOST):
                yield conn

    @contextmanager
    def pipelined(self, conn: psycopg.Connection[Any], what: str) -> Iterator[None]:
        """Send the block's statements in one pipeline: one round trip, one transaction.

        An error undoes them all and is raised. A failure that is not an answer from
        the server means the pipeline's own state broke (psycopg once raised
        IndexError on exit): whether the COMMIT happened is unknown, a write in doubt,
        so the connection is dropped and DatabaseUnavailable raised.
        """
        try:
            with conn.pipeline():
                yield
        except psycopg.Error as exc:
            self._unprepared(exc)  # the caller writes them apart, unprepared
            raise
        except Exception as exc:
            self.close()
            raise DatabaseUnavailable(f"{what}: the pipeline failed ({exc!r})") from exc

    def run(self, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        try:
            return self._run_once(name, params)
        except psycopg.Error as exc:
            if not self._unprepared(exc):
                raise
            return self._run_once(name, params)

    def _run_once(self, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with self.holding(name) as conn, conn.cursor() as cursor:
            cursor.execute(QUERIES[name], params)
            return cursor.fetchall() if cursor.description else []

    def _unprepared(self, exc: psycopg.Error) -> bool:
        """A prepared statement the server lost (a transaction pooler): stop preparing.

        True if the statement should be sent again, unprepared.
        """
        conn = self._conn
        if errors.classify(exc, conn) != errors.UNPREPARED or conn is None:
            return False
        if conn.prepare_threshold is None:
            return False
        conn.prepare_threshold = None
        logger.error(
            "the server does not know a statement this worker prepared (%s): a "
            "transaction-mode pooler (PgBouncer) sits between them. Set "
            'PGQUEUE["WORKER_PREPARED_STATEMENTS"] = False, or connect the worker '
            "directly; preparation is off on this connection from now on",
            errors.describe(exc),
        )
        return True
