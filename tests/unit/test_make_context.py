"""make_context(): the JobContext a worker would give a handler, for calling it directly."""

from __future__ import annotations

import datetime as dt

import pytest
from qa.jobs import report

from django_pgqueue import PayloadError
from django_pgqueue.testing import make_context

TICK = dt.datetime(2026, 3, 1, 6, 0, tzinfo=dt.UTC)


def test_a_handler_called_with_its_context():
    ctx = make_context("qa.report", {"items": (1, 2)}, attempt=2)
    # The payload went through JSON, as a stored job's does: the tuple is a list.
    assert report(ctx) == {"day": None, "attempt": 2, "payload": {"items": [1, 2]}}
    assert ctx.max_attempts == 5  # PGQUEUE["MAX_ATTEMPTS"]' default: qa.report sets none
    assert not ctx.is_last_attempt
    assert ctx.queue == "default"
    assert ctx.idempotency_key == "pgqueue-1"
    assert not ctx.lease_lost()
    assert not ctx.cancel_requested()


def test_the_handlers_own_max_attempts_and_the_last_attempt():
    ctx = make_context("qa.flaky", {}, attempt=5)
    assert (ctx.max_attempts, ctx.is_last_attempt) == (5, True)


def test_scheduled_for_is_what_the_handler_reads():
    ctx = make_context("qa.report", scheduled_for=TICK)
    assert ctx.scheduled_for == TICK
    assert report(ctx)["day"] == "2026-03-01"
    assert ctx.idempotency_key == "schedule:qa.report@2026-03-01T06:00:00+00:00"


def test_lease_lost_and_cancel_requested():
    assert report(make_context("qa.report", lease_lost=True)) == {"stopped": True}
    assert make_context("qa.report", cancel_requested=True).cancel_requested()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"attempt": 0}, ValueError, "attempt must be an integer >= 1, got 0"),
        ({"attempt": 3, "max_attempts": 2}, ValueError, "max_attempts must be an integer >= 3"),
        ({"scheduled_for": dt.datetime(2026, 3, 1)}, ValueError, "must be an aware datetime"),
        ({"scheduled_for": TICK, "idempotency_key": "k"}, ValueError, "not both"),
        ({"queue": "no spaces"}, ValueError, "queue"),
        ({"payload": {"when": dt.date(2026, 1, 1)}}, PayloadError, r"payload\['when'\]"),
    ],
)
def test_bad_arguments_name_the_problem(kwargs, error, message):
    kwargs.setdefault("payload", {})
    with pytest.raises(error, match=message):
        make_context("qa.report", **kwargs)


def test_a_bad_type_name():
    with pytest.raises(ValueError, match="type"):
        make_context("", {})


def test_parent_results_are_what_a_workflow_step_reads():
    ctx = make_context("qa.report", parent_results={"a": (1, 2), "b": None})
    assert ctx.parent_results == {"a": [1, 2], "b": None}  # through JSON, as stored
    assert make_context("qa.report").parent_results == {}  # not a step of a workflow
    with pytest.raises(ValueError, match="parent_results must be a dict"):
        make_context("qa.report", parent_results=[1])
