"""A durable job's steps on its admin page: each checkpoint (name, kind, result, when
it was recorded, how long its function ran), and the event it is parked for; and the
operator's "run again from this step", confirmed on a page of its own."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import Exists, OuterRef
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from ..actions import RETRYABLE, run_again_from
from ..conf import get_settings
from ..models import EventWait, Job, JobStep, StepKind
from .columns import EMPTY, when
from .databases import admin_database, read_from_to_database, with_database
from .lists import positive_id
from .operations import OPERATE_PERMISSION

RESULT_PREVIEW = 200
# The URL name of the confirmation page of "run again from this step".
RUN_AGAIN = "django_pgqueue_job_run_again"


def _alias(job: Job) -> str:
    return job._state.db or get_settings().DATABASE  # where the job was read


def has_steps(job: Job) -> bool:
    """Whether the job recorded a durable step or is parked for an event."""
    alias = _alias(job)
    steps = JobStep.objects.using(alias).filter(job_id=OuterRef("pk"))
    wait = EventWait.objects.using(alias).filter(job_id=OuterRef("pk"))
    # One query: the page of every job asks it.
    found = Job.objects.using(alias).filter(pk=job.pk).filter(Exists(steps) | Exists(wait))
    return found.exists()


def _result(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= RESULT_PREVIEW else text[: RESULT_PREVIEW - 1] + "…"


# A step's status as shown -> the badge colour of the job status it resembles.
STEP_BADGES = {
    "done": "completed",
    "woke": "completed",
    "delivered": "completed",
    "sleeping": "pending",
    "waiting": "waiting",
    "timed out": "cancelled",
}


def _badge(status: str) -> str:
    return format_html(
        '<span class="pgqueue-status pgqueue-{}">{}</span>', STEP_BADGES[status], status
    )


def _shown(step: JobStep, now: dt.datetime) -> tuple[str, str]:
    """A checkpoint's status and what it holds, as the page shows them: a sleep's
    wake-up (asleep or woke, by this page's clock), an event's payload or its timeout,
    a step's JSON result."""
    result = step.result if isinstance(step.result, dict) else {}
    if step.kind == StepKind.SLEEP and "wake_at" in result:
        wake_at = dt.datetime.fromisoformat(result["wake_at"])
        status = "sleeping" if wake_at > now else "woke"
        return status, format_html("until {}", when(wake_at))
    if step.kind == StepKind.EVENT:
        if result.get("timed_out"):
            return "timed out", EMPTY
        return "delivered", format_html("<code>{}</code>", _result(result.get("payload")))
    return "done", format_html("<code>{}</code>", _result(step.result))


def _steps(alias: str, job_id: int) -> list[JobStep]:
    """The job's checkpoints in the order recorded (the order step_run_again goes by)."""
    return list(JobStep.objects.using(alias).filter(job_id=job_id).order_by("recorded_at", "name"))


def offer_run_again(job: Job, request: HttpRequest) -> None:
    """Let the job's steps table offer "run again from here" on each checkpoint if the
    user may retry jobs (the permission of the admin's retry) and the job is one a
    retry takes (dead, cancelled or pending)."""
    state = getattr(job, "state", None)
    job._pgqueue_run_again = (  # type: ignore[attr-defined]
        request.user.has_perm(OPERATE_PERMISSION)
        and state is not None
        and state.status in RETRYABLE
    )


def _run_again_link(job: Job, name: str) -> str:
    url = reverse(f"admin:{RUN_AGAIN}", args=[job.pk]) + "?" + urlencode({"step": name})
    return format_html(
        '<a class="pgqueue-run-again" href="{}">run again from here</a>',
        with_database(url, read_from_to_database(job._state.db)),
    )


@admin.display(description="steps")
def durable_steps(job: Job) -> str:
    """The job's checkpoints in the order recorded, then the event it waits for; with
    "run again from here" on each checkpoint when `offer_run_again` offered it."""
    alias = _alias(job)
    now = timezone.now()
    offered = getattr(job, "_pgqueue_run_again", False)
    rows = [
        (
            step.name,
            step.kind,
            *_shown(step, now),
            when(step.recorded_at),
            EMPTY if step.runtime is None else f"{step.runtime * 1000:.1f} ms",
            _run_again_link(job, step.name) if offered else "",
        )
        for step in _steps(alias, job.pk)
    ]
    wait = EventWait.objects.using(alias).filter(job_id=job.pk).first()
    if wait is not None:
        until = (
            "with no timeout"
            if wait.timeout_at is None
            else format_html("until {}", when(wait.timeout_at))
        )
        awaited = format_html("for <code>{}</code>, {}", wait.key, until)
        rows.append(
            (wait.name, StepKind.EVENT, "waiting", awaited, when(wait.created_at), EMPTY, "")
        )
    body = format_html_join(
        "",
        '<tr><td class="pgqueue-step-name">{}</td><td>{}</td><td>{}</td><td>{}</td>'
        '<td class="pgqueue-nowrap">{}</td><td class="pgqueue-nowrap">{}</td>'
        '<td class="pgqueue-nowrap">{}</td></tr>',
        ((name, kind, _badge(status), *rest) for name, kind, status, *rest in rows),
    )
    return format_html(
        '<table class="pgqueue-steps-table"><thead><tr><th>step</th><th>kind</th>'
        "<th>status</th><th>result</th><th>recorded</th><th>ran</th><th></th></tr></thead>"
        "<tbody>{}</tbody></table>",
        body,
    )


def run_again_view(model_admin: Any, request: HttpRequest, object_id: str) -> HttpResponse:
    """Run a job again from its step ``step``: a GET shows what it will do (the
    checkpoints kept and dropped) and asks to confirm; the confirming POST runs
    `run_again_from` on the page's queue database, then shows the job's page with what
    was done. It needs the permission of the admin's retry, checked here."""
    if not request.user.has_perm(OPERATE_PERMISSION):
        raise PermissionDenied("Running a job again needs the operate_job permission.")
    job_id = positive_id(object_id)
    alias = admin_database(request)  # the database itself, never its replica
    data = request.POST if request.method == "POST" else request.GET
    step = data.get("step")
    if not step:
        raise BadRequest("step must name one of the job's durable steps.")
    job = Job.objects.using(alias).select_related("state").filter(pk=job_id or 0).first()
    if job is None:
        raise Http404(f"No job with id {object_id!r} on the database {alias!r}.")
    page = with_database(reverse("admin:django_pgqueue_job_change", args=[job.pk]), alias)
    if request.method == "POST" and request.POST.get("post") == "yes":
        report = run_again_from(job.pk, step, alias=alias)
        level = messages.SUCCESS if report.changed else messages.WARNING
        model_admin.message_user(request, report.message(), level)
        return HttpResponseRedirect(page)
    steps = _steps(alias, job.pk)
    names = [s.name for s in steps]
    if step not in names:
        raise Http404(f"Job #{job.pk} has no durable step {step!r}.")
    at = names.index(step)
    status = job.state.status if hasattr(job, "state") else None
    context = {
        **model_admin.admin_site.each_context(request),
        "title": f"Run job #{job.pk} again from its step {step!r}: are you sure?",
        "opts": model_admin.opts,
        "job": job,
        "status": status,
        "applies": status in RETRYABLE,
        "step": step,
        "kept": steps[:at],
        "dropped": steps[at:],
        "waits": EventWait.objects.using(alias).filter(job_id=job.pk).exists(),
        "job_url": page,
        "media": model_admin.media,
    }
    return TemplateResponse(request, "admin/django_pgqueue/run_again_confirmation.html", context)
