"""The two model admins: all jobs, and the dead jobs among them."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.translation import gettext
from rangefilter.filters import DateTimeRangeFilter

from .. import stats
from ..conf import get_settings
from ..models import Attempt, DeadJob, Job
from ..store import workflows
from .attempts import AttemptInline, can
from .columns import (
    EMPTY,
    attempts_of,
    badge,
    column,
    current_error,
    error_full,
    error_preview,
    state_field,
    state_of,
    status_summary,
    type_and_queue,
    when,
    when_short,
)
from .databases import admin_database, database_query, read_from_to_database, with_database
from .lists import (
    DatabaseFilter,
    EstimatedCountPaginator,
    QueueFilter,
    TypeFilter,
    WorkflowFilter,
    read_alias,
    snapshot,
    unfiltered,
)
from .operations import FORM_ACTION_FIELD, OperatorActionsMixin


def workflow_of(job: Job) -> tuple[int, str, str] | None:
    """The workflow `job` is a step of: (id, name, step name), read once per job object."""
    if not hasattr(job, "_pgqueue_workflow"):
        found = workflows.workflow_of_job(job._state.db or get_settings().DATABASE, job.pk)
        job._pgqueue_workflow = found  # type: ignore[attr-defined]
    return job._pgqueue_workflow  # type: ignore[attr-defined]


# Characters of an error's first line a list shows (the whole text is the tooltip).
ERROR_PREVIEW = 70
FINAL_ERROR_PREVIEW = 160


@admin.register(Job)
class JobAdmin(OperatorActionsMixin, admin.ModelAdmin):
    list_display = (
        "id",
        "job_column",
        "status_column",
        "run_at_column",
        "created_column",
        "last_error_short",
    )
    list_display_links = ("id",)
    list_filter = (
        DatabaseFilter,
        QueueFilter,
        ("state__status", admin.ChoicesFieldListFilter),
        TypeFilter,
        ("created_at", DateTimeRangeFilter),
        ("state__run_at", DateTimeRangeFilter),
        WorkflowFilter,
    )
    list_select_related = ("state",)
    search_fields = ("id__exact", "type__exact", "idempotency_key__exact")
    search_help_text = "Exact job id, job type or idempotency key."
    ordering = ("-id",)
    # Only the primary key orders the whole table through an index.
    sortable_by = ("id",)
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    actions = ("retry_now", "cancel")
    inlines = (AttemptInline,)
    fieldsets = (
        (None, {"fields": ("id", "queue", "type", "key", "created")}),
        (
            "State",
            {
                "fields": (
                    "status_badge",
                    "priority",
                    "attempts_detail",
                    "run_at",
                    "lease_version",
                    "locked_by",
                    "locked_until",
                    "last_error_full",
                    "updated_at",
                    "finished_at",
                )
            },
        ),
        ("Payload (immutable)", {"fields": ("payload_pretty",)}),
    )
    # Every field of the page is read-only: the operator actions are the only writes.
    readonly_fields = (
        *(name for _, options in fieldsets for name in options["fields"]),
        "workflow_link",
    )

    class Media:
        css = {"all": ("django_pgqueue/admin.css",)}

    # -- columns and fields ------------------------------------------------------------

    key = column("idempotency key", "idempotency_key")
    job_column = column("type · queue", lambda job: job, type_and_queue)
    created = column("created", "created_at", when)
    created_column = column("created", "created_at", when_short)
    status_badge = column("status", state_field("status"), badge)
    priority = column("priority", state_field("priority"))
    attempts_display = column("attempts", state_of, attempts_of)
    status_column = column("status · attempts", state_of, status_summary)
    run_at = column("run at", state_field("run_at"), when)
    run_at_column = column("run at", state_field("run_at"), when_short)
    died_column = column("died at", state_field("finished_at"), when_short)
    lease_version = column("lease version", state_field("lease_version"))
    locked_by = column("locked by", state_field("locked_by"))
    locked_until = column("lease ends", state_field("locked_until"), when)
    updated_at = column("updated", state_field("updated_at"), when)
    finished_at = column("finished", state_field("finished_at"), when)
    # A completed job shows no error: an earlier attempt's stays in its attempt row.
    last_error_short = column("last error", current_error, error_preview(ERROR_PREVIEW), empty="")
    last_error_full = column("last error", current_error, error_full)

    @admin.display(description="attempts")
    def attempts_detail(self, job: Job) -> str:
        state = state_of(job)
        if state is None:
            return EMPTY
        # Attempt rows are the whole history; the state's count restarts at 0 when an
        # operator retry grants fresh attempts.
        alias = job._state.db or get_settings().DATABASE  # where the job was read
        claims = Attempt.objects.using(alias).filter(job=job).count()
        if claims == state.attempts:
            return attempts_of(state)
        return f"{attempts_of(state)} counted against max attempts · {claims} recorded in all"

    @admin.display(description="workflow")
    def workflow_link(self, job: Job) -> str:
        found = workflow_of(job)
        if found is None:
            return EMPTY
        workflow_id, workflow, step = found
        alias = read_from_to_database(job._state.db)
        return format_html(
            '<a href="{}">{}</a> (step {})',
            with_database(
                reverse("admin:django_pgqueue_workflow_change", args=[workflow_id]), alias
            ),
            workflow,
            step,
        )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or workflow_of(obj) is None:
            return fieldsets
        (name, options), *rest = fieldsets
        return ((name, {**options, "fields": (*options["fields"], "workflow_link")}), *rest)

    @admin.display(description="payload")
    def payload_pretty(self, job: Job) -> str:
        text = json.dumps(job.payload, indent=2, ensure_ascii=False)
        return format_html('<pre class="pgqueue-payload">{}</pre>', text)

    def action_checkbox(self, obj: Job) -> str:
        # Django's markup, without rendering a form widget through the template engine
        # for every row, which is a third of a 100-row page's rendering time.
        label = format_html(gettext("Select this object for an action - {}"), str(obj))
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            helpers.ACTION_CHECKBOX_NAME,
            obj.pk,
            label,
        )

    # -- what can be done --------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # One queue database at a time (?database=), read from its replica if it has one.
        return super().get_queryset(request).using(read_alias(request)).select_related("state")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs are enqueued by code, in the caller's transaction

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # state changes only through the fenced actions

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # deleting is prune_queue_jobs' job, in short batches

    def get_paginator(
        self,
        request: HttpRequest,
        queryset: QuerySet[Any],
        per_page: int,
        orphans: int = 0,
        allow_empty_first_page: bool = True,
    ) -> Paginator:
        total = partial(self.unfiltered_total, request) if unfiltered(request) else None
        return self.paginator(queryset, per_page, orphans, allow_empty_first_page, total=total)

    def unfiltered_total(self, request: HttpRequest) -> tuple[int | None, bool]:
        """Return (total, exact) of the whole list; the figures already hold the estimate."""
        return snapshot(request).jobs, False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        self.prepare_action_post(request, "action")
        alias = admin_database(request)
        context = {
            "pgqueue_snapshot": snapshot(request),
            "count_cap": stats.COUNT_CAP,
            # The figures' links show the lists and pages of the database they count.
            "pgqueue_keep": database_query(alias),
            "pgqueue_suffix": with_database("", alias),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context=context)

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if FORM_ACTION_FIELD is not None:
            self.prepare_action_post(request, FORM_ACTION_FIELD)
        return super().changeform_view(request, object_id, form_url, extra_context)


@admin.register(DeadJob)
class DeadJobAdmin(JobAdmin):
    list_display = (
        "id",
        "job_column",
        "attempts_display",
        "died_column",
        "created_column",
        "final_error",
    )
    list_filter = (
        DatabaseFilter,
        QueueFilter,
        TypeFilter,
        ("state__finished_at", DateTimeRangeFilter),
        ("created_at", DateTimeRangeFilter),
    )
    ordering = ("-state__finished_at",)
    sortable_by = ()
    actions = ("retry_now",)

    finished_at = column("died at", state_field("finished_at"), when)
    final_error = column(
        "final error", state_field("last_error"), error_preview(FINAL_ERROR_PREVIEW), empty=""
    )

    def unfiltered_total(self, request: HttpRequest) -> tuple[int | None, bool]:
        # Counted from an index-only scan for the figures: exact unless it reached the cap.
        totals = snapshot(request).totals
        return totals.dead, not totals.dead_capped

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Dead jobs are jobs: whoever may view jobs may view this page of them too.
        return super().has_view_permission(request, obj) or can(request, Job, "view")
