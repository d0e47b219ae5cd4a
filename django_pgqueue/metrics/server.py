"""The worker's ``--metrics-port``: /metrics served from a thread of the worker process."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from .collector import EventLoopCollector, QueueCollector, WorkerCollector
from .counters import WorkerCounters


def serve(worker: Any, port: int, addr: str = "127.0.0.1") -> Any:
    """Serve `worker`'s counters, its event loop and its queues' figures on
    http://addr:port/metrics."""
    registry = CollectorRegistry(auto_describe=False)
    counters = WorkerCounters()
    worker.add_observer(counters)  # before it runs: it counts its attempts from the start
    registry.register(WorkerCollector(counters, worker.worker_id))
    # The server answers on its own threads: each scrape closes the Django connection
    # it opened, so no connection is left behind per request thread.
    registry.register(EventLoopCollector(worker.event_loop))
    registry.register(QueueCollector(worker.config.database, close=True))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
