"""A durable job's steps on its admin page: each checkpoint (name, kind, result, when
it was recorded, how long its function ran), and the event it is parked for."""

from __future__ import annotations

import json

from django.contrib import admin
from django.db.models import Exists, OuterRef
from django.utils.html import format_html, format_html_join

from ..conf import get_settings
from ..models import EventWait, Job, JobStep
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


@admin.display(description="steps")
def durable_steps(job: Job) -> str:
    """The job's checkpoints in the order recorded, then the event it waits for."""
    alias = _alias(job)
    steps = JobStep.objects.using(alias).filter(job_id=job.pk).order_by("recorded_at", "name")
    rows = format_html_join(
        "",
        "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
        (
            (
                step.name,
                step.kind,
                _result(step.result),
                when(step.recorded_at),
                EMPTY if step.runtime is None else f"{step.runtime * 1000:.1f} ms",
            )
            for step in steps
        ),
    )
    wait = EventWait.objects.using(alias).filter(job_id=job.pk).first()
    parked = (
        ""
        if wait is None
        else format_html(
            '<p class="pgqueue-quiet">Waits for the event <code>{}</code> (step {}), {}.</p>',
            wait.key,
            wait.name,
            "with no timeout"
            if wait.timeout_at is None
            else format_html("until {}", when(wait.timeout_at)),
        )
    )
    return format_html(
        '<table class="pgqueue-steps-table"><thead><tr><th>step</th><th>kind</th>'
        "<th>result</th><th>recorded</th><th>ran</th></tr></thead><tbody>{}</tbody></table>{}",
        rows,
        parked,
    )
