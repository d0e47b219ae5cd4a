"""Observability as an extension: the trace a job is enqueued in, each attempt's span,
the per-minute rollup, and the worker registry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..extensions import Extension, WorkerParts, WorkerView
from ..worker_config import WorkerConfig
from . import tracing
from .observer import AttemptSpans, RollupObserver
from .registry import WorkerRegistry
from .rollup import RollupBuffer


class Observability(Extension):
    """OpenTelemetry spans, the per-minute rollup and the worker registry."""

    def enqueue_columns(self) -> Mapping[str, Any]:
        """The W3C traceparent of the enqueuing span, for the attempt's linked span."""
        return {"traceparent": tracing.current_traceparent()}

    def worker_parts(self, config: WorkerConfig, view: WorkerView) -> WorkerParts:
        """The observer notes finished attempts, the registry service adds them to the
        rollup: one buffer between them."""
        rollup = RollupBuffer()
        return WorkerParts(
            observers=(RollupObserver(rollup),),
            middleware=(AttemptSpans(),),
            services=(WorkerRegistry(view, rollup),),
        )
