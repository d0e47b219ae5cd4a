"""Read-only display columns: one factory instead of a method per field.

A column reads one value from the row (a job, its state row, an attempt) and shows
it; a missing value (no state row, a NULL, an empty text) shows as `EMPTY`, the one
mark for "no value" on every page of the queue's admin (the model admins set it as
their ``empty_value_display`` too).

Every point in time is shown in one format, `DATETIME_FORMAT`, in the admin's time
zone and naming it ("2026-12-06 03:00:00 UTC"). A list that needs its room shows how
long ago (or how soon) instead, with that time as the tooltip (`ago`).
"""

from __future__ import annotations

import datetime as dt
import html
import re
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

from ..durations import format_seconds
from ..models import Job, JobState, Status

EMPTY = "—"
# The one format of a point in time (strftime): the admin's zone, named.
DATETIME_FORMAT = "%Y-%m-%d %H:%M:%S %Z"
# The same format for Django's `date` template filter (templates use it as written).
TEMPLATE_DATETIME_FORMAT = "Y-m-d H:i:s T"


def markup(template: str, *args: Any) -> SafeString:
    """Fill `template` (str.format fields) with `args` escaped, as Django's format_html
    does: an argument with ``__html__`` (already safe) as it says, any other as its text
    HTML-escaped. A list page calls this for most of its cells: it skips format_html's
    check of every argument for a lazy translation, which made it three times slower."""
    return SafeString(
        template.format(
            *(arg.__html__() if hasattr(arg, "__html__") else html.escape(str(arg)) for arg in args)
        )
    )


def when_text(value: dt.datetime) -> str:
    """Return `value` in the one format, as plain text."""
    return timezone.localtime(value).strftime(DATETIME_FORMAT)


def when(value: Any) -> str:
    """Show a point in time in the one format (`EMPTY` for none)."""
    if value is None:
        return EMPTY
    return markup('<time datetime="{}">{}</time>', value.isoformat(), when_text(value))


def when_short(value: Any) -> str:
    """Show a point in time for a list column: the one format, which may break between
    the date and the time when the column is narrow."""
    if value is None:
        return EMPTY
    date, rest = when_text(value).split(" ", 1)
    return markup(
        '<time class="pgqueue-when" datetime="{}"><span>{}</span> <span>{}</span></time>',
        value.isoformat(),
        date,
        rest,
    )


def span(seconds: float) -> str:
    """Say a length of time compactly: '250ms', '1.5s', '12s', '3m 4s', '2h 5m', '4d 1h'."""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 10:
        return f"{seconds:.1f}s"
    return format_seconds(seconds)


def age(seconds: float) -> str:
    """Say how long ago (or, negative, how soon) compactly, to one unit: '5s', '12m', '3h'."""
    whole = abs(int(seconds))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if whole >= size:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def ago(value: dt.datetime | None, now: dt.datetime, prefix: str = "") -> str:
    """Show how long before `now` `value` was ('3m ago'), or how long after ('in 59m'),
    with `value` in the one format as the tooltip. `now` is the database's clock."""
    if value is None:
        return EMPTY
    seconds = (now - value).total_seconds()
    text = f"{age(seconds)} ago" if seconds >= 0 else f"in {age(seconds)}"
    return markup(
        '<time datetime="{}" title="{}">{}{}</time>',
        value.isoformat(),
        when_text(value),
        prefix,
        text,
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
    ordering: str | None = None,
) -> Callable[[Any, Any], Any]:
    """Make an admin display column that shows `show(read(row))`, or `empty` for no value.

    `read` is a callable or an attribute name of the row; `ordering`, the field a click
    on the column's header sorts by (None: not sortable). The result is meant to be a
    ModelAdmin (or inline) class attribute, so the admin calls it with itself and a row.
    """
    reader = attrgetter(read) if isinstance(read, str) else read

    def display(model_admin: Any, row: Any) -> Any:
        value = reader(row)
        if value is None or value == "":
            return empty
        return value if show is None else show(value)

    return admin.display(description=description, ordering=ordering)(display)


def badge(status: str) -> str:
    """Show a status as its coloured badge."""
    return markup('<span class="pgqueue-status pgqueue-{}">{}</span>', status, status)


def state_badge(state: JobState) -> str:
    """Show a job's status as its badge, marked when an operator asked a running job to
    stop: it stays running until its worker writes the attempt's end."""
    if state.status == Status.RUNNING and state.cancel_requested_at is not None:
        return markup(
            '{} <span class="pgqueue-cancel-requested" title="cancel requested at {}">'
            "cancel requested</span>",
            badge(state.status),
            when_text(state.cancel_requested_at),
        )
    return badge(state.status)


def attempts_of(state: JobState) -> str:
    """Show attempts spent out of the budget, e.g. '2/5'."""
    return f"{state.attempts}/{state.max_attempts}"


def status_summary(state: JobState) -> str:
    """Show the status badge, the attempts and a priority other than 0, on one line."""
    priority = (
        markup(
            ' <span class="pgqueue-priority" title="priority {}">p{}</span>',
            state.priority,
            state.priority,
        )
        if state.priority
        else ""
    )
    return markup(
        '{} <span class="pgqueue-attempts" title="attempts used / allowed">{}</span>{}',
        state_badge(state),
        attempts_of(state),
        priority,
    )


def breakable(name: str) -> str:
    """Show a dotted name that a narrow column may break after a dot or an underscore."""
    return mark_safe(re.sub(r"([._])", r"\1<wbr>", escape(name)))


def one_line(text: str) -> str:
    """Show a name on one line, cut with an ellipsis by its column, whole as the tooltip."""
    return markup('<span class="pgqueue-cut" title="{}">{}</span>', text, text)


# A dotted exception class at the start of an error: the list shows its last name only.
DOTTED_CLASS = re.compile(r"^(?:[A-Za-z_][\w]*\.)+(?=[A-Za-z_]\w*(?::|$))")


def error_preview(chars: int) -> Callable[[str], str]:
    """Make a renderer of an error's first line for a list: its exception class without
    the module path, cut to `chars`, the whole text as the tooltip. The line breaks
    only between words, never inside one."""

    def show(error: str) -> str:
        lines = error.strip().splitlines()
        first = DOTTED_CLASS.sub("", lines[0]) if lines else ""
        return markup(
            '<span class="pgqueue-error" title="{}">{}</span>',
            error,
            Truncator(first).chars(chars),
        )

    return show


def error_full(error: str) -> str:
    """Show a whole error text, wrapped."""
    return markup('<pre class="pgqueue-error-full">{}</pre>', error)


def duration_of(started: dt.datetime | None, finished: dt.datetime | None,
                now: dt.datetime) -> SafeString | str:  # fmt: skip
    """Show how long an attempt ran, or (in italics) has run so far by `now`."""
    if started is None:
        return EMPTY
    if finished is None:
        return markup(
            '<i class="pgqueue-so-far" title="running for {} so far">{}</i>',
            span((now - started).total_seconds()),
            span((now - started).total_seconds()),
        )
    return span((finished - started).total_seconds())
