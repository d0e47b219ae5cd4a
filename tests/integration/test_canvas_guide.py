"""Celery's canvas guide, behaviour by behaviour, in this project's spelling, run by a
real worker: results passed as arguments, ``|``, generators, empty groups and chords,
named canvases, `WorkflowRun.wait()`, errback arguments, a failure naming its cause,
and a chained delay counted from the parent's end."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync
from qa.tasks import add, average, echo, errback, explode, mul, tsum

from django_pgqueue import (
    EnqueueError,
    JobContext,
    JobFailed,
    StepFailure,
    WaitTimeout,
    WorkflowFailed,
    chain,
    chord,
    group,
    handler,
    step,
    wait,
)
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)

Q = "canvas"
QUEUES = [Q, "qa-tasks"]
HANG_GUARD = 60.0  # seconds a wait() may take before the test fails, never a bound


@handler("canvas.double", takes_results=True)
def double(results, ctx: JobContext):
    """A handler that takes its parent's result (None when it waits for nothing)."""
    return (ctx.payload if results is None else results) * 2


@handler("canvas.atotal", takes_results=True)
async def atotal(results, ctx: JobContext):
    """An async handler that takes its parents' results (read off the event loop)."""
    return sum(results) + ctx.payload


@handler("canvas.slow")
def slow(ctx: JobContext):
    time.sleep(ctx.payload)
    return ctx.payload


@handler("canvas.failure", takes_results=True)
def failure_handler(failure, ctx: JobContext):
    assert isinstance(failure, StepFailure)
    return {"job_id": failure.job_id, "error": failure.error}


@pytest.fixture
def worker(run_worker):
    return run_worker(QUEUES, concurrency=4, poll_interval=0.05)


def test_a_chain_hands_each_result_to_the_next_task_as_its_first_argument(worker):
    # Celery: chain(add.s(4, 4), mul.s(8), mul.s(10)) -> 640
    run = chain(
        step(add, args=[4, 4]),
        step(mul, args=[8], takes_results=True),
        step(mul, args=[10], takes_results=True),
    ).enqueue()
    assert run.wait(HANG_GUARD) == 640


def test_pipe_makes_a_chain_as_celery_does(worker):
    # Celery: add.s(2, 2) | mul.s(8) | mul.s(10) -> 320
    canvas = step(add, args=[2, 2]) | step(mul, args=[8], takes_results=True)
    canvas = canvas | step(mul, args=[10], takes_results=True)
    assert isinstance(canvas, chain)
    assert len(canvas.items) == 3  # chains compose flat
    assert canvas.enqueue().wait(HANG_GUARD) == 320


def test_a_handler_takes_results_and_a_step_without_the_opt_in_keeps_its_arguments(worker):
    run = (step("canvas.double", 3, queue=Q) | step("canvas.double", queue=Q)).enqueue()
    assert run.wait(HANG_GUARD) == 12
    # An async handler takes them too: a chord's callback, a list.
    run = group(step(add, args=[i, 1]) for i in range(3)) | step("canvas.atotal", 100, queue=Q)
    assert run.enqueue().wait(HANG_GUARD) == 106
    # A task without takes_results gets its own arguments only.
    assert (step(add, args=[1, 1]) | step(add, args=[5, 5])).enqueue().wait(HANG_GUARD) == 10


def test_a_task_whose_options_say_takes_results_takes_them_in_every_step(worker):
    # settings.TASKS: "qa.tasks.average": {"takes_results": True}
    run = (group(step(add, args=[i, 0]) for i in (1, 2, 6)) | step(average)).enqueue()
    assert run.wait(HANG_GUARD) == 3


def test_group_and_chord_take_generators(worker):
    # Celery: group(add.s(i, i) for i in range(10))() -> [0, 2, ..., 18]
    run = group(step(add, args=[i, i]) for i in range(10)).enqueue()
    assert run.wait(HANG_GUARD) == [i + i for i in range(10)]
    # Celery: chord(add.s(i, i) for i in range(100))(tsum.s()) -> 9900 (10 here)
    run = chord((step(add, args=[i, i]) for i in range(10)), step(tsum, takes_results=True))
    assert run.enqueue().wait(HANG_GUARD) == 90


def test_a_group_piped_to_a_task_is_a_chord_whose_callback_gets_a_list(worker):
    canvas = group(step(add, args=[i, i]) for i in range(3)) | step(tsum, takes_results=True)
    assert isinstance(canvas, chord)
    assert canvas.enqueue().wait(HANG_GUARD) == 6
    # A chord of one member hands its callback a list of one, as Celery does.
    run = chord([step(add, args=[1, 1])], step(echo, args=["x"], takes_results=True)).enqueue()
    assert run.wait(HANG_GUARD) == {"args": [[2], "x"], "kwargs": {}}


def test_an_empty_group_and_an_empty_chord_are_celerys(worker):
    run = group().enqueue()
    assert run.jobs == {}
    assert run.wait(HANG_GUARD) == []
    assert group([]).enqueue().result() == []
    # The callback of an empty chord runs at once, with [].
    run = chord([], step(tsum, kwargs={"offset": 7}, takes_results=True)).enqueue()
    assert run.wait(HANG_GUARD) == 7
    run = chord([], step(echo, takes_results=True)).enqueue()
    assert run.wait(HANG_GUARD) == {"args": [[]], "kwargs": {}}
    # First in a chain, the next step gets []; after other steps, it would have nothing
    # to wait for: refused, before anything is written.
    assert (group() | step(echo, takes_results=True)).enqueue().wait(HANG_GUARD)["args"] == [[]]
    with pytest.raises(EnqueueError, match="an empty group after other steps"):
        chain(step(add, args=[1, 1]), chord([], step(tsum, takes_results=True))).enqueue()


def test_canvases_have_names(worker):
    run = chain(step(add, args=[1, 2]), step(mul, args=[3], takes_results=True), name="rates")
    run = run.enqueue()
    assert run.name == "rates"
    assert run.wait(HANG_GUARD) == 9
    assert sql("SELECT name FROM queue_workflows WHERE id = %s", [run.id]) == [("rates",)]
    named = group(step(add, args=[1, 1]), name="fan-out").enqueue()
    assert sql("SELECT name FROM queue_workflows WHERE id = %s", [named.id]) == [("fan-out",)]
    with pytest.raises(EnqueueError, match="name must be a non-empty string"):
        chord([], step(tsum), name="")


def test_workflow_run_wait_result_and_wait_async(run_worker):
    run = chain(step(add, args=[1, 1]), step(mul, args=[5], takes_results=True)).enqueue()
    with pytest.raises(WaitTimeout):
        run.result()  # no worker yet: not finished
    run_worker(QUEUES, concurrency=2, poll_interval=0.05)
    assert async_to_sync(run.wait_async)(HANG_GUARD) == 10
    assert run.result() == 10
    # A chord's result is its callback's; a group's, the list in group order.
    parts = group(step(add, args=[3, 0]), chain(step(add, args=[1, 1]), step(add, args=[0, 0])))
    assert parts.enqueue().wait(HANG_GUARD) == [3, 0]


def test_a_failed_workflow_names_the_failed_step_and_its_error(worker):
    run = chain(
        step(add, args=[1, 1]),
        step(explode, args=["the rates API is down"], max_attempts=1, name="fetch"),
        step(mul, args=[2], takes_results=True),
    ).enqueue(name="rates")
    with pytest.raises(WorkflowFailed) as raised:
        run.wait(HANG_GUARD)
    error = raised.value
    assert isinstance(error, JobFailed)
    assert error.step == "fetch"
    assert error.job_id == run.jobs["fetch"]
    assert error.status == "dead"
    assert "the rates API is down" in str(error)
    assert "'fetch'" in str(error)
    assert "'rates'" in str(error)
    # A chord whose member died: the same, not "cancelled".
    canvas = chord(
        [step(add, args=[1, 1]), step(explode, args=["member 2"], max_attempts=1, name="m2")],
        step(tsum, takes_results=True),
    )
    with pytest.raises(WorkflowFailed, match=r"'m2'.*member 2"):
        canvas.enqueue().wait(HANG_GUARD)


def test_an_errback_receives_the_failed_jobs_id_error_and_traceback(worker):
    run = (
        chain(
            step(add, args=[1, 1]),
            step(explode, args=["boom"], max_attempts=1, name="boom"),
        )
        .link_error(step(errback, args=["alert"], takes_results=True, name="on_error"))
        .enqueue()
    )
    with pytest.raises(WorkflowFailed, match="'boom'"):
        run.wait(HANG_GUARD)
    handed = wait(run.job("on_error"), HANG_GUARD)
    assert handed["label"] == "alert"
    assert handed["job_id"] == run.jobs["boom"]
    assert handed["step"] == "boom"
    assert handed["status"] == "dead"
    assert "boom" in handed["error"]
    assert handed["error_class"].endswith("ValueError")
    assert "raise ValueError(message)" in handed["traceback"]
    # A handler errback receives the same.
    run = (
        (step(explode, args=["again"], max_attempts=1, name="again") | step(add, args=[1, 1]))
        .link_error(step("canvas.failure", queue=Q, name="on_error"))
        .enqueue()
    )
    handed = wait(run.job("on_error"), HANG_GUARD)
    assert handed["job_id"] == run.jobs["again"]
    assert "again" in handed["error"]


def test_a_chained_delay_counts_from_the_parents_end(worker):
    # The parent runs longer than the child's delay: counted from the enqueue, the
    # child would be due the moment its parent ended.
    run = chain(
        step("canvas.slow", 1.5, queue=Q), step("canvas.double", queue=Q, delay=1)
    ).enqueue()
    assert run.wait(HANG_GUARD) == 3
    parent, child = run.jobs.values()
    (gap,) = sql(
        "SELECT EXTRACT(EPOCH FROM (c.started_at - p.finished_at))::float8 "
        "FROM queue_attempts p, queue_attempts c WHERE p.job_id = %s AND c.job_id = %s",
        [parent, child],
    )[0]
    assert gap >= 1.0
