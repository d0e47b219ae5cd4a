"""Observability as an extension: the trace a job is enqueued in, and each worker's
`Observer` (signals, counters, the worker registry, the per-minute rollup, spans)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..extensions import Extension, WorkerHooks
from ..store.worker import Store
from ..worker_config import WorkerConfig
from . import tracing
from .hooks import Observer


class Observability(Extension):
    """Signals, metrics, the worker registry and OpenTelemetry spans."""

    def enqueue_columns(self) -> Mapping[str, Any]:
        """The W3C traceparent of the enqueuing span, for the attempt's linked span."""
        return {"traceparent": tracing.current_traceparent()}

    def worker_hooks(self, config: WorkerConfig, store: Store) -> WorkerHooks:
        return Observer(config)
