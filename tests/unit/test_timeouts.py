"""What a timeout decides: the job's verdict, its handler counted as stuck once it
outlived the timeout by as much again and still runs, the worker told to exit when all
its threads are stuck; and a keyed queue's short claims."""

from __future__ import annotations

import threading

from django_pgqueue.claimed import ClaimedJob
from django_pgqueue.outcomes import Retry
from django_pgqueue.retry import FixedDelay
from django_pgqueue.store.claims import FULL_RECHECK, ControlState, QueueClaims
from django_pgqueue.store.worker import ClaimedRow
from django_pgqueue.worker.timeouts import all_stuck, stuck

FAILURE = Retry("django_pgqueue.JobTimeout", "timed out", "")


def item(job_id: int) -> ClaimedJob:
    row = ClaimedRow(job_id, "q", "t", "{}", 0, 1, 1, 1, job_id, None, None, None)
    return ClaimedJob.claimed(row, None, FixedDelay(1), 10.0, "w", 1e12)


def test_a_decided_timeout_is_the_verdict_and_the_lease_reads_lost_to_the_handler():
    timed = item(1)
    timed.decide(FAILURE, now=100.0)
    assert (timed.verdict, timed.timed_out, timed.timed_out_at) == (FAILURE, True, 100.0)
    assert timed.ctx.lease_lost()


def test_a_handler_is_stuck_once_it_outlived_its_timeout_by_as_much_again_and_runs():
    running, returned, ended, fresh = item(1), item(2), item(3), item(4)
    alive = threading.Event()
    running.thread = threading.Thread(target=alive.wait, daemon=True)
    running.thread.start()
    ended.thread = threading.Thread(target=lambda: None)
    ended.thread.start()
    ended.thread.join()
    returned.reported = True
    for timed in (running, returned, ended):
        timed.decide(FAILURE, now=100.0)
    fresh.decide(FAILURE, now=105.0)  # timed out later: not stuck yet
    try:
        assert stuck([running, returned, ended, fresh], now=110.0) == 1
        assert stuck([running], now=109.0) == 0
    finally:
        alive.set()
    assert not all_stuck(1, 2, "w")
    assert all_stuck(2, 2, "w")


def test_a_keyed_queues_short_claims_back_off_only_while_they_take_nothing():
    claims = QueueClaims(session=None, view_every=0.5)  # type: ignore[arg-type]
    claims._controlled = frozenset({"q"})

    def after(took: int) -> float:
        claims.states["q"] = ControlState(False, False, None, keyed=True, took=took)
        wait = claims.retry_short("q", 1.0)
        assert wait is not None
        return wait

    assert [after(0) for _ in range(3)] == [FULL_RECHECK, FULL_RECHECK * 2, FULL_RECHECK * 4]
    assert after(2) == FULL_RECHECK  # this claim took jobs: the wait starts over
    assert after(0) == FULL_RECHECK
