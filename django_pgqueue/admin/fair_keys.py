"""The admin's page of a fair queue's keys: each key with pending jobs, its backlog
(due now, scheduled later, running) and its share of the queue's recent starts.

A page of KEYS_PER_PAGE keys in key order, the next page after the last key shown
(``?after=``): the keys are found as the fair claim finds them (a probe of the fair
index a key), each count stops at COUNT_CAP jobs of the key, and the share is read
from the newest SAMPLE attempts of the last SHARE_MINUTES minutes, so the page reads a
bounded part of the tables at any number of keys (`fair_keys_page` in sql/fair.sql).
Linked from the Queues page for each queue in PGQUEUE["FAIR_QUEUES"]; viewing needs
the view permission on jobs, as the Queues page does.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import BadRequest, PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from ..conf import get_settings
from ..store import operator
from ..validators import queue_name
from .observability import breadcrumbs_as_list

KEYS_PER_PAGE = 50
COUNT_CAP = 10_000
SAMPLE = 2_000
SHARE_MINUTES = 5


def fair_keys_view(model_admin: Any, request: HttpRequest) -> HttpResponse:
    """The page of `?queue=`'s keys after `?after=` (from the first key without it)."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    conf = get_settings()
    try:
        queue = queue_name(request.GET.get("queue"))
    except ValueError as exc:
        raise BadRequest(str(exc)) from exc
    if queue not in conf.FAIR_QUEUES:
        raise BadRequest(f"{queue!r} is not a fair queue (PGQUEUE['FAIR_QUEUES']).")
    after = request.GET.get("after") or None
    alias = conf.read_database(conf.database_for(queue))
    keys = operator.fair_keys(
        alias, queue, after, KEYS_PER_PAGE + 1, COUNT_CAP, SAMPLE, SHARE_MINUTES
    )
    more = len(keys) > KEYS_PER_PAGE
    keys = keys[:KEYS_PER_PAGE]
    weights = conf.FAIR_QUEUES[queue]
    all_starts = keys[0].all_starts if keys else 0
    rows = [
        {
            "key": k.key,
            "display": k.key if k.key else "(no key)",
            "weight": weights.get(k.key, 1),
            "due": k.due,
            "later": k.later,
            "capped": k.due + k.later >= COUNT_CAP,
            "running": k.running,
            "starts": k.starts,
            "share": 100 * k.starts / all_starts if all_starts else None,
        }
        for k in keys
    ]
    url = reverse("admin:django_pgqueue_queuecontrol_fair_keys")
    opts = model_admin.model._meta
    return TemplateResponse(
        request,
        "admin/django_pgqueue/fair_keys.html",
        {
            **model_admin.admin_site.each_context(request),
            "opts": opts,
            "title": f"Keys of the fair queue {queue}",
            "breadcrumbs_as_list": breadcrumbs_as_list(),
            "list_url": reverse("admin:django_pgqueue_queuecontrol_changelist"),
            "list_title": "Queues",
            "queue": queue,
            "rows": rows,
            "after": after,
            "first_url": f"{url}?queue={queue}",
            "next_after": keys[-1].key if more else None,
            "url": url,
            "all_starts": all_starts,
            "count_cap": COUNT_CAP,
            "sample": SAMPLE,
            "share_minutes": SHARE_MINUTES,
            "per_page": KEYS_PER_PAGE,
        },
    )
