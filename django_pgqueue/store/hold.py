"""The rows a stopping worker holds while handlers it gave up on still run.

A worker stopping past its grace cannot stop the handler threads still running: they
end with its process. Until they do, their jobs must not run again, and their slots
under a queue or key limit must not go to other jobs. So, before it records the
interruptions, the worker locks those rows (`job_hold`, FOR KEY SHARE) on a connection
of its own, in a transaction it leaves open; the interruption (`job_interrupt`) keeps
each row running with its lease ended. The sweep passes over locked rows. Once the
handlers returned, the worker gives the jobs back on this connection (`job_give_back`)
and commits; a process that ends first takes its session and the locks with it, and
the sweep gives the attempts back.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import psycopg
from django.db import connections

from ..sql import QUERIES
from . import errors
from .arrays import int_array
from .connection import configure_session, connection_params

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
        then gives the jobs back at once, as a worker without a hold would.
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
                "given back at once, while their handlers may still run",
                len(rows),
                errors.describe(exc),
            )
            self.close()
            return False
        return True

    def give_back(self, rows: Sequence[tuple[int, int, int]], reason: str, error_class: str) -> int:
        """Give the held jobs of (job_id, lease_version, attempt_id) back, due at once, and
        let go of the rows; how many were given back (the others had moved on)."""
        if self._conn is None:
            return 0
        given = 0
        try:
            with self._conn.cursor() as cursor:
                for job_id, lease_version, attempt_id in rows:
                    cursor.execute(
                        QUERIES["job_give_back"],
                        {
                            "job_id": job_id,
                            "lease_version": lease_version,
                            "attempt_id": attempt_id,
                            "delay": 0.0,
                            "reason": reason,
                            "attempt_status": "interrupted",
                            "error_class": error_class,
                        },
                        prepare=False,
                    )
                    given += len(cursor.fetchall())
            self._conn.commit()
        except psycopg.Error as exc:
            logger.warning(
                "shutdown: giving back %d interrupted job(s) failed (%s); the sweep gives "
                "their attempts back",
                len(rows),
                errors.describe(exc),
            )
            given = 0
        finally:
            self.close()
        return given

    def close(self) -> None:
        """Let go of the rows without writing (the sweep gives the attempts back)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()
