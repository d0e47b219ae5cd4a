"""A job's attempts, oldest first, read-only, inline on the job's page.

Attempts are numbered across the job's whole history (an operator retry grants fresh
attempts, so its next attempt counts as 1 against the budget again); each row shows
both numbers, and its handler's return value.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.db.models import F, Model, QuerySet, Window
from django.db.models.functions import RowNumber
from django.http import HttpRequest
from django.utils.html import format_html

from ..models import Attempt, AttemptStatus, Job, Status
from .columns import EMPTY, column, span, when, when_text
from .databases import read_alias


def can(request: HttpRequest, model: type[Model], action: str) -> bool:
    """Tell whether the user holds the model's `action` permission (view, change, ...)."""
    opts = model._meta
    return request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")


class NoEditing:
    """For admins that only show: nothing to add, change or delete, whoever asks."""

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class AttemptInline(NoEditing, admin.TabularInline):
    """Every attempt of the job, oldest first, read-only, as one table (`template`): a
    row per attempt, with what it returned and its traceback below it (the traceback
    that killed a dead job open)."""

    model = Attempt
    fk_name = "job"
    extra = 0
    max_num = 0
    can_delete = False
    ordering = ("lease_version",)
    template = "admin/django_pgqueue/job/attempts.html"
    empty_value_display = EMPTY
    fields = (
        "number",
        "budget",
        "outcome",
        "worker_id",
        "started",
        "duration",
        "lease_version",
        "error",
        "result_display",
        "traceback_display",
    )
    # Shown on a row of their own under the attempt's row, when they have a value.
    detail_fields = ("result_display", "traceback_display")
    columns = len(fields) - len(detail_fields)
    readonly_fields = fields

    outcome = column("status", lambda attempt: attempt.get_status_display())
    started = column("started", "started_at", when)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return (
            super()
            .get_queryset(request)
            .using(read_alias(request))  # the job's database (?database=), or its replica
            .annotate(
                job_status=F("job__state__status"),
                job_lease_version=F("job__state__lease_version"),
                job_max_attempts=F("job__state__max_attempts"),
                # Claims of the job in order, across operator retries: the inline's
                # filter on the job is applied before the window is computed.
                number_in_job=Window(
                    RowNumber(), partition_by=F("job"), order_by=F("lease_version").asc()
                ),
            )
        )

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Whoever may see the job may see its attempts: no separate attempt permission.
        return can(request, self.parent_model, "view") or can(request, Job, "view")

    @admin.display(description="attempt")
    def number(self, attempt: Attempt) -> str:
        # Numbered across the job's whole history, operator retries included.
        return f"attempt {getattr(attempt, 'number_in_job', attempt.attempt_index)}"

    @admin.display(description="counted as")
    def budget(self, attempt: Attempt) -> str:
        # attempt_index starts again at 1 after an operator retry (fresh attempts).
        allowed = getattr(attempt, "job_max_attempts", None)
        return f"{attempt.attempt_index} of {allowed}" if allowed else str(attempt.attempt_index)

    @admin.display(description="error")
    def error(self, attempt: Attempt) -> str:
        if not attempt.error_class and not attempt.error_message:
            return EMPTY
        # The class without its module path, as the dead jobs list shows it (a dotted
        # path is one word too long for the column); the whole text is the tooltip.
        short_class = (attempt.error_class or "").rsplit(".", 1)[-1]
        # A snoozed attempt's is why the handler gave it back (a durable sleep, an
        # event wait), not an error: shown quietly.
        given_back = attempt.status == AttemptStatus.SNOOZED
        return format_html(
            '<span class="{}" title="{}">{}</span>',
            "pgqueue-given-back" if given_back else "pgqueue-error",
            ": ".join(part for part in (attempt.error_class, attempt.error_message) if part),
            ": ".join(part for part in (short_class, attempt.error_message) if part),
        )

    @admin.display(description="returned")
    def result_display(self, attempt: Attempt) -> str:
        # Nothing (not the empty mark) when there is nothing: the row is left out then.
        if attempt.result is None:
            return ""
        text = json.dumps(attempt.result, indent=2, ensure_ascii=False)
        return format_html(
            '<span class="pgqueue-detail-label">returned</span><pre class="pgqueue-result">{}'
            "</pre>",
            text,
        )

    @admin.display(description="took")
    def duration(self, attempt: Attempt) -> str:
        if attempt.finished_at is None:
            return EMPTY
        return format_html(
            '<span title="finished {}">{}</span>',
            when_text(attempt.finished_at),
            span((attempt.finished_at - attempt.started_at).total_seconds()),
        )

    @admin.display(description="traceback")
    def traceback_display(self, attempt: Attempt) -> str:
        if not attempt.traceback:
            return ""
        # Open the traceback that killed a dead job (its final claim); the job's status
        # and lease version come with the attempts, in the same query.
        fatal = (
            getattr(attempt, "job_status", None) == Status.DEAD
            and getattr(attempt, "job_lease_version", None) == attempt.lease_version
        )
        return format_html(
            '<details class="pgqueue-traceback"{}><summary>traceback</summary><pre>{}</pre>'
            "</details>",
            " open" if fatal else "",
            attempt.traceback,
        )
