"""The rows a stopping worker holds while handlers it gave up on still run.

A worker stopping past its grace cannot stop the handler threads still running: they
end with its process. Until they do, their jobs must not run again, and their slots
under a queue or key limit must not go to other jobs. So, before it records the
interruptions, the worker locks those rows (`job_hold`, FOR KEY SHARE) on a connection
of its own, in a transaction it leaves open; the interruption (`job_interrupt`) keeps
each row running with its lease ended. The sweep passes over locked rows. Once the
handlers returned, the worker gives the jobs back on this connection (`job_fail`,
give_back) and commits; a process that ends first takes its session and the locks with it, and
the sweep gives the attempts back.

A held job whose handler had already timed out is not interrupted: its attempt stays
running, and once the handler returned its timeout is written on this connection
(`job_fail`: the attempt spent); a process that ends first leaves it to the sweep,
which records the attempt lost (spent too).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from django.db import connections

from ..outcomes import Failure, Interrupted
from ..sql import QUERIES
from . import errors
from .arrays import int_array
from .connection import configure_session, connection_params
from .rows import failure_statement

logger = logging.getLogger(__name__)


class RowHold:
    """One open transaction holding the rows of interrupted jobs (see the module)."""

    def __init__(self, alias: str, application_name: str) -> None:
        self._alias = alias
        self._name = application_name
        self._conn: psycopg.Connection[Any] | None = None
        self.held: set[int] = set()

    def take(self, rows: Sequence[tuple[int, int]]) -> bool:
        """Lock the running rows of (job_id, lease_version); whether the hold stands.

        False (logged) when the connection or the lock could not be had: the caller
        then keeps their leases, and the sweep gives them back once the process is
        gone and the leases ran out.
        """
        try:
            conn = psycopg.connect(**connection_params(self._alias, self._name), autocommit=True)
            self._conn = conn
            configure_session(conn, connections[self._alias].settings_dict.get("OPTIONS", {}))
            conn.autocommit = False
            owned = {
                "job_ids": int_array([job_id for job_id, _ in rows]),
                "owned": "{" + ",".join(f'"{job}":{version}' for job, version in rows) + "}",
            }
            with conn.cursor() as cursor:
                cursor.execute(QUERIES["job_hold_tables"], prepare=False)
                cursor.execute(QUERIES["job_hold"], owned, prepare=False)
                self.held = {row[0] for row in cursor.fetchall()}
        except psycopg.Error as exc:
            logger.warning(
                "shutdown: could not hold the rows of %d interrupted job(s) (%s); they are "
                "left to the sweep, which takes them once this process ended and their leases "
                "ran out",
                len(rows),
                errors.describe(exc),
            )
            self.close()
            return False
        return True

    def finish(
        self,
        given_back: Sequence[tuple[int, int, int]],
        failed: Sequence[tuple[int, int, int, Failure]],
        reason: str,
        error_class: str,
    ) -> int:
        """Give the interrupted jobs of (job_id, lease_version, attempt_id) back, due at
        once, write the failures of the timed-out ones, and let go of the rows; how many
        jobs were written (the others had moved on)."""
        if self._conn is None:
            return 0
        written = 0
        statements = [
            failure_statement(job_id, lease_version, attempt_id, _give_back(reason, error_class))
            for job_id, lease_version, attempt_id in given_back
        ] + [failure_statement(*row) for row in failed]
        try:
            with self._conn.cursor() as cursor:
                for name, params in statements:
                    cursor.execute(QUERIES[name], params, prepare=False)
                    written += len(cursor.fetchall())
            self._conn.commit()
        except psycopg.Error as exc:
            logger.warning(
                "shutdown: writing %d held job(s) failed (%s); the sweep takes them back",
                len(statements),
                errors.describe(exc),
            )
            written = 0
        finally:
            self.close()
        return written

    def close(self) -> None:
        """Let go of the rows without writing (the sweep gives the attempts back)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()


def _give_back(reason: str, error_class: str) -> Interrupted:
    """The give-back of an interrupted job whose handler returned (`job_fail`, give_back)."""
    return Interrupted(error_class, reason)
