"""Cursors on the caller's Django connection, for enqueue and operator statements."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from threading import get_ident
from typing import Any

import psycopg
from django.db import connections

from ..sql import QUERIES


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
    connection, binding on the server, kept for the next call, with what Django's
    cursor wrapper would check and translate kept (health check, thread sharing, a
    transaction broken by an earlier error, database errors raised as Django's). When
    Django logs queries (DEBUG, CaptureQueriesContext) or a project installed
    execute_wrappers, it goes through `django_cursor` instead, so both see the
    statement; so does the first statement of a connection (Django opens it).
    """
    db = connections[alias]
    raw = db.connection
    if db.queries_logged or db.execute_wrappers or not isinstance(raw, psycopg.Connection):
        with django_cursor(alias) as cursor:
            cursor.execute(query, params)
            return cursor.fetchone()
    if db.health_check_enabled and not db.health_check_done:  # else the check does nothing
        db.close_if_health_check_failed()
    # Opens nothing (the connection is open), but keeps Django's guards: it is
    # async_unsafe (SynchronousOnlyOperation from an event loop's thread) and it is
    # where test runners block database access.
    db.ensure_connection()
    raw = db.connection  # reopened if the health check closed it
    thread = get_ident()
    if db._thread_ident != thread:  # the thread that made it passes without the lock
        db.validate_thread_sharing()
    db.validate_no_broken_transaction()
    with db.wrap_database_errors:
        cursor = _kept_cursor(db, raw, thread)
        cursor.execute(query, params)
        return cursor.fetchone()


def _kept_cursor(db: Any, raw: psycopg.Connection, thread: int) -> psycopg.Cursor:
    """A cursor on `raw` kept on Django's wrapper `db`, used only by the thread `thread`
    that made it (a connection shared between threads gives each its own)."""
    kept = db.__dict__.get("_pgqueue_cursor")
    if kept is not None and kept[0].connection is raw and kept[1] == thread:
        return kept[0]
    cursor = psycopg.Cursor(raw)
    db.__dict__["_pgqueue_cursor"] = (cursor, thread)
    return cursor


def fetch_all(alias: str, name: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """Run the statement `name` on Django's own cursor for `alias`; return all rows."""
    # Django's own cursor, which binds on the client: these statements have optional
    # filters ("%(queue)s IS NULL OR ...") and a LIMIT that the planner should see as
    # values, and they run rarely, so an inlined plan beats a reusable generic one.
    with connections[alias].cursor() as cursor:
        cursor.execute(QUERIES[name], params or {})
        return cursor.fetchall() if cursor.description else []


def fetch_after(
    alias: str, first: str, name: str, params: dict[str, Any] | None = None
) -> list[tuple[Any, ...]]:
    """Run the statement `first`, then `name`, in one round trip; return `name`'s rows.

    Sent as one query text, the two run in one transaction (implicit, or the caller's):
    a setting `first` makes local to it holds while `name` is planned and run.
    """
    with connections[alias].cursor() as cursor:
        cursor.execute(f"{QUERIES[first]};\n{QUERIES[name]}", params or {})
        cursor.nextset()
        return cursor.fetchall()
