"""The queue databases as the admin sees them: figures of each, read once per request.

With PGQUEUE["QUEUE_DATABASES"] the Queues page lists the queues of every queue
database, each naming its alias; reads go to `read_database(alias)` (READ_DATABASE, a
replica, for DATABASE's queues), whose staleness the page shows. Writes never do: a
queue's controls are written on `database_for(queue)`, its own database.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import DatabaseError
from django.http import HttpRequest

from ..conf import get_settings
from ..durations import format_seconds
from ..overview import Overview, collect_all
from ..store import operator as store


def overview(request: HttpRequest) -> Overview:
    """The figures of every queue database, read once per request."""
    cached = getattr(request, "_pgqueue_overview", None)
    if cached is None:
        cached = collect_all()
        request._pgqueue_overview = cached  # type: ignore[attr-defined]
    return cached


@dataclass(frozen=True)
class DatabaseRow:
    """A line of the page's databases table."""

    alias: str
    read_from: str
    up: bool
    # How stale the figures are: "not a replica", "4s", "unknown", or why unread.
    staleness: str


def staleness(alias: str) -> str:
    """How far behind the primary `alias` is, for people ("not a replica" on a primary)."""
    try:
        replica, lag = store.replica_lag(alias)
    except DatabaseError as exc:
        return f"not read: {str(exc).strip() or type(exc).__name__}"
    if not replica:
        return "not a replica"
    return "unknown (nothing replayed yet)" if lag is None else format_seconds(lag)


def database_rows(request: HttpRequest) -> list[DatabaseRow]:
    """One row per queue database: where it is read from, whether it is up, how stale."""
    rows = []
    for reading in overview(request).readings:
        lag = staleness(reading.read_from) if reading.up else f"not read: {reading.error}"
        rows.append(DatabaseRow(reading.alias, reading.read_from, reading.up, lag))
    return rows


def several_databases() -> bool:
    """Whether queues live on more than one database (the pages then name each one's)."""
    conf = get_settings()
    return len(conf.queue_databases) > 1 or conf.READ_DATABASE is not None
