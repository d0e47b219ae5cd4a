"""EnqueuedJob built through its slots is the job its __init__ would build."""

from __future__ import annotations

import datetime as dt

from django_pgqueue.enqueue_types import EnqueuedJob, enqueued_job


def test_a_job_built_through_the_slots_equals_one_built_by_init():
    at = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
    built = enqueued_job(7, "mail", "mail.send", False, at, "bulk", True)
    assert built == EnqueuedJob(7, "mail", "mail.send", False, at, "bulk", True)
    assert (built.id, built.queue, built.type, built.database) == (7, "mail", "mail.send", "bulk")
    assert (built.created, built.created_at, built.replaced) == (False, at, True)
