"""The metrics view for the web process: ``path("metrics", metrics)`` in a URLconf.

It serves the queues' figures (`collector.QueueCollector`), read from the database on
each scrape with index walks and estimates only. Protect the URL as any other
internal endpoint (a private network, a reverse proxy rule, or a wrapping view).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .collector import QueueCollector


def metrics(request: HttpRequest) -> HttpResponse:
    """Serve the queues' figures in the Prometheus text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
