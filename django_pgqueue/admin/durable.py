"""A durable job's steps on its admin page: each checkpoint (name, kind, result, when
it was recorded, how long its function ran), and the event it is parked for."""

from __future__ import annotations

import datetime as dt
import json

from django.contrib import admin
from django.db.models import Exists, OuterRef
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from ..conf import get_settings
from ..models import EventWait, Job, JobStep, StepKind
from .columns import EMPTY, when

RESULT_PREVIEW = 200


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


@admin.display(description="steps")
def durable_steps(job: Job) -> str:
    """The job's checkpoints in the order recorded, then the event it waits for."""
    alias = _alias(job)
    now = timezone.now()
    steps = JobStep.objects.using(alias).filter(job_id=job.pk).order_by("recorded_at", "name")
    rows = [
        (
            step.name,
            step.kind,
            *_shown(step, now),
            when(step.recorded_at),
            EMPTY if step.runtime is None else f"{step.runtime * 1000:.1f} ms",
        )
        for step in steps
    ]
    wait = EventWait.objects.using(alias).filter(job_id=job.pk).first()
    if wait is not None:
        until = (
            "with no timeout"
            if wait.timeout_at is None
            else format_html("until {}", when(wait.timeout_at))
        )
        awaited = format_html("for <code>{}</code>, {}", wait.key, until)
        rows.append((wait.name, StepKind.EVENT, "waiting", awaited, when(wait.created_at), EMPTY))
    body = format_html_join(
        "",
        '<tr><td class="pgqueue-step-name">{}</td><td>{}</td><td>{}</td><td>{}</td>'
        '<td class="pgqueue-nowrap">{}</td><td class="pgqueue-nowrap">{}</td></tr>',
        ((name, kind, _badge(status), *rest) for name, kind, status, *rest in rows),
    )
    return format_html(
        '<table class="pgqueue-steps-table"><thead><tr><th>step</th><th>kind</th>'
        "<th>status</th><th>result</th><th>recorded</th><th>ran</th></tr></thead>"
        "<tbody>{}</tbody></table>",
        body,
    )
