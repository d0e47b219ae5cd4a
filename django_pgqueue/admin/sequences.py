"""The Held sequences admin page: the sequences a dead job holds back, and their release.

A sequence is held when its head (the one job of it allowed to run) ended dead with
``sequence_on_failure="hold"``: its later jobs wait. The page lists those, oldest death
first, with the head's type, error and how many jobs wait behind it. An operator either
retries the head on its job page (it runs again, first) or releases the sequence here:
the head stays dead and the next job runs (`django_pgqueue.sequences.release`, one
statement per sequence under its row lock, behind ``django_pgqueue.operate_job``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.text import Truncator

from .. import sequences
from ..models import Job, JobState, Sequence
from .columns import EMPTY, badge, when_short
from .databases import (
    admin_database,
    read_alias,
    read_from_to_database,
    with_database,
)
from .job_rows import JobRowsAdmin
from .operations import OPERATE_PERMISSION


def held_sequences(alias: str) -> QuerySet[Sequence]:
    """The sequences of database `alias` whose head is dead and holds the rest back,
    each with its head's type, death and error and the number of jobs waiting."""
    head = JobState.objects.using(alias).filter(pk=OuterRef("head_job_id"))
    job = Job.objects.using(alias).filter(pk=OuterRef("head_job_id"))
    waiting = (
        JobState.objects.using(alias)
        .filter(queue=OuterRef("queue"), sequence_key=OuterRef("sequence_key"), status="waiting")
        .order_by()
        .values("sequence_key")
        .annotate(n=Count("pk"))
        .values("n")
    )
    held = JobState.objects.using(alias).filter(status="dead", sequence_on_failure="hold")
    return (
        Sequence.objects.using(alias)
        .filter(head_job_id__in=held.values("pk"))
        .annotate(
            head_type=Subquery(job.values("type")),
            failed_at=Subquery(head.values("finished_at")),
            error=Subquery(head.values("last_error")),
            waiting=Coalesce(Subquery(waiting, output_field=IntegerField()), 0),
        )
    )


@admin.register(Sequence)
class HeldSequenceAdmin(JobRowsAdmin):
    list_title = "Held sequences"
    list_display = ("sequence", "queue", "head", "failed", "error_message", "waiting_jobs")
    search_fields = ("sequence_key",)
    actions = ["release"]

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(OPERATE_PERMISSION)

    def get_ordering(self, request: HttpRequest) -> tuple[str, ...]:
        return ("failed_at", "head_job_id")  # oldest death first (annotations)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Sequence]:
        return held_sequences(read_alias(request))  # ?database=, or its replica

    @admin.display(description="sequence", ordering="sequence_key")
    def sequence(self, obj: Any) -> str:
        return format_html("<strong>{}</strong>", obj.sequence_key)

    @admin.display(description="held by")
    def head(self, obj: Any) -> str:
        url = reverse("admin:django_pgqueue_job_change", args=[obj.head_job_id])
        return format_html(
            '<a href="{}">#{}</a> {} {}',
            with_database(url, read_from_to_database(obj._state.db)),
            obj.head_job_id,
            obj.head_type,
            badge("dead"),
        )

    @admin.display(description="died", ordering="failed_at")
    def failed(self, obj: Any) -> str:
        return when_short(obj.failed_at)

    @admin.display(description="error")
    def error_message(self, obj: Any) -> str:
        return Truncator(obj.error or "").chars(120) or EMPTY

    @admin.display(description="waiting behind it", ordering="waiting")
    def waiting_jobs(self, obj: Any) -> int:
        return obj.waiting

    @admin.action(
        description="Release the selected sequences (the dead job stays dead; the next runs)",
        permissions=["operate"],
    )
    def release(self, request: HttpRequest, queryset: QuerySet[Sequence]) -> None:
        alias = admin_database(request)
        released, gone = [], []
        for held in queryset:
            job = sequences.release(held.queue, held.sequence_key, using=alias)
            (released if job is not None else gone).append(held.sequence_key)
        if released:
            self.message_user(
                request,
                f"Released {len(released)} sequence(s): {', '.join(released)}. Their next "
                "jobs run; the dead jobs stay dead (retry them on their pages to run them).",
                messages.SUCCESS,
            )
        if gone:
            self.message_user(
                request,
                f"{len(gone)} sequence(s) were no longer held (their head was retried or "
                f"released meanwhile): {', '.join(gone)}.",
                messages.WARNING,
            )
