"""The metrics view for the web process: ``path("metrics", metrics)`` in a URLconf.

It serves the queues' figures (`collector.QueueCollector`), read from the database with
index walks and estimates only, at most once per METRICS_CACHE_SECONDS per process.
Callers must be allowed: a scraper sends ``Authorization: Bearer <PGQUEUE
["METRICS_TOKEN"]>``; a logged-in user needs the ``django_pgqueue.view_job``
permission. Anyone else gets 401 (no credentials) or 403.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.utils.crypto import constant_time_compare
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ..conf import get_settings
from .collector import QueueCollector

PERMISSION = "django_pgqueue.view_job"


def metrics(request: HttpRequest) -> HttpResponse:
    """Serve the queues' figures in the Prometheus text format, to allowed callers."""
    refused = _refused(request)
    if refused is not None:
        return refused
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def _refused(request: HttpRequest) -> HttpResponse | None:
    """None when the caller may read the figures; else the response that says why not."""
    token = get_settings().METRICS_TOKEN
    given = request.headers.get("Authorization", "")
    if token is not None and constant_time_compare(given, f"Bearer {token}"):
        return None
    user = getattr(request, "user", None)  # None without AuthenticationMiddleware
    if user is not None and user.is_authenticated:
        if user.has_perm(PERMISSION):
            return None
        return HttpResponse("The metrics need the view_job permission.\n", status=403)
    response = HttpResponse(
        "The metrics need a bearer token (PGQUEUE['METRICS_TOKEN']) or a login with "
        "the view_job permission.\n",
        status=401,
    )
    if token is not None:
        response["WWW-Authenticate"] = 'Bearer realm="pgqueue metrics"'
    return response
