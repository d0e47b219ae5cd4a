"""wait_result() / await_result(): a TaskResult's outcome, as Celery's AsyncResult.get()."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from django.utils import timezone
from qa.tasks import add, echo, refuse

from django_pgqueue import JobCancelled, JobDead, WaitTimeout, actions
from django_pgqueue.backends import await_result, wait_result

from .api import TaskResultStatus

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "qa-tasks"


def test_wait_result_returns_the_value_and_refreshes_the_result(run_worker):
    result = add.enqueue(2, 3)
    run_worker([QUEUE])
    assert wait_result(result, timeout=60) == 5
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5


def test_a_failed_task_raises_job_dead_and_the_result_says_why(run_worker):
    result = refuse.enqueue("never")
    run_worker([QUEUE])
    with pytest.raises(JobDead, match="is dead"):
        wait_result(result, timeout=60)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class.__name__ == "PermanentFailure"


def test_a_cancelled_task_raises_job_cancelled():
    result = echo.using(run_after=timezone.now() + dt.timedelta(hours=1)).enqueue(1)
    actions.cancel([int(result.id)])
    with pytest.raises(JobCancelled):
        wait_result(result, timeout=60)
    assert result.status == TaskResultStatus.FAILED


def test_timeout_leaves_the_result_as_it_was():
    result = echo.using(run_after=timezone.now() + dt.timedelta(hours=1)).enqueue(1)
    with pytest.raises(WaitTimeout, match="it is pending"):
        wait_result(result, timeout=0.1)
    assert result.status == TaskResultStatus.READY


def test_await_result(run_worker):
    result = add.enqueue(4, 5)
    run_worker([QUEUE])

    async def main() -> int:
        try:
            return await await_result(result, timeout=60)
        finally:  # arefresh() ran in asgiref's sync thread: close its connection
            await sync_to_async(connections.close_all, thread_sensitive=True)()

    assert asyncio.run(main()) == 9
    assert result.status == TaskResultStatus.SUCCESSFUL
