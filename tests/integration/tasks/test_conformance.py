"""PgQueueBackend against Django's Tasks documentation, section by section.

Written from the reference (``TaskResult``, ``TaskResultStatus``, ``TaskError``,
``TaskContext``, the signals, ``Task.get_result`` and the backend's ``validate_task``),
run with a real worker in a thread on the real database, on Django 6.1 and on Django
5.2 with the django-tasks backport. Where Django leaves a behaviour to the backend
(the id format, retries, what enqueue does inside a transaction), a test named
``test_our_choice_...`` states the one this backend makes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone
from qa.tasks import add, async_add, echo, explode, flaky, refuse, returns

import django_pgqueue
from django_pgqueue.backends import PgQueueBackend
from django_pgqueue.models import Job
from django_pgqueue.tasks.api import SOURCE

from .api import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    default_task_backend,
    task_enqueued,
    task_finished,
    task_started,
)

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "qa-tasks"


@dataclass(frozen=True)
class Sent:
    """One signal as a receiver saw it (the result object itself changes afterwards)."""

    name: str
    sender: Any
    result: Any
    status: str
    worker_ids: list[str]
    handling: type | None  # the exception being handled when it was sent


@contextlib.contextmanager
def received(*signals: Any) -> Iterator[list[Sent]]:
    """Record every sending of `signals` while the block runs."""
    names = {task_enqueued: "enqueued", task_started: "started", task_finished: "finished"}
    seen: list[Sent] = []
    receivers = []
    for signal in signals:

        def receiver(sender: Any, task_result: Any, _name: str = names[signal], **kwargs: Any):
            status, workers = str(task_result.status), list(task_result.worker_ids)
            seen.append(Sent(_name, sender, task_result, status, workers, sys.exc_info()[0]))

        signal.connect(receiver, weak=False)
        receivers.append((signal, receiver))
    try:
        yield seen
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)


def statuses(seen: list[Sent], result_id: str) -> list[tuple[str, str]]:
    return [(sent.name, sent.status) for sent in seen if sent.result.id == result_id]


# -- TaskResult: the fields of a result just enqueued ------------------------------------


def test_an_enqueued_result_is_ready_with_its_call_and_no_history():
    before = timezone.now()
    result = echo.enqueue(1, (2, 3), key={"a": [4]})
    assert result.task.func is echo.func
    assert result.status == TaskResultStatus.READY
    assert before - dt.timedelta(seconds=5) <= result.enqueued_at <= timezone.now()
    assert timezone.is_aware(result.enqueued_at)
    assert (result.started_at, result.finished_at, result.last_attempted_at) == (None, None, None)
    # Arguments are JSON: a tuple comes back as a list.
    assert result.args == [1, [2, 3]]
    assert result.kwargs == {"key": {"a": [4]}}
    assert result.backend == "default"
    assert (result.errors, result.worker_ids, result.attempts) == ([], [], 0)
    assert not result.is_finished
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018
    fetched = echo.get_result(result.id)
    assert (fetched.id, fetched.status, fetched.args, fetched.kwargs) == (
        result.id,
        TaskResultStatus.READY,
        result.args,
        result.kwargs,
    )
    assert fetched.enqueued_at == result.enqueued_at


def test_our_choice_of_result_id_is_the_job_id_in_decimal():
    first, second = add.enqueue(1, 2), add.enqueue(1, 2)
    assert isinstance(first.id, str)
    assert first.id.isdigit()
    assert int(second.id) > int(first.id)  # ids are unique and grow
    assert Job.objects.get(pk=int(first.id)).type == "qa.tasks.add"
    for unknown in ("0", "-1", "12abc", "", "9" * 30):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(unknown)


# -- status transitions: READY -> RUNNING -> SUCCESSFUL -----------------------------------


def test_a_successful_run_goes_ready_running_successful(run_worker):
    during: list[Any] = []

    def on_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        # What any process reading the result sees while the task runs.
        during.append(default_task_backend.get_result(task_result.id))

    result = add.enqueue(2, 3)
    task_started.connect(on_started, weak=False)
    try:
        with received(task_started, task_finished) as seen:
            worker = run_worker([QUEUE], burst=True)
            worker.join()
    finally:
        task_started.disconnect(on_started)

    [running] = during
    assert running.status == TaskResultStatus.RUNNING
    assert running.started_at is not None
    assert running.finished_at is None
    assert running.worker_ids == [worker.worker.worker_id]
    assert not running.is_finished
    assert statuses(seen, result.id) == [("started", "RUNNING"), ("finished", "SUCCESSFUL")]

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert result.return_value == 5
    assert result.errors == []
    assert result.worker_ids == [worker.worker.worker_id]
    assert result.attempts == 1
    assert result.enqueued_at <= result.started_at == result.last_attempted_at
    assert result.started_at <= result.finished_at


# -- FAILED, TaskError.exception_class and traceback ---------------------------------------


def test_a_failed_task_keeps_each_error_class_and_traceback(run_worker):
    result = explode.enqueue("boom")  # 2 attempts in the test project's OPTIONS
    with received(task_finished) as seen:
        run_worker([QUEUE], burst=True).join()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert result.attempts == 2
    assert len(result.errors) == 2
    for error in result.errors:
        assert error.exception_class is ValueError
        assert error.exception_class_path == "builtins.ValueError"
        assert error.traceback.startswith("Traceback (most recent call last):")
        assert "in explode" in error.traceback
        assert error.traceback.rstrip().endswith("ValueError: boom")
    assert result.finished_at >= result.last_attempted_at >= result.started_at
    # task_finished is sent once, from inside the exception handler (Django's own
    # receiver logs the traceback from sys.exc_info()).
    [sent] = [sent for sent in seen if sent.result.id == result.id]
    assert (sent.name, sent.status, sent.handling) == ("finished", "FAILED", ValueError)
    assert [e.exception_class for e in sent.result.errors] == [ValueError, ValueError]


def test_a_return_value_django_cannot_store_fails_with_djangos_type_error(run_worker, caplog):
    # Django's own test of its backends (test_complex_return_value): a task returning
    # something neither JSON nor picklable ends FAILED with a TypeError whose
    # traceback says "Unsupported type", logged at ERROR on "django.tasks".
    result = returns.enqueue("lambda")
    with received(task_finished) as seen, caplog.at_level(logging.ERROR, logger=SOURCE):
        run_worker([QUEUE], burst=True).join()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.started_at is not None
    assert result.last_attempted_at is not None
    assert result.finished_at is not None
    assert result.started_at >= result.enqueued_at
    assert result.finished_at >= result.started_at
    assert result._return_value is None
    [error] = result.errors
    assert error.exception_class is TypeError
    assert "Unsupported type" in error.traceback
    assert [r.name for r in caplog.records if r.levelno >= logging.ERROR] == [SOURCE]
    [sent] = [sent for sent in seen if sent.result.id == result.id]
    assert (sent.name, sent.status, sent.handling) == ("finished", "FAILED", TypeError)
    # Our choice: the task ran, so it is not retried (a retry would run it again).
    assert result.attempts == 1


@pytest.mark.parametrize(
    ("kind", "stored"),
    [("tuple", [1, [2, 3]]), ("utf8_bytes", "caf\u00e9")],
)
def test_a_return_value_is_stored_as_django_normalizes_it(run_worker, kind, stored):
    result = returns.enqueue(kind)
    run_worker([QUEUE], burst=True).join()
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, stored)


@pytest.mark.parametrize(
    ("kind", "error_class", "words"),
    [
        ("a_set", TypeError, "Unsupported type"),
        ("latin1_bytes", ValueError, "Unsupported value"),
        # Django stores these; PostgreSQL's jsonb cannot: the queue's own error.
        ("nul", django_pgqueue.ResultNotStorable, "NUL character"),
        ("nan", django_pgqueue.ResultNotStorable, "cannot be stored as JSON"),
    ],
)
def test_a_return_value_that_cannot_be_stored_fails_the_task_once(
    run_worker, kind, error_class, words
):
    result = returns.enqueue(kind)
    run_worker([QUEUE], burst=True).join()
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 1)
    [error] = result.errors
    assert error.exception_class is error_class
    assert words in error.traceback


def test_our_choice_permanent_failure_ends_the_task_without_retrying(run_worker):
    result = refuse.enqueue("the card was declined")
    run_worker([QUEUE], burst=True).join()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1
    [error] = result.errors
    assert error.exception_class is django_pgqueue.PermanentFailure
    assert "the card was declined" in error.traceback


def test_our_choice_failures_are_retried_and_the_result_is_ready_in_between(run_worker):
    # Retries follow the backend's OPTIONS (qa.tasks.flaky: 5 attempts, no delay). A
    # failed attempt that will be retried leaves the task READY with its error kept.
    result = flaky.enqueue(failures=2)
    with received(task_started, task_finished) as seen:
        run_worker([QUEUE], burst=True).join()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 3
    # TaskContext.attempt counts from 1; the task saw its own worker ids so far.
    assert result.return_value["attempt"] == 3
    assert result.return_value["worker_ids"] == result.worker_ids
    assert [e.exception_class for e in result.errors] == [ConnectionError, ConnectionError]
    assert statuses(seen, result.id) == [
        ("started", "RUNNING"),
        ("started", "RUNNING"),
        ("started", "RUNNING"),
        ("finished", "SUCCESSFUL"),
    ]


# -- the signals and their arguments -------------------------------------------------------


def test_the_three_signals_carry_the_backend_class_and_the_result(run_worker):
    with received(task_enqueued, task_started, task_finished) as seen:
        result = add.enqueue(4, 4)
        run_worker([QUEUE], burst=True).join()
    mine = [sent for sent in seen if sent.result.id == result.id]
    assert [sent.name for sent in mine] == ["enqueued", "started", "finished"]
    for sent in mine:
        assert sent.sender is PgQueueBackend
        assert sent.result.task.func is add.func
        assert sent.result.args == [4, 4]
        assert sent.result.backend == "default"
    enqueued, started, finished = mine
    assert (enqueued.status, enqueued.worker_ids, enqueued.handling) == ("READY", [], None)
    assert (started.status, started.handling) == ("RUNNING", None)
    assert started.result.started_at is not None
    assert (finished.status, finished.handling) == ("SUCCESSFUL", None)
    assert finished.result.return_value == 8
    assert finished.result.finished_at is not None
    assert len(finished.worker_ids) == 1
    assert started.worker_ids == finished.worker_ids


# -- get_result, refresh and their async forms ---------------------------------------------


def test_get_result_and_refresh_read_the_stored_result(run_worker):
    result = add.enqueue(10, 5)
    copy = add.get_result(result.id)
    run_worker([QUEUE], burst=True).join()
    assert copy.status == TaskResultStatus.READY  # a result is a snapshot until refreshed
    copy.refresh()
    assert (copy.status, copy.return_value) == (TaskResultStatus.SUCCESSFUL, 15)
    again = default_task_backend.get_result(result.id)
    assert again.task.func is add.func
    assert again.task.queue_name == QUEUE
    assert again.return_value == 15
    with pytest.raises(TaskResultMismatch):
        echo.get_result(result.id)
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result(str(int(result.id) + 1000))


def test_aget_result_and_arefresh_from_async_code(run_worker):
    async def enqueue() -> Any:
        return await async_add.aenqueue(1, 2)

    result = async_to_sync(enqueue)()
    fetched = async_to_sync(async_add.aget_result)(result.id)
    assert fetched.status == TaskResultStatus.READY
    run_worker([QUEUE], burst=True).join()
    async_to_sync(fetched.arefresh)()
    assert fetched.status == TaskResultStatus.SUCCESSFUL
    assert fetched.return_value == 3
    with pytest.raises(TaskResultMismatch):
        async_to_sync(add.aget_result)(result.id)
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(default_task_backend.aget_result)("424242424242")


# -- validation errors ---------------------------------------------------------------------


def local_function() -> None:
    """A module-level function whose first argument is not `context`."""


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: add.using(priority=101), "priority"),
        (lambda: add.using(priority=-101), "priority"),
        (lambda: add.using(priority=1.5), "priority"),
        (lambda: add.using(queue_name="not-configured"), "not valid for backend"),
        (lambda: add.using(run_after=dt.datetime(2030, 1, 1)), "aware"),
        (lambda: task(queue_name=QUEUE)(lambda: None), "module level"),
        (lambda: task(queue_name=QUEUE, takes_context=True)(local_function), "context"),
    ],
)
def test_an_invalid_task_is_refused_with_invalid_task(make, message):
    with pytest.raises(InvalidTask, match=message):
        make().enqueue()
    assert not Job.objects.exists()


def test_our_choice_arguments_must_be_json_values_and_nothing_is_written():
    with pytest.raises(TypeError, match=r"args\[0\] is a datetime"):
        echo.enqueue(timezone.now())
    with pytest.raises(TypeError, match=r"kwargs\['tags'\] is a set"):
        echo.enqueue(tags={"a"})
    assert not Job.objects.exists()


# -- enqueue and transactions --------------------------------------------------------------


def test_our_choice_enqueue_joins_the_callers_transaction(run_worker):
    with received(task_enqueued) as seen:
        with contextlib.suppress(RuntimeError), transaction.atomic():
            add.enqueue(1, 1)
            raise RuntimeError("the caller's transaction fails")
        assert not Job.objects.exists()
        assert seen == []  # a rolled-back task was never enqueued

        with transaction.atomic():
            result = add.enqueue(2, 2)
            assert seen == []  # sent on commit, not before
            # A worker cannot see the task until the caller commits.
            run_worker([QUEUE], burst=True).join()
        assert [sent.result.id for sent in seen] == [result.id]
    result.refresh()
    assert result.status == TaskResultStatus.READY
    run_worker([QUEUE], burst=True).join()
    result.refresh()
    assert result.return_value == 4


def test_a_deferred_task_keeps_its_run_after_and_waits_for_it(run_worker):
    run_after = timezone.now() + dt.timedelta(hours=1)
    result = add.using(run_after=run_after).enqueue(1, 2)
    run_worker([QUEUE], burst=True).join()  # nothing is due
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.task.run_after == run_after
    assert add.get_result(result.id).task.run_after == run_after
