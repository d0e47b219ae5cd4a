"""aatomic() refuses to open inside a worker's async handler, before it touches a
connection: every async handler of the worker shares its thread and connection."""

from __future__ import annotations

import asyncio

from django_pgqueue import aatomic, executor
from django_pgqueue.context import JobContext, async_handler_job
from django_pgqueue.registry import Handler
from django_pgqueue.retry import FixedDelay


def test_aatomic_in_an_async_handler_is_refused_naming_the_job():
    async def handler(ctx: JobContext) -> None:
        async with aatomic():
            raise AssertionError("never reached: the block does not open")

    ctx = JobContext(
        job_id=41, queue="q", type="t", payload={}, attempt=1, max_attempts=3, lease_version=1
    )
    outcome = asyncio.run(executor.arun(ctx, Handler("t", handler), FixedDelay(1)))
    assert isinstance(outcome, executor.Failure)
    assert outcome.error_class == "django.db.transaction.TransactionManagementError"
    assert "aatomic() in the async handler of job 41" in outcome.message
    assert "sync_to_async" in outcome.message
    assert async_handler_job.get() is None  # the mark stayed in the job's own context
