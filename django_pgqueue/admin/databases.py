"""The queue databases as the admin sees them: figures of each, read once per request.

With PGQUEUE["QUEUE_DATABASES"] the Queues page lists the queues of every queue
database, each naming its alias; reads go to `read_database(alias)` (READ_DATABASE, a
replica, for DATABASE's queues), whose staleness the page shows. Writes never do: a
queue's controls are written on `database_for(queue)`, its own database.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import admin
from django.core.exceptions import BadRequest
from django.db import DatabaseError
from django.db.models import QuerySet
from django.http import HttpRequest, QueryDict
from django.utils.http import urlencode
from django.utils.text import Truncator

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


# The query parameter that picks the queue database a jobs list (or page) shows.
DATABASE_VAR = "database"


def admin_database(request: HttpRequest) -> str:
    """The queue database a page shows: ``?database=ALIAS``, or the one the list it was
    opened from showed (Django's ``_changelist_filters``), else DATABASE."""
    conf = get_settings()
    wanted = request.GET.get(DATABASE_VAR)
    if wanted is None:
        wanted = QueryDict(request.GET.get("_changelist_filters", "")).get(DATABASE_VAR)
    if wanted is None:
        return conf.DATABASE
    if wanted not in conf.queue_databases:
        raise BadRequest(
            f"database must be one of {', '.join(conf.queue_databases)}; "
            f"got {Truncator(repr(wanted)).chars(40)}."
        )
    return wanted


def preserved_filters(request: HttpRequest, preserved: str) -> str:
    """Django's preserved filters of an object's page (`preserved`: what ModelAdmin's
    `get_preserved_filters` gives), with the page's ``?database=`` when it was opened
    by hand, not from a list: its delete link, its form and their redirects stay on
    that database."""
    if preserved or DATABASE_VAR not in request.GET:
        return preserved
    return urlencode({"_changelist_filters": urlencode({DATABASE_VAR: request.GET[DATABASE_VAR]})})


def read_alias(request: HttpRequest) -> str:
    """Where the lists and counts of the page's database are read (its replica, if any)."""
    return get_settings().read_database(admin_database(request))


def read_from_to_database(read_from: str | None) -> str:
    """The queue database whose lists are read from `read_from` (a row's ``_state.db``)."""
    conf = get_settings()
    if read_from is None or read_from == conf.READ_DATABASE:
        return conf.DATABASE
    return read_from


def with_database(url: str, alias: str) -> str:
    """`url` showing the rows of `alias`: ``?database=ALIAS`` added unless it is DATABASE
    (with one database, links stay as they were)."""
    if alias == get_settings().DATABASE:
        return url
    return url + ("&" if "?" in url else "?") + urlencode({DATABASE_VAR: alias})


def database_query(alias: str) -> str:
    """``database=ALIAS&`` for a page's links to `alias`'s rows to begin their query with
    ("" on DATABASE), as `with_database` adds it."""
    return "" if alias == get_settings().DATABASE else urlencode({DATABASE_VAR: alias}) + "&"


@dataclass(frozen=True)
class DatabaseChoice:
    """The queue database a page shows, the others it offers, and how stale its reads are."""

    alias: str
    read_from: str
    staleness: str
    # (alias, the page's URL showing it, whether it is the one shown) for each database.
    choices: list[tuple[str, str, bool]]
    # "database=ALIAS&" for the page's own links to begin their query with ("" on DATABASE).
    keep: str


def database_choice(request: HttpRequest, url: str) -> DatabaseChoice | None:
    """What a page over one queue database at a time shows of that choice, at `url` (its
    address without a query), or None with one database (nothing to choose)."""
    alias = admin_database(request)  # a bad ?database= is refused before reading anything
    if not several_databases():
        return None
    conf = get_settings()
    read_from = conf.read_database(alias)
    choices = [(a, with_database(url, a), a == alias) for a in conf.queue_databases]
    return DatabaseChoice(alias, read_from, staleness(read_from), choices, database_query(alias))


class DatabaseFilter(admin.SimpleListFilter):
    """Which queue database a jobs list shows (offered once queues live on several).

    A list spans one database: the model admin's queryset is switched to it
    (`admin_database`); the filter itself only offers the choice and keeps it in links.
    """

    title = "database"
    parameter_name = DATABASE_VAR

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        aliases = get_settings().queue_databases
        return [(alias, alias) for alias in aliases] if len(aliases) > 1 else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset  # the model admin's get_queryset already reads that database
