"""The admin's Workers and Charts pages (registered by an import in admin/__init__.py).

Both are read-only pages on their models' changelist URLs. The Workers page reads the
small registry table and the running jobs through the running-rows index; the Charts
page reads the per-minute rollup only, never queue_attempts.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from ..conf import get_settings
from ..models import Job, MinuteStats, WorkerRecord
from ..observability import charts, rollup, workers
from .attempts import NoEditing, can

# The chart windows a page offers, in hours, and the minutes each point sums.
WINDOWS = (1, 6, 24)
STEPS = {1: 1, 6: 1, 24: 5}
DEFAULT_WINDOW = 6
COMPLETED, FAILED, P50, P95 = "#2e7d32", "#b3261e", "#2f6fb0", "#b07d10"


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
                **context,
            },
        )


@admin.register(WorkerRecord)
class WorkersAdmin(ReadOnlyPage):
    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        found = workers.list_workers(get_settings().DATABASE)
        return self.page(
            request,
            "admin/django_pgqueue/workers.html",
            workers=found,
            alive=sum(1 for w in found if w.alive),
            gone=sum(1 for w in found if not w.alive),
        )


@admin.register(MinuteStats)
class ChartsAdmin(ReadOnlyPage):
    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        try:
            hours = int(request.GET.get("hours", DEFAULT_WINDOW))
        except ValueError:
            hours = DEFAULT_WINDOW
        if hours not in WINDOWS:
            hours = DEFAULT_WINDOW
        wanted = request.GET.get("queue") or None
        window = rollup.read_window(get_settings().DATABASE, hours * 60, STEPS[hours])
        shown = [s for s in window.queues if wanted is None or s.queue == wanted]
        rows = []
        for series in shown:
            assert window.start is not None
            rows.append(
                {
                    "series": series,
                    "completed": sum(series.completed),
                    "failed": sum(series.failed),
                    "throughput": charts.line_chart(
                        f"{series.queue}: jobs per minute"
                        if window.step == 1
                        else f"{series.queue}: jobs per {window.step} minutes",
                        window.start,
                        [
                            charts.Series("completed", COMPLETED, series.completed),
                            charts.Series("failed", FAILED, series.failed),
                        ],
                        step=window.step,
                    ),
                    "wait": charts.line_chart(
                        f"{series.queue}: wait from due to start",
                        window.start,
                        [
                            charts.Series("p50", P50, series.wait_p50),
                            charts.Series("p95", P95, series.wait_p95),
                        ],
                        charts.seconds_label,
                        step=window.step,
                    ),
                }
            )
        return self.page(
            request,
            "admin/django_pgqueue/charts.html",
            rows=rows,
            hours=hours,
            windows=WINDOWS,
            queue=wanted,
            queues=[s.queue for s in window.queues],
        )
