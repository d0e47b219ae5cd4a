"""Wait for a Django Tasks result of this backend, as `django_pgqueue.wait` waits for a job.

``wait_result(result, timeout=...)`` is Celery's ``AsyncResult.get(timeout=...)`` for
a ``TaskResult``: it blocks until the task's job finishes, refreshes the result (so
its ``status``, ``errors`` and ``return_value`` are current) and returns the return
value; `await_result` is the same for async code.
"""

from __future__ import annotations

from typing import Any

from .. import waiting
from ..exceptions import JobFailed
from ..job_refs import job_reference
from .api import TaskResult, task_backends
from .backend import PgQueueBackend


def _result_job(result: TaskResult) -> tuple[int, str]:
    """(job id, alias) of `result`'s job: its result id names both."""
    backend = task_backends[result.backend]
    if not isinstance(backend, PgQueueBackend):
        raise TypeError(
            f"wait_result() waits for results of PgQueueBackend; the result's backend "
            f"{result.backend!r} is a {type(backend).__name__}"
        )
    job = job_reference(result.id, caller="wait_result()")
    return job.id, job.database


def wait_result(result: TaskResult, timeout: float | None = None) -> Any:
    """Wait until the task finishes; refresh `result` and return its return value.

    Raises what `django_pgqueue.wait` raises: `WaitTimeout` (the result is left as it
    was), `JobDead` or `JobCancelled` (the result is refreshed first: its status is
    FAILED and its errors say why).
    """
    job_id, database = _result_job(result)
    try:
        waiting.wait(job_id, timeout, using=database)
    except JobFailed:
        result.refresh()
        raise
    result.refresh()
    return result.return_value


async def await_result(result: TaskResult, timeout: float | None = None) -> Any:
    """`wait_result()` for async code: the same result and exceptions."""
    job_id, database = _result_job(result)
    try:
        await waiting.await_job(job_id, timeout, using=database)
    except JobFailed:
        await result.arefresh()
        raise
    await result.arefresh()
    return result.return_value
