"""Snooze and cancelling a running job, at the store level (issue 14)."""

from __future__ import annotations

import pytest

from django_pgqueue import actions, enqueue
from django_pgqueue.exceptions import Snooze
from django_pgqueue.executor import snoozed
from django_pgqueue.outcomes import Retry
from django_pgqueue.validators import MAX_SECONDS
from tests.conftest import sql
from tests.integration.test_queue_control import expire_and_sweep
from tests.integration.test_queue_control import store_class as store_class  # a controlled Store

pytestmark = pytest.mark.django_db(transaction=True)


def test_snooze_goes_back_to_pending_without_spending_an_attempt(stores):
    job = enqueue("qa.noop", queue="snooze", max_attempts=1)
    store = stores()
    [row] = store.claim("snooze", 1, "w", 30)
    result = store.fail(row.job_id, row.lease_version, row.attempt_id, snoozed(Snooze(60)))
    assert result is not None
    assert result[0] == "pending"
    status, attempts, due = sql(
        "SELECT status, attempts, extract(epoch FROM run_at - now()) FROM queue_job_state "
        "WHERE job_id = %s",
        [job.id],
    )[0]
    assert (status, attempts) == ("pending", 0)
    assert 55 < due <= 60
    assert sql("SELECT status, error_class FROM queue_attempts WHERE job_id = %s", [job.id]) == [
        ("snoozed", "django_pgqueue.Snooze")
    ]
    # A stale snooze is fenced like every write.
    assert store.fail(row.job_id, row.lease_version, row.attempt_id, snoozed(Snooze(1))) is None


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf"), MAX_SECONDS + 1, True, "5"])
def test_snooze_refuses_a_bad_delay(seconds):
    with pytest.raises(ValueError, match=r"Snooze\(seconds\) must be"):
        Snooze(seconds)


def test_snooze_takes_the_shared_ten_year_bound(stores):
    """Snooze is bounded like every other duration (validators.MAX_SECONDS), not 30 days,
    and the longest one is written."""
    job = enqueue("qa.noop", queue="snooze")
    store = stores()
    [row] = store.claim("snooze", 1, "w", 30)
    snooze = Snooze(MAX_SECONDS)
    assert store.fail(row.job_id, row.lease_version, row.attempt_id, snoozed(snooze))[0] == (
        "pending"
    )
    (due,) = sql(
        "SELECT extract(epoch FROM run_at - now()) FROM queue_job_state WHERE job_id = %s",
        [job.id],
    )[0]
    assert MAX_SECONDS - 60 < due <= MAX_SECONDS


def test_cancel_a_running_job_that_finishes_anyway(stores):
    job = enqueue("qa.noop", queue="cancel")
    store = stores()
    [row] = store.claim("cancel", 1, "w", 30)
    report = actions.cancel([job.id])
    assert report.changed == [job.id]
    assert report.requested == [job.id]
    assert "cancellation requested" in report.message()
    assert sql("SELECT status FROM queue_job_state WHERE job_id = %s", [job.id]) == [("running",)]
    assert store.renew([(row.job_id, row.lease_version)], 30) == {job.id}
    assert store.cancel_requested == {job.id}
    assert store.complete([(row.job_id, row.lease_version, row.attempt_id, '{"ok": 1}')])
    assert sql("SELECT status FROM queue_job_state WHERE job_id = %s", [job.id]) == [("cancelled",)]
    assert sql("SELECT status, result FROM queue_attempts WHERE job_id = %s", [job.id]) == [
        ("succeeded", '{"ok": 1}')
    ]
    again = actions.cancel([job.id])
    assert again.changed == []
    assert again.skipped_count == 1


@pytest.mark.parametrize("ending", ["fail", "snooze", "sweep", "release"])
def test_a_cancel_requested_job_is_never_retried(stores, ending):

    job = enqueue("qa.noop", queue="cancel", max_attempts=5)
    store = stores()
    [row] = store.claim("cancel", 1, "w", 30)
    actions.cancel([job.id])
    if ending == "fail":
        store.fail(row.job_id, row.lease_version, row.attempt_id, Retry("E", "m", ""))
    elif ending == "snooze":
        store.fail(row.job_id, row.lease_version, row.attempt_id, snoozed(Snooze(5)))
    elif ending == "sweep":
        expire_and_sweep(store, [job.id])
    else:
        store.release([(row.job_id, row.lease_version, row.attempt_id)])
    assert sql("SELECT status FROM queue_job_state WHERE job_id = %s", [job.id]) == [("cancelled",)]
    # An operator retry brings it back without the old cancel request.
    assert actions.retry_now([job.id]).changed == [job.id]
    assert sql(
        "SELECT status, cancel_requested_at FROM queue_job_state WHERE job_id = %s", [job.id]
    ) == [("pending", None)]
