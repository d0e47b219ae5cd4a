"""The admin's Charts page, and what the queue's pages that are no model's list share
(`ReadOnlyPage`; the Workers page is `admin.workers`).

The Charts page reads the per-minute rollup only, never queue_attempts; with several
queue databases it charts one at a time (``?database=ALIAS``, kept in its links), read
from its replica if it has one.
"""

from __future__ import annotations

import datetime as dt
from functools import cache
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import DurationField, ExpressionWrapper, Min
from django.db.models.functions import Now, TruncMinute
from django.http import HttpRequest, HttpResponse
from django.template.loader import get_template
from django.template.response import TemplateResponse
from django.utils import timezone

from ..models import Job, MinuteStats
from ..observability import charts, rollup
from .attempts import NoEditing, can
from .databases import database_choice, read_alias

# The chart windows a page offers, in minutes, with their labels and the minutes each
# point sums. Without a choice in the URL the page shows the smallest window that holds
# all of the last day's rollup: a new install's first minutes fill a chart, not its edge.
WINDOWS = {15: "15 min", 60: "1 h", 360: "6 h", 1440: "24 h"}
STEPS = {15: 1, 60: 1, 360: 1, 1440: 5}
COMPLETED, FAILED, P50, P95 = "#2e7d32", "#b3261e", "#2f6fb0", "#b07d10"
BACKLOG = "#7e57c2"
# The vendored charting library (static/django_pgqueue/vendor/, with its licence).
UPLOT = "django_pgqueue/vendor/uplot-1.6.32/"


@cache
def breadcrumbs_as_list() -> bool:
    """Tell whether this Django's admin draws breadcrumbs as a list (6.x) or a div (5.2).

    Read from the admin's own base template, so the pages match whichever it is.
    """
    source = getattr(get_template("admin/base.html").template, "source", "")
    return 'ol class="breadcrumbs"' in source


class ReadOnlyPage(NoEditing, admin.ModelAdmin):  # type: ignore[type-arg]
    """A page, not a list of rows: nothing to add, change or delete."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Whoever may view jobs may view who runs them and how the queues fare.
        return super().has_view_permission(request, obj) or can(request, Job, "view")

    def page(self, request: HttpRequest, template: str, **context: Any) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return TemplateResponse(
            request,
            template,
            {
                **self.admin_site.each_context(request),
                "opts": self.model._meta,
                "title": self.model._meta.verbose_name_plural.capitalize(),
                "breadcrumbs_as_list": breadcrumbs_as_list(),
                **context,
            },
        )


def chosen_window(request: HttpRequest) -> int | None:
    """The window the URL asks for, in minutes (?minutes=60, or ?hours=1), if one is offered."""
    for name, scale in (("minutes", 1), ("hours", 60)):
        raw = request.GET.get(name, "")
        if raw.isascii() and raw.isdigit() and int(raw) * scale in WINDOWS:
            return int(raw) * scale
    return None


def fitting_window(alias: str) -> int:
    """The smallest offered window that holds every rollup minute of the last day on `alias`.

    One query: the age of the oldest such minute by the database's clock, in whole
    minutes (a window of `size` minutes reads the minutes after its start).
    """
    now_minute = TruncMinute(Now())
    age = (
        MinuteStats.objects.using(alias)
        .filter(minute__gt=now_minute - dt.timedelta(days=1))
        .aggregate(age=ExpressionWrapper(now_minute - Min("minute"), output_field=DurationField()))[
            "age"
        ]
    )
    if age is None:
        return max(WINDOWS)
    minutes = age.total_seconds() / 60
    return next((size for size in sorted(WINDOWS) if size > minutes), max(WINDOWS))


@admin.register(MinuteStats)
class ChartsAdmin(ReadOnlyPage):
    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        choice = database_choice(request, request.path)
        read_from = read_alias(request)
        minutes = chosen_window(request) or fitting_window(read_from)
        wanted = request.GET.get("queue") or None
        window = rollup.read_window(read_from, minutes, STEPS[minutes])
        shown = [s for s in window.queues if wanted is None or s.queue == wanted]
        rows, drawn = [], []
        for series in shown:
            assert window.start is not None
            specs = queue_charts(series, window.start, window.step)
            rows.append(
                {
                    "series": series,
                    "completed": sum(series.completed),
                    "failed": sum(series.failed),
                    # Each chart's place in the page's JSON, two charts to a line.
                    "pairs": [
                        range(len(drawn), len(drawn) + 2),
                        range(len(drawn) + 2, len(drawn) + 4),
                    ],
                }
            )
            drawn += specs
        zone = timezone.get_current_timezone()
        return self.page(
            request,
            "admin/django_pgqueue/charts.html",
            rows=rows,
            minutes=minutes,
            window_label=WINDOWS[minutes],
            windows=WINDOWS.items(),
            queue=wanted,
            queues=[s.queue for s in window.queues],
            database_choice=choice,
            keep=choice.keep if choice else "",
            charts={
                "charts": drawn,
                "zone": str(zone),
                "zone_label": timezone.localtime(timezone=zone).strftime("%Z"),
            },
            uplot=UPLOT,
        )


def queue_charts(series: rollup.QueueSeries, start: dt.datetime, step: int) -> list[Any]:
    """A queue's four charts, in the page's order: jobs per minute and the backlog, then
    the wait and the run time."""
    per = "minute" if step == 1 else f"{step} minutes"
    return [
        charts.line_chart(
            f"{series.queue}: jobs per {per}",
            start,
            [
                charts.Series("completed", COMPLETED, series.completed),
                charts.Series("failed", FAILED, series.failed),
            ],
            step=step,
        ),
        charts.line_chart(
            f"{series.queue}: backlog (jobs due, not started)",
            start,
            [charts.Series("due", BACKLOG, series.backlog)],
            step=step,
        ),
        percentiles(f"{series.queue}: wait from due to start", start, step,
                    series.wait_p50, series.wait_p95),
        percentiles(f"{series.queue}: run time", start, step, series.run_p50, series.run_p95),
    ]  # fmt: skip


def percentiles(title: str, start: dt.datetime, step: int,
                p50: list[float | None], p95: list[float | None]) -> Any:  # fmt: skip
    """A chart of p50 and p95 seconds."""
    series = [charts.Series("p50", P50, p50), charts.Series("p95", P95, p95)]
    return charts.line_chart(title, start, series, charts.seconds_label, step=step)
