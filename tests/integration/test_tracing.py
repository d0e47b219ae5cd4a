"""OpenTelemetry: enqueue stores the trace context, each attempt runs in a linked span."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_pgqueue import enqueue, enqueue_many
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Finished spans of this test (one SDK provider for the process: OTel allows one)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def traceparent_of(job_id: int) -> str | None:
    return sql("SELECT traceparent FROM queue_jobs WHERE id = %s", [job_id])[0][0]


def run_spans(exporter: InMemorySpanExporter, type_: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == f"pgqueue.run {type_}"]


def test_enqueue_stores_the_current_trace_and_the_attempt_span_links_to_it(
    spans: InMemorySpanExporter, run_worker: Any
) -> None:
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("checkout") as parent:
        job = enqueue("qa.echo", {"n": 1}, queue="otel")
        keyed = enqueue("qa.echo", {"n": 2}, queue="otel", idempotency_key="k")
        many = enqueue_many([("qa.permanent", None)], queue="otel")
    context = parent.get_span_context()
    expected = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    assert traceparent_of(job.id) == expected
    assert traceparent_of(keyed.id) == expected
    assert traceparent_of(many[0].id) == expected
    outside = enqueue("qa.echo", {"n": 3}, queue="otel")
    assert traceparent_of(outside.id) is None

    run_worker(["otel"], burst=True).join()
    runs = {s.attributes["pgqueue.job_id"]: s for s in run_spans(spans, "qa.echo")}
    span = runs[job.id]
    assert span.kind == trace.SpanKind.CONSUMER
    # Linked to the enqueuing span, not its child: a job runs later, maybe many times.
    assert [link.context.span_id for link in span.links] == [context.span_id]
    assert span.context.trace_id != context.trace_id
    assert span.attributes["pgqueue.type"] == "qa.echo"
    assert span.attributes["pgqueue.queue"] == "otel"
    assert span.attributes["pgqueue.attempt"] == 1
    assert span.attributes["pgqueue.lease_version"] == 1
    assert span.attributes["pgqueue.outcome"] == "succeeded"
    assert runs[outside.id].links == ()  # nothing to link to
    (dead,) = run_spans(spans, "qa.permanent")
    assert dead.attributes["pgqueue.outcome"] == "failed_permanently"
    assert dead.status.status_code == trace.StatusCode.ERROR
    assert "PermanentFailure" in dead.status.description


def test_a_span_is_current_while_the_handler_runs(
    spans: InMemorySpanExporter, run_worker: Any
) -> None:
    from django_pgqueue import signals

    seen: list[int] = []

    def record(sender: Any, **kwargs: Any) -> None:
        seen.append(trace.get_current_span().get_span_context().span_id)

    signals.job_started.connect(record, weak=False)
    try:
        job = enqueue("qa.noop", queue="otel")
        run_worker(["otel"], burst=True).join()
    finally:
        signals.job_started.disconnect(record)
    (span,) = run_spans(spans, "qa.noop")
    assert span.attributes["pgqueue.job_id"] == job.id
    assert seen == [span.context.span_id]


def test_the_traceparent_is_read_from_a_context_that_holds_other_values(
    spans: InMemorySpanExporter,
) -> None:
    """An empty context is skipped at once; one with other values (baggage) but no span
    stores none, one with a span stores it."""
    from opentelemetry import baggage, context

    from django_pgqueue.observability.tracing import current_traceparent

    assert current_traceparent() is None
    token = context.attach(baggage.set_baggage("tenant", "7"))
    try:
        assert current_traceparent() is None
        with trace.get_tracer("tests").start_as_current_span("inside") as span:
            ids = span.get_span_context()
            expected = f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{ids.trace_flags:02x}"
            assert current_traceparent() == expected
    finally:
        context.detach(token)
