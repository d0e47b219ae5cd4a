"""The admin's Workflows pages (registered by an import in admin/__init__.py).

The list is one keyset page of workflows, newest first, each with its state (derived
from its steps, ``workflow_page``), progress and times; nothing counts the whole
table. A workflow's page draws its graph (`workflows.graph`), lists its steps and
offers to cancel it, which needs ``django_pgqueue.operate_job`` like every other
operator write and runs `workflows.cancel_workflow`. With several queue databases the
pages show one at a time (``?database=ALIAS``, kept in their links), read from its
replica if it has one, and cancel on the database itself.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models.functions import Now
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import Truncator

from ..models import Attempt, Batch, Workflow
from ..store import workflows as store
from ..workflows import cancel_workflow
from ..workflows.graph import Node, graph_svg
from .columns import EMPTY, duration_of
from .databases import admin_database, database_choice, read_alias, with_database
from .lists import positive_id
from .observability import ReadOnlyPage
from .operations import OPERATE_PERMISSION, operation_urls

PER_PAGE = 50
# Most workflows one filtered page reads looking for its state; a short page goes on
# from where it stopped ("older").
SCAN_LIMIT = 1_000
# Most steps a workflow's page reads (its table), and draws.
STEP_LIMIT = 5_000
DRAW_LIMIT = 500
# Names of the steps a step waits for that its row shows (a chord's callback waits for many).
WAITS_FOR_SHOWN = 3
STATES = ("running", "finished", "failed", "cancelled", "pruned")
# The step statuses of the bars and counts: the finished first, so a bar fills from the left.
STEP_STATUSES = ("completed", "dead", "cancelled", "skipped", "running", "pending", "waiting")
LEGEND = ("waiting", "pending", "running", "completed", "dead", "cancelled")


def step_counts(summary: store.WorkflowSummary) -> list[dict[str, Any]]:
    """Each step status that has steps: its count and share of the workflow, in %."""
    total = max(summary.steps, 1)
    return [
        {"status": status, "steps": count, "percent": round(100 * count / total, 2)}
        for status in STEP_STATUSES
        if (count := getattr(summary, status))
    ]


def waits_for(detail: store.StepDetail, names: dict[int, str]) -> str:
    """The steps a step waits for, by name: the first few, then how many more."""
    shown = [names.get(parent, f"#{parent}") for parent in detail.parents[:WAITS_FOR_SHOWN]]
    more = len(detail.parents) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more else "")


# Characters of a step's result its row shows (the whole JSON is the tooltip).
RESULT_CHARS = 60


def row(summary: store.WorkflowSummary, alias: str) -> dict[str, Any]:
    """What the list and the header show of one workflow (of the queue database `alias`)."""
    return {
        "summary": summary,
        "counts": step_counts(summary),
        # From its first start to its end (so far, while it runs).
        "took": duration_of(summary.started_at, summary.finished_at, timezone.now()),
        "url": with_database(
            reverse("admin:django_pgqueue_workflow_change", args=[summary.id]), alias
        ),
    }


@admin.register(Workflow)
class WorkflowAdmin(ReadOnlyPage):
    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        state = request.GET.get("state") or None
        if state not in (None, *STATES):
            state = None
        before = positive_id(request.GET.get("before", ""))
        alias = admin_database(request)
        choice = database_choice(request, request.path)
        found, older = store.workflow_page(
            read_alias(request), before, PER_PAGE, state=state, scan=SCAN_LIMIT
        )
        return self.page(
            request,
            "admin/django_pgqueue/workflows.html",
            database_choice=choice,
            keep=choice.keep if choice else "",
            rows=[row(summary, alias) for summary in found],
            state=state,
            states=STATES,
            older=older,
            first_page=before is None,
            short=state is not None and older is not None and len(found) < PER_PAGE,
            scan_limit=SCAN_LIMIT,
        )

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        workflow_id = positive_id(object_id)
        alias = admin_database(request)
        choice = database_choice(request, request.path)
        read_from = read_alias(request)
        summary = store.workflow_summary(read_from, workflow_id) if workflow_id else None
        if summary is None:
            raise Http404(f"No workflow with id {object_id!r} on the database {alias!r}.")
        steps = store.step_details(read_from, summary.id, STEP_LIMIT)
        attempts = last_attempts(read_from, [s.job_id for s in steps])

        def outcome(job_id: int) -> dict[str, Any]:
            return step_outcome(attempts.get(job_id))

        drawn = steps[:DRAW_LIMIT]
        names = {s.job_id: s.name for s in steps}
        batch = Batch.objects.using(read_from).filter(workflow_id=summary.id).first()
        nodes = [
            Node(
                s.job_id,
                s.name,
                s.status,
                s.parents,
                with_database(reverse("admin:django_pgqueue_job_change", args=[s.job_id]), alias),
                f"{s.name}: {s.type} on {s.queue}, {s.status}, attempts "
                f"{s.attempts}/{s.max_attempts} (job #{s.job_id})",
            )
            for s in drawn
        ]
        return self.page(
            request,
            "admin/django_pgqueue/workflow.html",
            title=f"Workflow {summary.name} #{summary.id}",
            database_choice=choice,
            database_suffix=with_database("", alias),
            workflow=row(summary, alias),
            steps=[
                {"step": s, "waits_for": waits_for(s, names), **outcome(s.job_id)} for s in steps
            ],
            steps_not_listed=max(0, summary.present - len(steps)),
            graph=graph_svg(f"The steps of workflow {summary.name}", nodes),
            drawn=len(drawn),
            graph_capped=summary.present > len(drawn),
            statuses=[status for status in LEGEND if any(s.status == status for s in drawn)],
            can_cancel=self.has_operate_permission(request) and summary.state == "running",
            jobs_url=with_database(
                reverse("admin:django_pgqueue_job_changelist") + f"?workflow={summary.id}", alias
            ),
            list_url=with_database(reverse("admin:django_pgqueue_workflow_changelist"), alias),
            list_title="Workflows",
            batch=batch,
            batch_url=batch
            and with_database(
                reverse("admin:django_pgqueue_batch_changelist") + f"?id={batch.id}", alias
            ),
            cancel_url=with_database(
                reverse("admin:django_pgqueue_workflow_cancel", args=[summary.id]), alias
            ),
        )

    def get_urls(self) -> list[URLPattern]:
        cancel = ("<path:object_id>/cancel/", self.cancel_view, "django_pgqueue_workflow_cancel")
        return [*operation_urls(self, [cancel]), *super().get_urls()]

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Cancel the workflow (a POST), then show its page with what was done."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_operate_permission(request):
            raise PermissionDenied("Cancelling a workflow needs the operate_job permission.")
        workflow_id = positive_id(object_id)
        alias = admin_database(request)  # the database itself, never its replica
        if workflow_id is None or not Workflow.objects.using(alias).filter(pk=workflow_id).exists():
            raise Http404(f"No workflow with id {object_id!r} on the database {alias!r}.")
        done = cancel_workflow(workflow_id, using=alias)
        if done.cancelled or done.requested:
            self.message_user(
                request,
                f"Cancelled {len(done.cancelled)} step(s) of workflow #{workflow_id}"
                + (
                    f"; asked {len(done.requested)} running step(s) to stop (they end "
                    "cancelled when their worker writes them)."
                    if done.requested
                    else "."
                ),
                messages.SUCCESS,
            )
        else:
            self.message_user(
                request,
                f"Workflow #{workflow_id} had no waiting, pending or running step: nothing "
                "was cancelled.",
                messages.WARNING,
            )
        return HttpResponseRedirect(
            with_database(
                reverse("admin:django_pgqueue_workflow_change", args=[workflow_id]), alias
            )
        )

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(OPERATE_PERMISSION)


def last_attempts(alias: str, job_ids: list[int]) -> dict[int, Attempt]:
    """Each job's current or last attempt, by job id: one query (DISTINCT ON over the
    (job_id, lease_version) unique index), the database's clock with each."""
    if not job_ids:
        return {}
    found = (
        Attempt.objects.using(alias)
        .filter(job_id__in=job_ids)
        .order_by("job_id", "-lease_version")
        .distinct("job_id")
        .only("job_id", "lease_version", "started_at", "finished_at", "result")
        .annotate(now=Now())
    )
    return {attempt.job_id: attempt for attempt in found}


def step_outcome(attempt: Attempt | None) -> dict[str, Any]:
    """A step's row's last attempt: how long it ran and what it returned (cut, whole as
    the tooltip)."""
    if attempt is None:
        return {"took": EMPTY, "result": EMPTY}
    took = duration_of(attempt.started_at, attempt.finished_at, attempt.now)
    if attempt.result is None:
        return {"took": took, "result": EMPTY}
    text = json.dumps(attempt.result, ensure_ascii=False)
    result = format_html(
        '<code class="pgqueue-step-result" title="{}">{}</code>',
        text,
        Truncator(text).chars(RESULT_CHARS),
    )
    return {"took": took, "result": result}
