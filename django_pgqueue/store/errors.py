"""What a database error means to the worker, decided from its SQLSTATE and the
connection's state, never from its Python class alone.

psycopg maps serialization failures (40001), deadlocks (40P01), lock timeouts
(55P03) and cancelled queries (57014) to subclasses of `OperationalError`, like a
lost connection: treating every `OperationalError` as "connection lost" would
reconnect for nothing and leave writes in doubt that never were.
"""

from __future__ import annotations

from typing import Any

import psycopg

# The session is gone: reconnect; a write under way may or may not have committed.
LOST = "lost"
# The same statement may well succeed if written again (after a pause).
TRANSIENT = "transient"
# PostgreSQL refused a value the statement carried (a result, an error text).
VALUE = "value"
# A prepared statement the server does not know: a transaction-mode pooler.
UNPREPARED = "unprepared"
# Anything else: written again a bounded number of times, then given up on.
OTHER = "other"

_LOST_STATES = {"57P01", "57P02", "57P03"}  # admin/crash shutdown, cannot connect now
_TRANSIENT_STATES = {"55P03", "57014"}  # lock_not_available, query_canceled
_TRANSIENT_CLASSES = {"40", "53"}  # transaction rollback, insufficient resources
_VALUE_STATES = {
    "22P02",  # invalid_text_representation (e.g. invalid JSON)
    "22P05",  # untranslatable_character (\u0000 in jsonb)
    "22021",  # character_not_in_repertoire (invalid UTF-8)
    "22003",  # numeric_value_out_of_range (a JSON number past numeric's range)
    "22030",  # duplicate_json_object_key_value
    "22032",  # invalid_json_text
    "54000",  # program_limit_exceeded (a jsonb value too large)
}


def classify(exc: BaseException, conn: psycopg.Connection[Any] | None = None) -> str:
    """LOST, TRANSIENT, VALUE, UNPREPARED or OTHER, for an error raised on `conn`."""
    if conn is not None and (conn.closed or conn.broken):
        return LOST
    state = getattr(exc, "sqlstate", None)
    if state is None:
        # No SQLSTATE: not the server's answer to a statement. A connection-level
        # failure (the socket closed, the connection attempt refused) or a misuse.
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            return LOST
        return OTHER
    if state.startswith("08") or state in _LOST_STATES:
        return LOST
    if state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES:
        return TRANSIENT
    if state == "26000":
        return UNPREPARED
    if state in _VALUE_STATES:
        return VALUE
    return OTHER


def describe(exc: BaseException) -> str:
    """The class path, SQLSTATE and first line of an error, for logs and failure records."""
    cls = type(exc)
    state = getattr(exc, "sqlstate", None)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (
        f"{cls.__module__}.{cls.__qualname__}"
        + (f" [{state}]" if state else "")
        + (f": {first}" if first else "")
    )


def class_path(exc: BaseException) -> str:
    """The error's class as a dotted path (psycopg.errors.DeadlockDetected)."""
    cls = type(exc)
    return f"{cls.__module__}.{cls.__qualname__}"
