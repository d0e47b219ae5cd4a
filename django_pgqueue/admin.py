"""The Django admin for the queue: jobs, dead jobs, their attempts, retry and cancel.

Everything here is read-only. The only writes are the two operator actions, which
run the fenced statements of `actions` (``job_retry_now``, ``job_cancel``) behind the
``django_pgqueue.operate_job`` permission; no state field is ever saved by a form.

The list pages stay fast on millions of jobs: state fields come with the job in one
join, every ordering and the dead-jobs filter walk an index, the total is estimated
instead of counted, and filter choices come from the small partial indexes that feed
the at-a-glance figures, never from a SELECT DISTINCT over the table.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, partial
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ORDER_VAR, PAGE_VAR
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Count, F, Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.translation import gettext
from rangefilter.filters import DateTimeRangeFilter

from . import actions
from .conf import get_settings
from .durations import format_seconds
from .models import Attempt, DeadJob, Job, JobState, Status
from .registry import registry
from .stats import Snapshot, collect

OPERATE_PERMISSION = "django_pgqueue.operate_job"
# Most jobs one action takes, so a "select all" over a million rows cannot lock them
# all in one statement. requeue_dead and prune_queue_jobs handle bulk work in batches.
ACTION_LIMIT = 10_000
# Rows a filtered list page counts; past that it says "more than" (20 pages of 100).
EXACT_COUNT_LIMIT = 2_000
ERROR_PREVIEW = 70
try:  # Django 6.1 runs actions from a job's own page too; Django 5.2 from the list only.
    from django.contrib.admin import ActionLocation
except ImportError:  # pragma: no cover - Django 5.2
    ActionLocation = None
# The POST field that carries an action chosen on a job's page (Django 6.1).
FORM_ACTION_FIELD = f"{ActionLocation.CHANGE_FORM.value}-action" if ActionLocation else None


def operator_action(description: str) -> Any:
    """@admin.action for retry and cancel: guarded by the permission, on list and page."""
    options: dict[str, Any] = {"permissions": ["operate"], "description": description}
    if ActionLocation is not None:
        options["location"] = [ActionLocation.CHANGE_LIST, ActionLocation.CHANGE_FORM]
    return admin.action(**options)


def snapshot(request: HttpRequest) -> Snapshot:
    """The at-a-glance figures, read once per request (the panel and the filters share them)."""
    cached = getattr(request, "_pgqueue_snapshot", None)
    if cached is None:
        cached = collect()
        request._pgqueue_snapshot = cached  # type: ignore[attr-defined]
    return cached


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
    """True when a list page shows its whole list: no filter and no search, any page."""
    return not set(request.GET) - {PAGE_VAR, ORDER_VAR}


class QueueFilter(admin.SimpleListFilter):
    """Queues with unfinished, dead or cancelled jobs (from the figures), not a DISTINCT scan."""

    title = "queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = set(snapshot(request).queue_names) | {get_settings().DEFAULT_QUEUE}
        if self.value():
            names.add(self.value())
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(queue=self.value()) if self.value() else queryset


class TypeFilter(admin.SimpleListFilter):
    """Registered job types (and the one asked for), not a DISTINCT scan of the jobs."""

    title = "type"
    parameter_name = "type"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        registry.autodiscover()
        names = set(registry.types())
        if self.value():
            names.add(self.value())
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(type=self.value()) if self.value() else queryset


def when(value: Any, *, zone: bool = True) -> str:
    """A timestamp as operators read it: local time to the second (and the zone)."""
    if value is None:
        return "—"
    local = timezone.localtime(value)
    if zone:
        return local.strftime("%Y-%m-%d %H:%M:%S %Z")
    return format_html(
        '<span title="{}">{}</span>', local.strftime("%Z"), local.strftime("%Y-%m-%d %H:%M:%S")
    )


def _can(request: HttpRequest, model: type[Model], action: str) -> bool:
    opts = model._meta
    return request.user.has_perm(f"{opts.app_label}.{get_permission_codename(action, opts)}")


class AttemptInline(admin.StackedInline):
    """Every attempt of the job, oldest first, read-only; the fatal traceback is open."""

    model = Attempt
    fk_name = "job"
    extra = 0
    max_num = 0
    can_delete = False
    ordering = ("lease_version",)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("attempt_index", "lease_version", "outcome", "worker_id"),
                    ("started", "finished", "duration"),
                    ("error_class", "error_message"),
                    "traceback_display",
                )
            },
        ),
    )
    readonly_fields = (
        "attempt_index",
        "lease_version",
        "outcome",
        "worker_id",
        "started",
        "finished",
        "duration",
        "error_class",
        "error_message",
        "traceback_display",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return (
            super()
            .get_queryset(request)
            .using(get_settings().DATABASE)
            .annotate(
                job_status=F("job__state__status"),
                job_lease_version=F("job__state__lease_version"),
            )
        )

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Whoever may see the job may see its attempts: no separate attempt permission.
        return _can(request, self.parent_model, "view") or _can(request, Job, "view")

    @admin.display(description="status")
    def outcome(self, attempt: Attempt) -> str:
        return attempt.get_status_display()

    @admin.display(description="started")
    def started(self, attempt: Attempt) -> str:
        return when(attempt.started_at)

    @admin.display(description="finished")
    def finished(self, attempt: Attempt) -> str:
        return when(attempt.finished_at)

    @admin.display(description="duration")
    def duration(self, attempt: Attempt) -> str:
        if attempt.finished_at is None:
            return "—"
        seconds = (attempt.finished_at - attempt.started_at).total_seconds()
        return f"{seconds:.3f}s" if seconds < 60 else format_seconds(seconds)

    @admin.display(description="traceback")
    def traceback_display(self, attempt: Attempt) -> str:
        if not attempt.traceback:
            return "—"
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


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "queue",
        "type",
        "status_badge",
        "priority",
        "attempts_display",
        "run_at_column",
        "created_column",
        "last_error_short",
    )
    list_display_links = ("id",)
    list_filter = (
        QueueFilter,
        ("state__status", admin.ChoicesFieldListFilter),
        TypeFilter,
        ("created_at", DateTimeRangeFilter),
        ("state__run_at", DateTimeRangeFilter),
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
                    "attempts_display",
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
    readonly_fields = (
        "id",
        "queue",
        "type",
        "key",
        "created",
        "status_badge",
        "priority",
        "attempts_display",
        "run_at",
        "lease_version",
        "locked_by",
        "locked_until",
        "last_error_full",
        "updated_at",
        "finished_at",
        "payload_pretty",
    )

    class Media:
        css = {"all": ("django_pgqueue/admin.css",)}

    # -- what can be done --------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).using(get_settings().DATABASE).select_related("state")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # jobs are enqueued by code, in the caller's transaction

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # state changes only through the fenced actions

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # deleting is prune_queue_jobs' job, in short batches

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(OPERATE_PERMISSION)

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
        """(total, exact) of the whole list; the figures already hold the estimate."""
        return snapshot(request).jobs, False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        self._refuse_unpermitted_action(request, "action")
        context = {"pgqueue_snapshot": snapshot(request), **(extra_context or {})}
        return super().changelist_view(request, extra_context=context)

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if FORM_ACTION_FIELD is not None:
            self._refuse_unpermitted_action(request, FORM_ACTION_FIELD)
        return super().changeform_view(request, object_id, form_url, extra_context)

    def _refuse_unpermitted_action(self, request: HttpRequest, field: str) -> None:
        """Answer 403 to a POST of an operator action from a user without the permission."""
        if request.method != "POST" or self.has_operate_permission(request):
            return
        if set(request.POST.getlist(field)) & {"retry_now", "cancel"}:
            raise PermissionDenied("Retrying and cancelling jobs needs the operate_job permission.")

    # -- columns and fields ------------------------------------------------------------

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

    @staticmethod
    def _state(job: Job) -> JobState | None:
        try:
            return job.state
        except JobState.DoesNotExist:
            return None

    @admin.display(description="status")
    def status_badge(self, job: Job) -> str:
        state = self._state(job)
        if state is None:
            return "—"
        return format_html(
            '<span class="pgqueue-status pgqueue-{}">{}</span>', state.status, state.status
        )

    @admin.display(description="priority")
    def priority(self, job: Job) -> Any:
        state = self._state(job)
        return state.priority if state else "—"

    @admin.display(description="attempts")
    def attempts_display(self, job: Job) -> str:
        state = self._state(job)
        return f"{state.attempts}/{state.max_attempts}" if state else "—"

    @admin.display(description="idempotency key")
    def key(self, job: Job) -> str:
        return job.idempotency_key or "—"

    @admin.display(description="created")
    def created(self, job: Job) -> str:
        return when(job.created_at)

    @admin.display(description="run at")
    def run_at(self, job: Job) -> str:
        state = self._state(job)
        return when(state.run_at if state else None)

    @admin.display(description="created")
    def created_column(self, job: Job) -> str:
        return when(job.created_at, zone=False)

    @admin.display(description="run at")
    def run_at_column(self, job: Job) -> str:
        state = self._state(job)
        return when(state.run_at if state else None, zone=False)

    @admin.display(description="died at")
    def died_column(self, job: Job) -> str:
        state = self._state(job)
        return when(state.finished_at if state else None, zone=False)

    @admin.display(description="lease version")
    def lease_version(self, job: Job) -> Any:
        state = self._state(job)
        return state.lease_version if state else "—"

    @admin.display(description="locked by")
    def locked_by(self, job: Job) -> str:
        state = self._state(job)
        return (state.locked_by if state else None) or "—"

    @admin.display(description="lease ends")
    def locked_until(self, job: Job) -> str:
        state = self._state(job)
        return when(state.locked_until if state else None)

    @admin.display(description="updated")
    def updated_at(self, job: Job) -> str:
        state = self._state(job)
        return when(state.updated_at if state else None)

    @admin.display(description="finished")
    def finished_at(self, job: Job) -> str:
        state = self._state(job)
        return when(state.finished_at if state else None)

    @admin.display(description="last error")
    def last_error_short(self, job: Job) -> str:
        state = self._state(job)
        if state is None or not state.last_error:
            return ""
        first_line = state.last_error.strip().splitlines()[0] if state.last_error.strip() else ""
        return format_html(
            '<span class="pgqueue-error" title="{}">{}</span>',
            state.last_error,
            Truncator(first_line).chars(ERROR_PREVIEW),
        )

    @admin.display(description="last error")
    def last_error_full(self, job: Job) -> str:
        state = self._state(job)
        if state is None or not state.last_error:
            return "—"
        return format_html('<pre class="pgqueue-error-full">{}</pre>', state.last_error)

    @admin.display(description="payload")
    def payload_pretty(self, job: Job) -> str:
        text = json.dumps(job.payload, indent=2, ensure_ascii=False)
        return format_html('<pre class="pgqueue-payload">{}</pre>', text)

    # -- actions -------------------------------------------------------------------------

    @operator_action("Retry now")
    def retry_now(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return self._operate(request, queryset, RETRY)

    @operator_action("Cancel")
    def cancel(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        return self._operate(request, queryset, CANCEL)

    def _operate(
        self, request: HttpRequest, queryset: QuerySet[Any], spec: OperatorAction
    ) -> HttpResponse | None:
        if not self.has_operate_permission(request):
            raise PermissionDenied  # the admin filters actions too; never rely on that alone
        ids = list(queryset.order_by().values_list("pk", flat=True)[: ACTION_LIMIT + 1])
        if len(ids) > ACTION_LIMIT:
            self.message_user(
                request,
                f"{spec.title}: more than {ACTION_LIMIT:,} jobs selected; nothing was changed. "
                "Narrow the selection with the filters, or use the requeue_dead command.",
                messages.ERROR,
            )
            return None
        from_form = FORM_ACTION_FIELD is not None and FORM_ACTION_FIELD in request.POST
        if request.POST.get("post") != "yes":
            return self._confirmation(request, ids, spec, from_form)

        report = spec.run(ids)
        select_across = request.POST.get("select_across") == "1"
        if not select_across:
            listed = set(ids)
            for raw in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
                if raw.isdigit() and int(raw) not in listed:
                    report.skip(actions.NOT_LISTED, int(raw))
        if report.changed and not report.skipped_count:
            level = messages.SUCCESS
        else:
            level = messages.WARNING
        self.message_user(request, report.message(), level)
        if from_form and len(ids) == 1:
            # The job may have left this list (a retried dead job is not dead any more):
            # show it where it always is.
            return HttpResponseRedirect(reverse("admin:django_pgqueue_job_change", args=[ids[0]]))
        return None

    def _confirmation(
        self, request: HttpRequest, ids: list[int], spec: OperatorAction, from_form: bool
    ) -> HttpResponse:
        alias = get_settings().DATABASE
        by_status = {
            row["status"]: row["jobs"]
            for row in JobState.objects.using(alias)
            .filter(pk__in=ids)
            .values("status")
            .annotate(jobs=Count("pk"))
            .order_by()
        }
        groups = [
            {
                "status": status,
                "jobs": by_status[status],
                "applies": status in spec.allowed,
            }
            for status in Status.values
            if by_status.get(status)
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": f"{spec.title}: are you sure?",
            "opts": self.opts,
            "spec": spec,
            "ids": ids,
            "groups": groups,
            "will_change": sum(g["jobs"] for g in groups if g["applies"]),
            "will_skip": sum(g["jobs"] for g in groups if not g["applies"]),
            "preview": self.get_queryset(request).filter(pk__in=ids[:20]).order_by("-id"),
            "more": max(0, len(ids) - 20),
            "action_field": (FORM_ACTION_FIELD if from_form else "action"),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        return TemplateResponse(request, "admin/django_pgqueue/action_confirmation.html", context)


@dataclass(frozen=True)
class OperatorAction:
    """What the confirmation page and the message say about one action, and what it runs."""

    name: str
    title: str
    button: str
    allowed: frozenset[str]
    explanation: str
    run: Callable[[list[int]], actions.ActionReport]


RETRY = OperatorAction(
    name="retry_now",
    title="Retry now",
    button="Yes, retry now",
    allowed=actions.RETRYABLE,
    explanation=(
        "Dead, cancelled and pending jobs become pending and due now, with a fresh attempt "
        "budget (attempts back to 0). Their attempts so far stay in the history. Running "
        "jobs are never touched; they and completed jobs are skipped, as is a job whose "
        "idempotency key another pending or running job holds."
    ),
    run=actions.retry_now,
)
CANCEL = OperatorAction(
    name="cancel",
    title="Cancel",
    button="Yes, cancel them",
    allowed=actions.CANCELLABLE,
    explanation=(
        "Pending jobs become cancelled and will not run (Retry now can bring them back). "
        "Running jobs are asked to stop: their handler sees ctx.cancel_requested() at the "
        "next lease renewal, and the job ends cancelled when its attempt ends, whatever the "
        "handler does (its result is kept). Finished jobs are skipped."
    ),
    run=actions.cancel,
)


@admin.register(DeadJob)
class DeadJobAdmin(JobAdmin):
    list_display = (
        "id",
        "queue",
        "type",
        "attempts_display",
        "died_column",
        "created_column",
        "final_error",
    )
    list_filter = (
        QueueFilter,
        TypeFilter,
        ("state__finished_at", DateTimeRangeFilter),
        ("created_at", DateTimeRangeFilter),
    )
    ordering = ("-state__finished_at",)
    sortable_by = ()
    actions = ("retry_now",)

    def unfiltered_total(self, request: HttpRequest) -> tuple[int | None, bool]:
        # Counted exactly, from an index-only scan, for the figures.
        return snapshot(request).totals.dead, True

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Dead jobs are jobs: whoever may view jobs may view this page of them too.
        return super().has_view_permission(request, obj) or _can(request, Job, "view")

    @admin.display(description="died at")
    def finished_at(self, job: Job) -> str:
        return super().finished_at(job)

    @admin.display(description="final error")
    def final_error(self, job: Job) -> str:
        state = self._state(job)
        if state is None or not state.last_error:
            return ""
        return format_html(
            '<span class="pgqueue-error" title="{}">{}</span>',
            state.last_error,
            Truncator(state.last_error.strip().splitlines()[0]).chars(160),
        )


from .control import admin as _control_admin  # noqa: E402, F401  (issue 14: the Queues page)
