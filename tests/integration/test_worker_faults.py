"""The worker's invariant, finding by finding (issue 12): whatever a handler, its
thread or the database does, every claimed job ends with an attempt saying why, and the
worker keeps its handler threads."""

from __future__ import annotations

import pytest

from django_pgqueue import enqueue
from django_pgqueue.models import Attempt, JobState
from tests.conftest import sql
from tests.integration.test_worker import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def status(job_id: int) -> str:
    return JobState.objects.get(pk=job_id).status


def test_a_payload_too_deep_to_decode_fails_its_job_and_the_thread_goes_on(run_worker):
    nested = enqueue("qa.outcome", {"do": "return"}, queue="deep")
    # jsonb takes nesting that Python's json.loads cannot (RecursionError).
    sql(
        "UPDATE queue_jobs SET payload = (repeat('[', 12000) || repeat(']', 12000))::jsonb "
        "WHERE id = %s",
        [nested.id],
    )
    after = enqueue("qa.outcome", {"do": "return"}, queue="deep")
    run_worker(["deep"], concurrency=1, poll_interval=0.1)
    wait_until(lambda: status(after.id) == "completed", timeout=10)
    assert status(nested.id) == "dead"
    attempt = Attempt.objects.get(job_id=nested.id)
    assert attempt.error_class == "RecursionError"


def test_a_handler_thread_that_dies_has_its_job_failed_and_is_replaced(run_worker, monkeypatch):
    from django_pgqueue.worker import pool

    doomed = enqueue("qa.outcome", {"do": "return"}, queue="die", max_attempts=1)
    real = pool._execute

    def dies_on_doomed(item):
        if item.ctx.job_id == doomed.id:
            raise SystemExit("the thread ends outside any handler")
        return real(item)

    monkeypatch.setattr(pool, "_execute", dies_on_doomed)
    worker = run_worker(["die"], concurrency=1, poll_interval=0.1)
    wait_until(lambda: status(doomed.id) == "dead", timeout=10)
    assert Attempt.objects.get(job_id=doomed.id).error_class == "django_pgqueue.HandlerThreadDied"
    later = enqueue("qa.outcome", {"do": "return"}, queue="die")
    wait_until(lambda: status(later.id) == "completed", timeout=10)
    assert worker.worker.stats["threads_died"] == 1
