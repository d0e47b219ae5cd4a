"""The Batches admin page: each batch's name, member counts, state and callbacks.

Read-only: a batch is written by its ``batch()`` block, and its members and callbacks
are jobs, retried or cancelled on the jobs pages. The counts are one grouped join
per page (``queue_batch_jobs`` to the members' state rows); the callbacks one
aggregated subquery per batch row of the page.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery, TextField, Value

try:  # Django 6.0+: the general aggregate, its delimiter an expression
    from django.db.models import StringAgg

    COMMA: Any = Value(",")
except ImportError:  # Django 5.2: PostgreSQL's, its delimiter a string
    from django.contrib.postgres.aggregates import StringAgg

    COMMA = ","
from django.db.models.functions import Cast, Concat
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html_join

from ..models import Batch, WorkflowStep
from .columns import badge, when_short

UNFINISHED = ("waiting", "pending", "running")


def batch_state(unfinished: int, dead: int, cancelled: int) -> str:
    """ "running" while a member is unfinished, then "succeeded" or "discarded"."""
    if unfinished:
        return "running"
    return "discarded" if dead or cancelled else "succeeded"


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin):
    list_display = ("name", "created", "size", "completed", "dead", "cancelled",
                    "unfinished", "state", "callbacks")  # fmt: skip
    list_display_links = None
    search_fields = ("name",)
    ordering = ("-id",)
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Batch]:
        status = "members__job__state__status"
        callbacks = (
            WorkflowStep.objects.filter(workflow_id=OuterRef("workflow_id"))
            .values("workflow_id")
            .annotate(
                listed=StringAgg(
                    Concat(
                        "name",
                        Value(":"),
                        Cast("job_id", TextField()),
                        Value(":"),
                        "job__state__status",
                        output_field=TextField(),
                    ),
                    COMMA,
                    order_by="job_id",
                )
            )
            .values("listed")
        )
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_completed=Count("members", filter=Q(**{status: "completed"})),
                n_dead=Count("members", filter=Q(**{status: "dead"})),
                n_cancelled=Count("members", filter=Q(**{status: "cancelled"})),
                n_unfinished=Count("members", filter=Q(**{f"{status}__in": UNFINISHED})),
                callback_list=Subquery(callbacks),
            )
        )

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: Any) -> str:
        return when_short(obj.created_at)

    @admin.display(description="completed")
    def completed(self, obj: Any) -> int:
        return int(obj.n_completed)

    @admin.display(description="dead")
    def dead(self, obj: Any) -> int:
        return int(obj.n_dead)

    @admin.display(description="cancelled")
    def cancelled(self, obj: Any) -> int:
        return int(obj.n_cancelled)

    @admin.display(description="unfinished")
    def unfinished(self, obj: Any) -> int:
        return int(obj.n_unfinished)

    @admin.display(description="state")
    def state(self, obj: Any) -> str:
        return badge(batch_state(obj.n_unfinished, obj.n_dead, obj.n_cancelled))

    @admin.display(description="callbacks (fired: not waiting, not cancelled)")
    def callbacks(self, obj: Any) -> str:
        if not obj.callback_list:
            return "-"
        rows = [item.split(":") for item in obj.callback_list.split(",")]
        return format_html_join(
            " ",
            '<a href="{}">{}</a> {}',
            (
                (
                    reverse("admin:django_pgqueue_job_change", args=[job_id]),
                    event,
                    badge(status),
                )
                for event, job_id, status in rows
            ),
        )
