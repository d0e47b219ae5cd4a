"""A wait() caller's own connection: LISTEN for finished jobs, register, read the outcome.

Each wait opens one connection in autocommit mode (so every statement sees the latest
commits), LISTENs on ``pgqueue_finished``, registers in ``queue_job_waiters`` and reads
the job; the statements that finish a job NOTIFY that channel, with the job's queue as
payload, only for jobs that have a waiter row. `WaitSession` is the blocking side,
`AsyncWaitSession` the asyncio one; both run the same statements.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connections

from ..exceptions import DatabaseUnavailable
from ..sql import QUERIES
from .connection import connection_params, session_statements

FINISHED_CHANNEL = "pgqueue_finished"


@dataclass(frozen=True, slots=True)
class Outcome:
    """A job as a waiter read it: its status, last error and last result."""

    status: str
    last_error: str | None
    error_class: str | None
    result: Any


def _params(alias: str) -> dict[str, Any]:
    params = connection_params(alias, "pgqueue waiter")
    # A handful of statements per wait: nothing to gain from preparing them, and a
    # transaction-mode pooler may not keep them.
    params["prepare_threshold"] = None
    params["autocommit"] = True
    return params


def _options(alias: str) -> dict[str, Any]:
    return connections[alias].settings_dict.get("OPTIONS", {})


@contextmanager
def _unavailable(what: str) -> Iterator[None]:
    """A lost or refused connection becomes DatabaseUnavailable naming `what`."""
    try:
        yield
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"{what}: {exc}") from exc


def _outcome(row: tuple[Any, ...] | None) -> Outcome | None:
    return None if row is None else Outcome(*row)


class WaitSession:
    """One blocking wait's connection, LISTENing on the finished channel."""

    def __init__(self, alias: str) -> None:
        with _unavailable("cannot connect to wait for a job"):
            self._conn = psycopg.connect(**_params(alias))
        try:
            with _unavailable("cannot set up the waiting session"):
                for statement in session_statements(_options(alias)):
                    self._conn.execute(statement)
                self._conn.execute(f"LISTEN {FINISHED_CHANNEL}")
        except BaseException:
            self.close()
            raise

    def add(self, job_id: int, hold: float) -> tuple[int, str] | None:
        """Register a waiter for `job_id`: (waiter id, the job's queue), or None if no job."""
        with _unavailable(f"waiting for job #{job_id}"):
            row = self._conn.execute(
                QUERIES["job_waiter_add"], {"job_id": job_id, "hold": hold}
            ).fetchone()
        return None if row is None else (row[0], row[1])

    def check(self, waiter_id: int, job_id: int, hold: float) -> Outcome | None:
        """Read the job's outcome and keep the waiter row `hold` seconds; None if it is gone."""
        params = {"waiter_id": waiter_id, "job_id": job_id, "hold": hold}
        with _unavailable(f"waiting for job #{job_id}"):
            return _outcome(self._conn.execute(QUERIES["job_waiter_check"], params).fetchone())

    def notified(self, timeout: float) -> list[str]:
        """The queues notified within `timeout` seconds (returns at the first notification)."""
        with _unavailable("waiting for a job"):
            names = [n.payload for n in self._conn.notifies(timeout=timeout, stop_after=1)]
            if names:
                names += [n.payload for n in self._conn.notifies(timeout=0.0)]
        return names

    def remove(self, waiter_id: int) -> None:
        with _unavailable("removing a job's waiter"):
            self._conn.execute(QUERIES["job_waiter_remove"], {"waiter_id": waiter_id})

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close()


class AsyncWaitSession:
    """One asyncio wait's connection; `open()` it before use."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._conn: psycopg.AsyncConnection[Any] | None = None

    @property
    def conn(self) -> psycopg.AsyncConnection[Any]:
        assert self._conn is not None, "open() the session first"
        return self._conn

    async def open(self) -> None:
        # Django's settings only: no query runs on Django's connection here.
        params, options = _params(self.alias), _options(self.alias)
        with _unavailable("cannot connect to wait for a job"):
            self._conn = await psycopg.AsyncConnection.connect(**params)
        try:
            with _unavailable("cannot set up the waiting session"):
                for statement in session_statements(options):
                    await self._conn.execute(statement)
                await self._conn.execute(f"LISTEN {FINISHED_CHANNEL}")
        except BaseException:
            await self.close()
            raise

    async def add(self, job_id: int, hold: float) -> tuple[int, str] | None:
        with _unavailable(f"waiting for job #{job_id}"):
            cursor = await self.conn.execute(
                QUERIES["job_waiter_add"], {"job_id": job_id, "hold": hold}
            )
            row = await cursor.fetchone()
        return None if row is None else (row[0], row[1])

    async def check(self, waiter_id: int, job_id: int, hold: float) -> Outcome | None:
        params = {"waiter_id": waiter_id, "job_id": job_id, "hold": hold}
        with _unavailable(f"waiting for job #{job_id}"):
            cursor = await self.conn.execute(QUERIES["job_waiter_check"], params)
            return _outcome(await cursor.fetchone())

    async def notified(self, timeout: float) -> list[str]:
        with _unavailable("waiting for a job"):
            names = [n.payload async for n in self.conn.notifies(timeout=timeout, stop_after=1)]
            if names:
                names += [n.payload async for n in self.conn.notifies(timeout=0.0)]
        return names

    async def remove(self, waiter_id: int) -> None:
        with _unavailable("removing a job's waiter"):
            await self.conn.execute(QUERIES["job_waiter_remove"], {"waiter_id": waiter_id})

    async def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close()
