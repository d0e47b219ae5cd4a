"""Failures the queue records itself, as Django's Tasks API shows them.

A task's `TaskError.exception_class` imports the stored class path; the queue's own
failures (a result that cannot be stored, a worker that stopped, a lease that ran out)
are real classes in `django_pgqueue`. `task_finished` says the status the result is
stored with.
"""

from __future__ import annotations

import logging

import pytest
from qa.tasks import add, explode, returns, unstorable

import django_pgqueue
from django_pgqueue.tasks.api import SOURCE
from tests.conftest import sql

from .api import TaskResultStatus, task_finished

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "qa-tasks"


def failed_with(error_class: str) -> str:
    """Enqueue a task and end it dead after one attempt recorded with `error_class`."""
    result = add.enqueue(1, 1)
    sql(
        "UPDATE queue_job_state SET status = 'dead', attempts = 1, lease_version = 1, "
        "finished_at = now(), last_error = %s WHERE job_id = %s",
        [f"{error_class}: what happened", int(result.id)],
    )
    sql(
        "INSERT INTO queue_attempts (job_id, lease_version, attempt_index, worker_id, status, "
        "started_at, finished_at, error_class, error_message, traceback) "
        "VALUES (%s, 1, 1, 'worker-a', 'failed', now(), now(), %s, 'what happened', '')",
        [int(result.id), error_class],
    )
    return result.id


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ("django_pgqueue.ResultNotStorable", django_pgqueue.ResultNotStorable),
        ("django_pgqueue.WorkerShutdown", django_pgqueue.WorkerShutdown),
        ("django_pgqueue.LeaseExpired", django_pgqueue.LeaseExpired),
        # What the lease sweep stored before the class existed.
        ("LeaseExpired", django_pgqueue.LeaseExpired),
        ("ValueError", ValueError),
    ],
)
def test_a_recorded_failure_imports_as_its_exception_class(stored, expected):
    [error] = add.get_result(failed_with(stored)).errors
    assert error.exception_class is expected
    assert issubclass(error.exception_class, Exception)
    assert error.traceback == f"{stored}: what happened"


@pytest.mark.parametrize(
    ("task", "args", "error_class"),
    [
        (unstorable, (), TypeError),  # object(): Django's rule refuses it
        (returns, ("nul",), django_pgqueue.ResultNotStorable),  # jsonb refuses it
    ],
)
def test_an_unstorable_return_value_finishes_failed_in_the_signal_as_in_the_result(
    run_worker, task, args, error_class
):
    finished: list[tuple[str, list[type]]] = []

    def on_finished(sender, task_result, **kwargs):
        classes = [error.exception_class for error in task_result.errors]
        finished.append((str(task_result.status), classes))

    task_finished.connect(on_finished, weak=False)
    try:
        result = task.enqueue(*args)
        run_worker([QUEUE], burst=True).join()
    finally:
        task_finished.disconnect(on_finished)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class is error_class
    assert finished == [("FAILED", [error_class])]


def test_a_failed_task_is_logged_once_with_djangos_own_line_kept(run_worker, caplog):
    # Django's own task_finished receiver logs a FAILED task on "django.tasks" (the
    # backport: "django_tasks") with its traceback, and anyone watching that logger
    # must see it: the worker's own line for the dead job is INFO, not a second ERROR.
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.INFO, logger="django_pgqueue")
    result = explode.enqueue("boom, logged once")
    run_worker([QUEUE], burst=True).join()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    failures = [
        (record.name, record.levelname)
        for record in caplog.records
        if (record.levelno >= logging.ERROR and f"id={result.id} " in f"{record.getMessage()} ")
        or f"job {result.id} " in record.getMessage()
    ]
    assert failures == [
        ("django_pgqueue.worker.writer", "WARNING"),  # attempt 1 of 2, retried
        (SOURCE, "ERROR"),  # Django's: the task failed, with its traceback
        ("django_pgqueue.worker.writer", "INFO"),  # dead, said once at ERROR already
    ]
    [django_line] = [r for r in caplog.records if r.name == SOURCE and r.levelno >= logging.ERROR]
    assert django_line.exc_info is not None
