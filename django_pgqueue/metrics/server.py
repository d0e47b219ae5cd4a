"""The worker's ``--metrics-port``: /metrics served from a thread of the worker process."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from ..observability.hooks import Observer
from .collector import EventLoopCollector, QueueCollector, WorkerCollector


def serve(worker: Any, port: int, addr: str = "127.0.0.1") -> Any:
    """Serve `worker`'s counters and the queues' figures on http://addr:port/metrics.

    A worker over several databases (`SeveralDatabases`) reports its parts' counters
    added up, the event loop whose lag is the largest, and every queue database.
    """
    registry = CollectorRegistry(auto_describe=False)
    parts = getattr(worker, "parts", None) or [worker]
    # None when observability is not installed.
    observers = [o for part in parts if (o := part.hooks.find(Observer)) is not None]
    if observers:
        counters = observers[0].counters if len(observers) == 1 else AddedUp(observers)
        registry.register(WorkerCollector(counters, worker.worker_id))
    # The server answers on its own threads: each scrape closes the Django connection
    # it opened, so no connection is left behind per request thread.
    loops = [part.event_loop for part in parts]
    registry.register(EventLoopCollector(loops[0] if len(loops) == 1 else LoopsView(loops)))
    alias = worker.config.database if len(parts) == 1 else None  # None: every database
    registry.register(QueueCollector(alias, close=True))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server


class AddedUp:
    """Several workers' counters as one (their queues are apart: one per database)."""

    def __init__(self, observers: list[Any]) -> None:
        self.observers = observers

    def attempts(self) -> dict[Any, int]:
        return {k: v for o in self.observers for k, v in o.counters.attempts().items()}

    def runtimes(self) -> dict[Any, Any]:
        return {k: v for o in self.observers for k, v in o.counters.runtimes().items()}


class LoopsView:
    """Several workers' event loops as one: the worst lag, the counts added up."""

    def __init__(self, loops: list[Any]) -> None:
        self.loops = loops

    def __getattr__(self, name: str) -> float:
        values = [getattr(loop, name) for loop in self.loops]
        return max(values) if name.startswith("lag") else sum(values)
