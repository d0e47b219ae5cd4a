"""Read-only display columns: one factory instead of a method per field.

A column reads one value from the row (a job, its state row, an attempt) and shows
it; a missing value (no state row, a NULL, an empty text) shows as a dash.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe
from django.utils.text import Truncator

from ..models import Job, JobState, Status

EMPTY = "—"


def when(value: Any, *, zone: bool = True) -> str:
    """Show a timestamp as operators read it: local time to the second (and the zone)."""
    if value is None:
        return EMPTY
    local = timezone.localtime(value)
    if zone:
        return local.strftime("%Y-%m-%d %H:%M:%S %Z")
    return format_html(
        '<span title="{}">{}</span>', local.strftime("%Z"), local.strftime("%Y-%m-%d %H:%M:%S")
    )


def when_short(value: Any) -> str:
    """Show a timestamp for a list column: date, then time (below it if the column is
    narrow), the zone only as the tooltip."""
    if value is None:
        return EMPTY
    local = timezone.localtime(value)
    return format_html(
        '<span class="pgqueue-when" title="{}"><span>{}</span> <span>{}</span></span>',
        local.strftime("%Z"),
        local.strftime("%Y-%m-%d"),
        local.strftime("%H:%M:%S"),
    )


def state_of(job: Job) -> JobState | None:
    """Return the job's state row (joined with the job), or None if it has none."""
    try:
        return job.state
    except JobState.DoesNotExist:
        return None


def state_field(name: str) -> Callable[[Job], Any]:
    """Make a reader of one field of the job's state row (None without a state row)."""

    def read(job: Job) -> Any:
        state = state_of(job)
        return None if state is None else getattr(state, name)

    return read


def current_error(job: Job) -> str | None:
    """Return the job's last error while it still matters: not once the job completed.

    A completed job keeps the error of an earlier attempt in its state row; the
    attempts keep that history, so the job itself shows none.
    """
    state = state_of(job)
    if state is None or state.status == Status.COMPLETED:
        return None
    return state.last_error


def column(
    description: str,
    read: Callable[[Any], Any] | str,
    show: Callable[[Any], Any] | None = None,
    *,
    empty: str = EMPTY,
) -> Callable[[Any, Any], Any]:
    """Make an admin display column that shows `show(read(row))`, or `empty` for no value.

    `read` is a callable or an attribute name of the row. The result is meant to be a
    ModelAdmin (or inline) class attribute, so the admin calls it with itself and a row.
    """
    reader = attrgetter(read) if isinstance(read, str) else read

    def display(model_admin: Any, row: Any) -> Any:
        value = reader(row)
        if value is None or value == "":
            return empty
        return value if show is None else show(value)

    return admin.display(description=description)(display)


def badge(status: str) -> str:
    """Show a status as its coloured badge."""
    return format_html('<span class="pgqueue-status pgqueue-{}">{}</span>', status, status)


def attempts_of(state: JobState) -> str:
    """Show attempts spent out of the budget, e.g. '2/5'."""
    return f"{state.attempts}/{state.max_attempts}"


def status_summary(state: JobState) -> str:
    """Show the status badge, the attempts and a priority other than 0, for a narrow list."""
    priority = (
        format_html(' <span class="pgqueue-priority">priority {}</span>', state.priority)
        if state.priority
        else ""
    )
    return format_html(
        '{} <span class="pgqueue-attempts" title="attempts used / allowed">{}</span>{}',
        badge(state.status),
        attempts_of(state),
        priority,
    )


def breakable(name: str) -> str:
    """Show a dotted name that a narrow column may break after a dot or an underscore."""
    return mark_safe(re.sub(r"([._])", r"\1<wbr>", escape(name)))


def type_and_queue(job: Job) -> str:
    """Show a job's type with its queue under it, for a narrow list."""
    return format_html(
        '{}<br><span class="pgqueue-queue" title="queue">{}</span>', breakable(job.type), job.queue
    )


def error_preview(chars: int) -> Callable[[str], str]:
    """Make a renderer of an error's first line, cut to `chars`, whole text as the tooltip."""

    def show(error: str) -> str:
        lines = error.strip().splitlines()
        return format_html(
            '<span class="pgqueue-error" title="{}">{}</span>',
            error,
            Truncator(lines[0] if lines else "").chars(chars),
        )

    return show


def error_full(error: str) -> str:
    """Show a whole error text, wrapped."""
    return format_html('<pre class="pgqueue-error-full">{}</pre>', error)
