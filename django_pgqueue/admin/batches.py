"""The Batches admin page: each batch's name, member counts, state and callbacks.

Read-only: a batch is written by its ``batch()`` block, and its members and callbacks
are jobs, retried or cancelled on the jobs pages. The counts are one grouped join
per page (``queue_batch_jobs`` to the members' state rows); the callbacks one
aggregated subquery per batch row of the page. With several queue databases the list
shows one at a time (the database filter), read from its replica if it has one.
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
from django.utils.html import format_html, format_html_join

from ..models import Batch, WorkflowStep
from .columns import EMPTY, badge, when_short
from .databases import (
    admin_database,
    read_alias,
    with_database,
)
from .job_rows import JobRowsAdmin

UNFINISHED = ("waiting", "pending", "running")
# A batch's state as the Workflows pages colour a workflow's (workflows.css).
STATE_COLOURS = {"running": "running", "succeeded": "finished", "discarded": "failed"}


def batch_state(unfinished: int, dead: int, cancelled: int) -> str:
    """ "running" while a member is unfinished, then "succeeded" or "discarded"."""
    if unfinished:
        return "running"
    return "discarded" if dead or cancelled else "succeeded"


def member_counts(obj: Any) -> list[tuple[str, int]]:
    """A batch row's members by status, the finished first (those that it has)."""
    counts = (("completed", obj.n_completed), ("dead", obj.n_dead),
              ("cancelled", obj.n_cancelled), ("unfinished", obj.n_unfinished))  # fmt: skip
    return [(status, int(count)) for status, count in counts if count]


@admin.register(Batch)
class BatchAdmin(JobRowsAdmin):
    list_title = "Batches"
    list_display = ("batch", "state", "progress", "members", "callbacks", "created")
    search_fields = ("name",)
    ordering = ("-id",)

    class Media:
        css = {"all": ("django_pgqueue/workflows.css",)}  # after the base's admin.css

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
            .using(read_alias(request))  # ?database=, or its replica
            .annotate(
                # Which queue database the row's links show (its workflow, its callbacks).
                pgqueue_database=Value(admin_database(request), output_field=TextField()),
                n_completed=Count("members", filter=Q(**{status: "completed"})),
                n_dead=Count("members", filter=Q(**{status: "dead"})),
                n_cancelled=Count("members", filter=Q(**{status: "cancelled"})),
                n_unfinished=Count("members", filter=Q(**{f"{status}__in": UNFINISHED})),
                callback_list=Subquery(callbacks),
            )
        )

    @admin.display(description="batch", ordering="name")
    def batch(self, obj: Any) -> str:
        return format_html('<strong>{}</strong> <span class="pgqueue-quiet">#{}</span>',
                           obj.name, obj.pk)  # fmt: skip

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: Any) -> str:
        return when_short(obj.created_at)

    @admin.display(description="progress")
    def progress(self, obj: Any) -> str:
        """The members as the Workflows pages draw steps: a bar of the finished ones."""
        finished = obj.n_completed + obj.n_dead + obj.n_cancelled
        total = max(obj.size, 1)
        bar = format_html_join(
            "",
            '<span class="pgqueue-bar-{}" style="width: {}%" title="{} {}"></span>',
            (
                (status, round(100 * count / total, 2), count, status)
                for status, count in member_counts(obj)
                if status != "unfinished"
            ),
        )
        return format_html(
            '<span class="pgqueue-bar" role="img" aria-label="{} of {} members finished">{}'
            '</span> <span class="pgqueue-progress-text">{} / {}</span>',
            finished, obj.size, bar, finished, obj.size,
        )  # fmt: skip

    @admin.display(description="members")
    def members(self, obj: Any) -> str:
        counts = member_counts(obj)
        if not counts:
            return "none"
        return format_html_join(
            " · ",
            '<span class="pgqueue-count-{}">{} {}</span>',
            ((status, count, status) for status, count in counts),
        )

    @admin.display(description="state")
    def state(self, obj: Any) -> str:
        state = batch_state(obj.n_unfinished, obj.n_dead, obj.n_cancelled)
        return format_html(
            '<span class="pgqueue-status pgqueue-wf-{}">{}</span>', STATE_COLOURS[state], state
        )

    @admin.display(description="callbacks")
    def callbacks(self, obj: Any) -> str:
        if not obj.callback_list:
            return EMPTY
        rows = [item.split(":") for item in obj.callback_list.split(",")]
        # The callbacks are the steps of one workflow: its page draws them.
        workflow = format_html(
            '<a class="pgqueue-batch-workflow" href="{}">workflow #{}</a>',
            with_database(
                reverse("admin:django_pgqueue_workflow_change", args=[obj.workflow_id]),
                obj.pgqueue_database,
            ),
            obj.workflow_id,
        )
        events = format_html_join(
            " ",
            '<span class="pgqueue-nowrap"><a href="{}">{}</a> {}</span>',
            (
                (
                    with_database(
                        reverse("admin:django_pgqueue_job_change", args=[job_id]),
                        obj.pgqueue_database,
                    ),
                    event,
                    badge(status),
                )
                for event, job_id, status in rows
            ),
        )
        return format_html("{}: {}", workflow, events)
