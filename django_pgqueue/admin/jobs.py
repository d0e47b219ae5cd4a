"""The two model admins: all jobs, and the dead jobs among them.

The jobs list shows one line per job, with the start, duration and worker of each
job's current or last attempt, read for the page's rows in one query
(`LastAttempts`). Its search finds a job by id, idempotency key, type or the start of
a type (matched against the known types, then read through the type index), and by
the text of its payload among the newest `PAYLOAD_SEARCH_ROWS` jobs the filters
select: a payload is not indexed, so that part of a search reads a bounded number of
rows whatever the table's size.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.utils import flatten_fieldsets
from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.db.models import Prefetch, Q, QuerySet, TextField, prefetch_related_objects
from django.db.models.functions import Cast, Now
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, reverse
from django.utils.html import format_html
from django.utils.text import smart_split, unescape_string_literal
from django.utils.translation import gettext

from .. import stats
from ..conf import get_settings
from ..models import Attempt, DeadJob, Job, Status
from ..registry import registry
from ..store import workflows
from .attempts import AttemptInline, can
from .columns import (
    EMPTY,
    ago,
    attempts_of,
    column,
    current_error,
    duration_of,
    error_full,
    error_preview,
    markup,
    one_line,
    state_badge,
    state_field,
    state_of,
    status_summary,
    when,
    when_short,
)
from .databases import admin_database, database_query, read_from_to_database, with_database
from .durable import RUN_AGAIN, durable_steps, has_steps, offer_run_again, run_again_view
from .lists import (
    EXACT_COUNT_LIMIT,
    DatabaseFilter,
    EstimatedCountPaginator,
    QueueFilter,
    TimeRangeFilter,
    TypeFilter,
    WorkflowFilter,
    known_names,
    positive_id,
    read_alias,
    snapshot,
    unfiltered,
)
from .operations import FORM_ACTION_FIELD, OperatorActionsMixin, operation_urls


def workflow_of(job: Job) -> tuple[int, str, str] | None:
    """The workflow `job` is a step of: (id, name, step name), read once per job object."""
    if not hasattr(job, "_pgqueue_workflow"):
        found = workflows.workflow_of_job(job._state.db or get_settings().DATABASE, job.pk)
        job._pgqueue_workflow = found  # type: ignore[attr-defined]
    return job._pgqueue_workflow  # type: ignore[attr-defined]


# Characters of an error's first line a list shows (the whole text is the tooltip).
ERROR_PREVIEW = 70
FINAL_ERROR_PREVIEW = 160
# The newest jobs (of those the filters select) whose payload a search reads, and the
# most of them it keeps: the payload has no index, so this bounds a search's cost.
PAYLOAD_SEARCH_ROWS = 10_000
PAYLOAD_MATCHES = EXACT_COUNT_LIMIT + 1


def last_attempts() -> Prefetch:
    """Each job's current or last attempt (its highest lease version), for a page of jobs.

    One query for the page: DISTINCT ON walks the (job_id, lease_version) unique index
    for the page's ids. `now` is the database's clock, for the running ones.
    """
    attempts = (
        Attempt.objects.order_by("job_id", "-lease_version")
        .distinct("job_id")
        .only("job_id", "lease_version", "worker_id", "status", "started_at", "finished_at")
        .annotate(now=Now())
    )
    return Prefetch("attempts", queryset=attempts, to_attr="last_attempts")


def last_attempt(job: Job) -> Attempt | None:
    """The job's current or last attempt, as `LastAttempts` read it (None: never claimed)."""
    found = getattr(job, "last_attempts", None)
    return found[0] if found else None


class LastAttempts(ChangeList):
    """A jobs list that reads the page's last attempts in one query, and the database's
    clock with its rows (the list says how long ago things happened by that clock)."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet:
        return super().get_queryset(request, exclude_parameters).annotate(shown_at=Now())

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = list(self.result_list)
        prefetch_related_objects(self.result_list, last_attempts())


@admin.register(Job)
class JobAdmin(OperatorActionsMixin, admin.ModelAdmin):
    # One line per job (the stylesheet cuts a long type, worker or error with an
    # ellipsis, the whole text as its tooltip), so a screen holds about twenty jobs.
    list_display = (
        "id",
        "type_column",
        "queue_column",
        "status_column",
        "started_column",
        "duration_column",
        "worker_column",
        "last_error_short",
    )
    list_display_links = ("id",)
    list_filter = (
        DatabaseFilter,
        QueueFilter,
        ("state__status", admin.ChoicesFieldListFilter),
        TypeFilter,
        ("created_at", TimeRangeFilter),
        ("state__run_at", TimeRangeFilter),
        WorkflowFilter,
    )
    list_select_related = ("state",)
    search_help_text = (
        "A job id, an idempotency key, a job type or its beginning ('demo.' finds every "
        f"demo.* type), or a text in the payload (searched in the newest "
        f"{PAYLOAD_SEARCH_ROWS:,} jobs the filters select)."
    )
    # Not empty, so that Django shows the search box; get_search_results does the search.
    search_fields = ("type",)
    ordering = ("-id",)
    # Only the primary key orders the whole table through an index.
    sortable_by = ("id",)
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    actions = ("retry_now", "cancel")
    inlines = (AttemptInline,)
    empty_value_display = EMPTY
    # Several fields to a row: the whole job and its state fit a laptop's screen.
    fieldsets = (
        (None, {"fields": (("id", "type", "queue"), ("key", "created"))}),
        (
            "State",
            {
                "fields": (
                    ("status_badge", "attempts_detail", "priority"),
                    ("run_at", "updated_at", "finished_at"),
                    ("locked_by", "locked_until", "lease_version"),
                    "last_error_full",
                )
            },
        ),
        ("Payload (immutable)", {"fields": ("payload_pretty",)}),
    )
    # Every field of the page is read-only: the operator actions are the only writes.
    readonly_fields = (*flatten_fieldsets(fieldsets), "workflow_link", "durable_steps")

    class Media:
        css = {"all": ("django_pgqueue/admin.css",)}

    # -- columns and fields ------------------------------------------------------------

    key = column("idempotency key", "idempotency_key")
    created = column("created", "created_at", when)
    status_badge = column("status", state_of, state_badge)
    priority = column("priority", state_field("priority"))
    attempts_display = column("attempts", state_of, attempts_of)
    status_column = column("status · attempts", state_of, status_summary)
    run_at = column("run at", state_field("run_at"), when)
    died_column = column("died at", state_field("finished_at"), when_short)
    created_column = column("created", "created_at", when_short)
    lease_version = column("lease version", state_field("lease_version"))
    locked_by = column("locked by", state_field("locked_by"))
    locked_until = column("lease ends", state_field("locked_until"), when)
    updated_at = column("updated", state_field("updated_at"), when)
    finished_at = column("finished", state_field("finished_at"), when)
    # A completed job shows no error: an earlier attempt's stays in its attempt row.
    last_error_short = column("last error", current_error, error_preview(ERROR_PREVIEW))
    last_error_full = column("last error", current_error, error_full)
    type_column = column("type", "type", one_line)
    queue_column = column("queue", "queue", one_line)
    durable_steps = staticmethod(durable_steps)

    @admin.display(description="started · due")
    def started_column(self, job: Job) -> str:
        """When the current or last attempt started; for a job waiting its turn
        (pending), when it is due."""
        state = state_of(job)
        now = getattr(job, "shown_at", None)
        if state is None or now is None:
            return EMPTY
        if state.status == Status.PENDING:
            return ago(state.run_at, now, prefix="due ")
        attempt = last_attempt(job)
        if attempt is None or state.status == Status.WAITING:
            return EMPTY
        return ago(attempt.started_at, now)

    @admin.display(description="took")
    def duration_column(self, job: Job) -> str:
        """How long the current or last attempt ran (so far, in italics, while it runs)."""
        attempt = last_attempt(job)
        if attempt is None:
            return EMPTY
        return duration_of(attempt.started_at, attempt.finished_at, attempt.now)

    @admin.display(description="worker")
    def worker_column(self, job: Job) -> str:
        """The worker of the current or last attempt."""
        attempt = last_attempt(job)
        return EMPTY if attempt is None else one_line(attempt.worker_id)

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
        if obj is not None and has_steps(obj):  # a durable handler's checkpoints
            offer_run_again(obj, request)
            fieldsets = (*fieldsets, ("Durable steps", {"fields": ("durable_steps",)}))
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
        label = markup(gettext("Select this object for an action - {}"), str(obj))
        return markup(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            helpers.ACTION_CHECKBOX_NAME,
            obj.pk,
            label,
        )

    # -- what can be done --------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        # "Run again from this step", on the jobs' pages (the dead jobs' link to them).
        own = [("<path:object_id>/run-again/", self.run_again_view, RUN_AGAIN)]
        return [*operation_urls(self, own if self.model is Job else []), *super().get_urls()]

    def run_again_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return run_again_view(self, request, object_id)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        # Only a list that shows the attempts' columns reads them.
        if {"started_column", "duration_column", "worker_column"} & set(self.list_display):
            return LastAttempts
        return super().get_changelist(request, **kwargs)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """Find each term (all of them, as Django's search does) by id, idempotency key,
        type or type prefix through their indexes, or in the payload of the newest
        `PAYLOAD_SEARCH_ROWS` jobs the filters select."""
        types = None
        for raw in smart_split(search_term):
            term = unescape_string_literal(raw) if raw[:1] in "\"'" and raw[-1:] == raw[:1] else raw
            if not term:
                continue
            if types is None:
                registry.autodiscover()
                types = sorted({*registry.types(), *known_names(request)[0]})
            prefixed = [name for name in types if name.startswith(term)]
            match = Q(type__in=[term, *prefixed]) | Q(idempotency_key=term)
            if positive_id(term) is not None:
                match |= Q(pk=int(term))
            found = self.payload_matches(queryset, term)
            if found:
                match |= Q(pk__in=found)
            queryset = queryset.filter(match)
        return queryset, False

    def payload_matches(self, queryset: QuerySet[Any], term: str) -> list[int]:
        """Ids of the jobs, among the newest `PAYLOAD_SEARCH_ROWS` of `queryset`, whose
        payload (its JSON text) contains `term`, ignoring case; newest first."""
        # The window's oldest id first (a backward walk of the primary key that stops
        # after PAYLOAD_SEARCH_ROWS rows), then a range of the primary key from it: the
        # payloads read are the window's only (an IN over a LIMIT subquery let the
        # planner read every payload of the table instead).
        oldest = list(
            queryset.order_by("-pk").values_list("pk", flat=True)[
                PAYLOAD_SEARCH_ROWS - 1 : PAYLOAD_SEARCH_ROWS
            ]
        )
        window = queryset.filter(pk__gte=oldest[0]) if oldest else queryset
        return list(
            window.annotate(payload_text=Cast("payload", TextField()))
            .filter(payload_text__icontains=term)
            .order_by("-pk")
            .values_list("pk", flat=True)[:PAYLOAD_MATCHES]
        )

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
            "title": self.model._meta.verbose_name_plural.capitalize(),
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
        "type_column",
        "queue_column",
        "attempts_display",
        "died_column",
        "created_column",
        "final_error",
    )
    list_filter = (
        DatabaseFilter,
        QueueFilter,
        TypeFilter,
        ("state__finished_at", TimeRangeFilter),
        ("created_at", TimeRangeFilter),
    )
    ordering = ("-state__finished_at",)
    sortable_by = ()
    actions = ("retry_now",)

    finished_at = column("died at", state_field("finished_at"), when)
    final_error = column(
        "final error", state_field("last_error"), error_preview(FINAL_ERROR_PREVIEW)
    )

    def unfiltered_total(self, request: HttpRequest) -> tuple[int | None, bool]:
        # Counted from an index-only scan for the figures: exact unless it reached the cap.
        totals = snapshot(request).totals
        return totals.dead, not totals.dead_capped

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Dead jobs are jobs: whoever may view jobs may view this page of them too.
        return super().has_view_permission(request, obj) or can(request, Job, "view")
