"""Cursors on the caller's Django connection, for enqueue and operator statements."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connections

from ..sql import QUERIES

# None before Django opened the connection: then the slow path opens it (and the next
# call takes the fast one).
_PSYCOPG = psycopg.Connection


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


def fetch_one(alias: str, query: str, params: Any) -> tuple[Any, ...] | None:
    """Run `query` on Django's connection `alias` with the fewest client-side steps; one row.

    For the hottest statement (enqueue): a psycopg cursor straight on Django's
    connection, binding on the server, with what Django's cursor wrapper would check
    and translate kept (health check, thread sharing, a transaction broken by an
    earlier error, database errors raised as Django's). When Django logs queries
    (DEBUG, CaptureQueriesContext) or a project installed execute_wrappers, it goes
    through `django_cursor` instead, so both see the statement.
    """
    db = connections[alias]
    if db.queries_logged or db.execute_wrappers or not isinstance(db.connection, _PSYCOPG):
        with django_cursor(alias) as cursor:
            cursor.execute(query, params)
            return cursor.fetchone()
    db.close_if_health_check_failed()
    db.ensure_connection()
    db.validate_thread_sharing()
    db.validate_no_broken_transaction()
    with db.wrap_database_errors, psycopg.Cursor(db.connection) as cursor:
        cursor.execute(query, params)
        return cursor.fetchone()


def fetch_all(alias: str, name: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """Run the statement `name` on Django's own cursor for `alias`; return all rows."""
    # Django's own cursor, which binds on the client: these statements have optional
    # filters ("%(queue)s IS NULL OR ...") and a LIMIT that the planner should see as
    # values, and they run rarely, so an inlined plan beats a reusable generic one.
    with connections[alias].cursor() as cursor:
        cursor.execute(QUERIES[name], params or {})
        return cursor.fetchall() if cursor.description else []
