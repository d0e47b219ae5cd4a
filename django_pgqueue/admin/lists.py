"""What keeps the list pages fast on millions of jobs: the count and the filters.

The total is estimated instead of counted, and filter choices come from the small
partial indexes that feed the at-a-glance figures and from index skip scans
(`known_queues`, the job types), never from a SELECT DISTINCT over the table.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ORDER_VAR, PAGE_VAR
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.text import Truncator
from rangefilter.filters import DateTimeRangeFilter

from ..registry import registry
from ..stats import Snapshot, collect
from ..store import operator as store
from .databases import DatabaseFilter, read_alias

__all__ = ["DatabaseFilter", "read_alias"]  # the jobs lists' filter and reads, with these

# Rows a filtered list page counts; past that it says "more than" (20 pages of 100).
EXACT_COUNT_LIMIT = 2_000
# Most job types the filters walk in the jobs table (one index probe each).
KNOWN_TYPES_LIMIT = 500


def snapshot(request: HttpRequest) -> Snapshot:
    """Read the at-a-glance figures once per request (the panel and the filters share them)."""
    cached = getattr(request, "_pgqueue_snapshot", None)
    if cached is None:
        cached = collect(read_alias(request))  # the page's database, or its replica
        request._pgqueue_snapshot = cached  # type: ignore[attr-defined]
    return cached


def known_names(request: HttpRequest) -> tuple[list[str], list[str]]:
    """Read the job types and queues of the jobs and the features once per request."""
    cached = getattr(request, "_pgqueue_names", None)
    if cached is None:
        cached = store.known_names(read_alias(request), KNOWN_TYPES_LIMIT)
        request._pgqueue_names = cached  # type: ignore[attr-defined]
    return cached


def known_queues(request: HttpRequest) -> list[str]:
    """Name every queue the admin knows of, sorted.

    Queues with unfinished or failed jobs (the figures), with controls, served by a
    registered worker, fed by a schedule, in the last day's rollup, or holding the
    newest job of a type: each read from an index or a small table.
    """
    return sorted(set(known_names(request)[1]) | set(snapshot(request).queue_names))


class EstimatedCountPaginator(Paginator):
    """A paginator that never counts more than EXACT_COUNT_LIMIT rows.

    An unfiltered list is given its total (`total`: the table estimate for all jobs,
    the exact figure for dead jobs, both already read for the at-a-glance figures).
    A filtered list is counted up to the limit; past it the page says "more than".
    `approximate` tells the template which wording to use.
    """

    approximate: str = ""

    def __init__(
        self,
        *args: Any,
        total: Callable[[], tuple[int | None, bool]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._total = total

    @cached_property
    def count(self) -> int:
        if self._total is not None:
            value, exact = self._total()
            if value is not None and exact:
                return value
            if value is not None and value > EXACT_COUNT_LIMIT:
                self.approximate = "about"
                return value
        queryset: QuerySet[Any] = self.object_list  # type: ignore[assignment]
        capped = queryset.order_by().values("pk")[: EXACT_COUNT_LIMIT + 1].count()
        if capped > EXACT_COUNT_LIMIT:
            self.approximate = "more than"
            return EXACT_COUNT_LIMIT
        return capped


def unfiltered(request: HttpRequest) -> bool:
    """Tell whether a list page shows its whole list: no filter and no search, any page."""
    return not set(request.GET) - {PAGE_VAR, ORDER_VAR}


class _NameFilter(admin.SimpleListFilter):
    """A filter by one name column (`parameter_name`): the names `names` knows, sorted,
    and the one asked for."""

    def names(self, request: HttpRequest) -> set[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = self.names(request)
        if self.value():
            names.add(self.value())
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(**{self.parameter_name: value}) if value else queryset


class QueueFilter(_NameFilter):
    """Every known queue (`known_queues`), not a DISTINCT scan; the one asked for too."""

    title = "queue"
    parameter_name = "queue"

    def names(self, request: HttpRequest) -> set[str]:
        return set(known_queues(request))


class TypeFilter(_NameFilter):
    """Registered job types and those of the jobs (``@task`` paths too), and the one asked for.

    The jobs' types come from a skip scan of the type index, one probe per type.
    """

    title = "type"
    parameter_name = "type"

    def names(self, request: HttpRequest) -> set[str]:
        registry.autodiscover()
        return set(registry.types()) | set(known_names(request)[0])


def positive_id(raw: str) -> int | None:
    """Read an id from the URL: a positive bigint, or None for anything else."""
    return int(raw) if raw.isascii() and raw.isdigit() and 0 < int(raw) < 2**63 else None


class WorkflowFilter(admin.SimpleListFilter):
    """The steps of one workflow (``?workflow=<id>``), a link from the workflow's page.

    Offered only when asked for: listing every workflow here would read the table.
    """

    title = "workflow"
    parameter_name = "workflow"

    def workflow_id(self) -> int | None:
        return positive_id(self.value() or "")

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        # Offered whenever asked for, so that a malformed id is applied (and matches
        # nothing) rather than dropped with the filter.
        raw = self.value()
        return [(raw, f"#{Truncator(raw).chars(24)}")] if raw else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() is None:
            return queryset
        wanted = self.workflow_id()
        # A malformed id matches nothing rather than everything.
        return queryset.filter(workflow_step__workflow_id=wanted if wanted else 0)


class TimeRangeFilter(DateTimeRangeFilter):
    """django-admin-rangefilter's date and time range, each field saying what it takes.

    Its own widgets put "From date" in the time field too; here the time fields say
    "from time" and name the admin's time zone, in which the range is read.
    """

    def _get_form_fields(self) -> Any:
        fields = super()._get_form_fields()
        zone = timezone.get_current_timezone_name()
        for name, side in ((self.lookup_kwarg_gte, "From"), (self.lookup_kwarg_lte, "To")):
            split = fields[name].widget
            # The split widget's own attributes override its parts' when it renders: its
            # "From date" would be both fields' placeholder.
            split.attrs = {k: v for k, v in split.attrs.items() if k != "placeholder"}
            date_widget, time_widget = split.widgets
            date_widget.attrs = {**date_widget.attrs, "placeholder": f"{side} date"}
            time_widget.attrs = {**time_widget.attrs, "placeholder": f"{side} time ({zone})"}
        return fields
