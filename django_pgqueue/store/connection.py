"""The worker's connections: their parameters, their session, and reconnecting.

Made from the Django database settings but outside Django's connection handling (so
CONN_MAX_AGE never closes one under a running worker); `wait_for` reconnects a
`Store` with jittered backoff.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any, Protocol

import psycopg
from django.db import connections
from psycopg import sql

from ..exceptions import DatabaseUnavailable


class Connectable(Protocol):
    """What `wait_for` needs of a store: whether it is connected, and a way to connect."""

    @property
    def connected(self) -> bool: ...

    def connect(self) -> None: ...


logger = logging.getLogger(__name__)


def connection_params(alias: str, application_name: str) -> dict[str, Any]:
    """psycopg connect() arguments for the Django database `alias`."""
    params = dict(connections[alias].get_connection_params())
    # Server-side binding: our statements carry explicit casts, and arrays of
    # thousands of values travel as parameters instead of literals.
    params.pop("cursor_factory", None)
    # psycopg's own (C) loaders: Django's adapters parse timestamps in Python, and the
    # worker reads no model fields.
    params.pop("context", None)
    params["application_name"] = session_name(application_name, params.get("application_name"))
    # Notice a dead peer (a failed-over server, a cut network) within about a minute.
    params.setdefault("keepalives", 1)
    params.setdefault("keepalives_idle", 30)
    params.setdefault("keepalives_interval", 10)
    params.setdefault("keepalives_count", 3)
    params.setdefault("connect_timeout", 10)
    return params


def session_name(ours: str, theirs: str | None) -> str:
    """The worker's connection name, with an `application_name` from OPTIONS after it.

    Monitoring, the tests and the docs find a worker's sessions by `pgqueue <role> <id>`
    at the start of the name, so a project-wide name in OPTIONS may not replace it; it is
    kept in parentheses. Cut to PostgreSQL's 63 bytes without splitting a character.
    """
    name = f"{ours} ({theirs})" if theirs else ours
    return name.encode()[:63].decode(errors="ignore")


def configure_session(conn: psycopg.Connection[Any], options: dict[str, Any]) -> None:
    """Pin READ COMMITTED and take on OPTIONS["assume_role"], as Django's connections do.

    The statements rely on READ COMMITTED (a fenced UPDATE re-checks the row a
    concurrent writer changed instead of failing); a database or role default of
    REPEATABLE READ or SERIALIZABLE must not reach them. The isolation is set only
    when the default differs (one round trip per connection either way), so a session
    behind a pooler is left as it was in the usual case.
    """
    for statement in session_statements(options):
        conn.execute(statement, prepare=False)


def session_statements(options: dict[str, Any]) -> list[str | sql.Composable]:
    """What `configure_session` runs, for a connection it cannot take (an async one)."""
    statements: list[str | sql.Composable] = [
        "SELECT set_config('default_transaction_isolation', 'read committed', false) "
        "WHERE current_setting('default_transaction_isolation') <> 'read committed'"
    ]
    if role := options.get("assume_role"):
        statements.append(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
    return statements


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


def wait_for(
    store: Connectable,
    stop: threading.Event,
    backoff: Backoff,
    what: str,
    deadline: float | None = None,
) -> bool:
    """Reconnect `store` with jittered backoff until it works, `stop` is set or the
    `deadline` (time.monotonic()) passes; True once connected."""
    while not stop.is_set():
        try:
            store.connect()
        except DatabaseUnavailable as exc:
            delay = backoff.next_delay()
            if deadline is not None:
                delay = min(delay, deadline - time.monotonic())
                if delay <= 0:
                    return False
            logger.warning("%s: database unavailable (%s); retrying in %.2fs", what, exc, delay)
            stop.wait(delay)
            continue
        if backoff.failures:
            logger.warning("%s: reconnected to the database", what)
        backoff.reset()
        return True
    return False
