"""The admin's live feed of job events (``workerrecord/events/``), linked from the
Workers page: started, succeeded, retried and failed attempts as they happen,
filterable by queue and type (`django_pgqueue.observability.feed`).

The page is rendered with the latest events; a small script (``feed.js``) then polls
``events/poll/`` every POLL_SECONDS while the page is visible: each poll is one
bounded read (the attempts after the last id it saw, and those it shows running),
never a count or a scan. Without JavaScript the page still shows the latest events.
"""

from __future__ import annotations

from django.core.exceptions import BadRequest, PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern, path

from ..conf import get_settings
from ..observability import feed
from .databases import several_databases
from .observability import ReadOnlyPage

# Seconds between two polls of an open page.
POLL_SECONDS = 2


def urls(page: ReadOnlyPage) -> list[URLPattern]:
    """The feed's page and its poll, served by the Workers page's admin `page`."""
    wrap = page.admin_site.admin_view
    return [
        path("events/", wrap(lambda r: feed_page(page, r)), name="django_pgqueue_events"),
        path("events/poll/", wrap(lambda r: feed_poll(page, r)), name="django_pgqueue_events_poll"),
    ]


def feed_page(page: ReadOnlyPage, request: HttpRequest) -> HttpResponse:
    """The feed's page, with the latest events (newest first)."""
    alias, queue, type_ = _filters(request)
    read_from = get_settings().read_database(alias)
    first = feed.poll(read_from, feed.start(read_from), queue=queue, type=type_)
    return page.page(
        request,
        "admin/django_pgqueue/events.html",
        title="Job events",
        events=list(reversed(first.events)),
        after=first.after,
        open=",".join(str(i) for i in first.open),
        queue=queue or "",
        type=type_ or "",
        database=alias if several_databases() else "",
        poll_seconds=POLL_SECONDS,
    )


def feed_poll(page: ReadOnlyPage, request: HttpRequest) -> HttpResponse:
    """The events since the page's last poll, as JSON (``after``, ``open``, ``events``)."""
    if not page.has_view_permission(request):
        raise PermissionDenied
    alias, queue, type_ = _filters(request)
    after = _number(request.GET.get("after", ""), "after")
    raw_open = [part for part in request.GET.get("open", "").split(",") if part]
    open_ids = [_number(part, "open") for part in raw_open]
    read_from = get_settings().read_database(alias)
    found = feed.poll(read_from, after, open_ids, queue=queue, type=type_)
    return JsonResponse(
        {
            "events": [event.as_dict() for event in found.events],
            "after": found.after,
            "open": found.open,
        }
    )


def _filters(request: HttpRequest) -> tuple[str, str | None, str | None]:
    conf = get_settings()
    alias = request.GET.get("database") or conf.DATABASE
    if alias not in conf.queue_databases:
        raise BadRequest(f"{alias[:60]!r} is not a queue database.")
    return alias, request.GET.get("queue") or None, request.GET.get("type") or None


def _number(raw: str, name: str) -> int:
    if not raw.isascii() or not raw.isdigit() or len(raw) > 19:
        raise BadRequest(f"{name}: expected an attempt id, got {raw[:30]!r}.")
    return int(raw)
