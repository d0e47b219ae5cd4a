"""Django connection hygiene for handler threads between jobs.

A handler thread keeps its Django connections across jobs (reconnecting per job costs
more than most jobs); these decide when one is checked, replaced or closed.
"""

from __future__ import annotations

import select

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper


def health_check_on_first_use() -> None:
    """Have Django check each kept connection of this thread before its first query of
    the next job if the server may have dropped it meanwhile, and replace it if so.

    Django's own health check (CONN_HEALTH_CHECKS) costs one round trip, so it is armed
    only when the connection's socket has something to read while the connection is
    idle: a server that ends a session (a restart, `pg_terminate_backend`, an idle
    timeout) says so and closes the socket, which makes it readable. A connection the
    server dropped between jobs would otherwise fail that job and spend an attempt.
    `reset_django_connections` does the same after each job; this is for a thread
    that then waited for work.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None:
            _arm_health_check(conn)


def _arm_health_check(conn: BaseDatabaseWrapper) -> None:
    if not _socket_quiet(conn.connection):
        conn.health_check_enabled = True
        conn.health_check_done = False


def _socket_quiet(raw: object) -> bool:
    """True if `raw`'s socket has nothing to read (no error, no end of stream) right now;
    False when unknown (a driver without `fileno`, a closed connection)."""
    try:
        fd = raw.fileno()  # type: ignore[attr-defined]
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    except Exception:
        return False


def close_unusable_django_connections() -> None:
    """Close this thread's Django connections that no longer answer a query."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.is_usable():
            conn.close()


def reset_django_connections() -> None:
    """Keep a handler thread's Django connections across jobs, unless one is broken.

    Django closes connections per request according to CONN_MAX_AGE; a worker has no
    requests, and reconnecting per job costs more than most jobs. A connection is
    dropped only when it saw an error and no longer answers, or when the handler left a
    transaction open. A kept one is health-checked on first use if the server may have
    dropped it while the job ran (see `health_check_on_first_use`).
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        if conn.in_atomic_block or not conn.get_autocommit():
            conn.close()  # a transaction left open by a handler: roll it back
        elif conn.errors_occurred and not conn.is_usable():
            conn.close()
        else:
            conn.errors_occurred = False
            _arm_health_check(conn)
