"""OpenTelemetry (the ``opentelemetry`` extra): a job carries the trace it was enqueued in.

`current_traceparent` is what enqueue stores in ``queue_jobs.traceparent``: the W3C
``traceparent`` of the span active at enqueue, or None (no span, or opentelemetry-api
not installed). `attempt_span` runs one attempt in a span of its own, linked to that
trace rather than parented to it: a job may run long after, and several times.
Without opentelemetry-api both cost one failed import, once; with the API but no SDK
configured (no tracer provider set), `recording()` is false and the worker skips the
span: a no-op span per job cost the drain about a tenth of its rate. The worker asks
once per claim, so a provider set after it starts counts from its next claim.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the extra is not installed
    trace = None  # type: ignore[assignment]

TRACER_NAME = "django_pgqueue"
_propagator = TraceContextTextMapPropagator() if trace is not None else None


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span, if one is recording or sampled."""
    if trace is None:
        return None
    current = otel_context.get_current()
    if not current:  # an empty context holds no span: the common enqueue, outside any trace
        return None
    if not trace.get_current_span(current).get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def recording() -> bool:
    """Whether a tracer provider is set (spans would be exported), as of this call.

    Until an SDK (or auto-instrumentation) calls set_tracer_provider, the API hands out
    a proxy whose spans record nothing.
    """
    if trace is None:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


@contextlib.contextmanager
def attempt_span(traceparent: str | None, attributes: dict[str, Any], type_: str) -> Iterator[Any]:
    """Run the body in a span for one attempt of a `type_` job, linked to `traceparent`."""
    if trace is None:
        yield None
        return
    links = []
    if traceparent:
        linked = trace.get_current_span(
            _propagator.extract({"traceparent": traceparent})
        ).get_span_context()
        if linked.is_valid:
            links.append(trace.Link(linked))
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(
        f"pgqueue.run {type_}",
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def set_outcome(span: Any, outcome: str, error: str | None = None) -> None:
    """Record an attempt's outcome on its span (and an error status for a failure)."""
    if span is None or trace is None:
        return
    span.set_attribute("pgqueue.outcome", outcome)
    if error is not None:
        span.set_status(trace.Status(trace.StatusCode.ERROR, error))
