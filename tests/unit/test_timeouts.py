"""What a timeout leaves behind: a held job is let go when its handler returns, when
its thread ends, or one hold after the timeout; and a keyed queue's short claims."""

from __future__ import annotations

import threading

from django_pgqueue.claimed import InFlight
from django_pgqueue.control.claims import FULL_RECHECK, ControlledClaims, ControlState
from django_pgqueue.outcomes import Failure
from django_pgqueue.retry import FixedDelay
from django_pgqueue.store.worker import ClaimedRow
from django_pgqueue.worker.timeouts import Overdue

FAILURE = Failure("django_pgqueue.JobTimeout", "timed out", "", permanent=False)


def item(job_id: int) -> InFlight:
    row = ClaimedRow(job_id, "q", "t", "{}", 0, 1, 1, 1, job_id, None, None, None)
    return InFlight.claimed(row, None, FixedDelay(1), 0.1, "w", 1e12)


def test_a_held_job_is_let_go_when_its_handler_returns_its_thread_ends_or_time_is_up():
    returned, ended, running, late = item(1), item(2), item(3), item(4)
    returned.returned = True
    ended.thread = threading.Thread(target=lambda: None)
    ended.thread.start()
    ended.thread.join()
    alive = threading.Event()
    running.thread = threading.Thread(target=alive.wait, daemon=True)
    running.thread.start()
    overdue = Overdue(hold=10.0)
    for held in (returned, ended, running):
        assert overdue.keep(held, FAILURE, now=100.0)
    assert overdue.keep(late, FAILURE, now=95.0)
    assert {i.ctx.job_id for i, _ in overdue.release(now=105.0)} == {1, 2, 4}
    assert overdue.next_release() == 110.0
    assert [i.ctx.job_id for i, _ in overdue.release(now=None)] == [3]  # stopping
    alive.set()
    assert not Overdue(hold=0.0).keep(item(5), FAILURE, now=0.0)  # nothing held


def test_a_keyed_queues_short_claims_back_off_only_while_they_take_nothing():
    claims = ControlledClaims(store=None, poll_interval=1.0)  # type: ignore[arg-type]

    def after(took: int) -> float:
        claims.states["q"] = ControlState(False, False, None, keyed=True, took=took)
        return claims.recheck_after("q", 1.0)

    assert [after(0) for _ in range(3)] == [FULL_RECHECK, FULL_RECHECK * 2, FULL_RECHECK * 4]
    assert after(2) == FULL_RECHECK  # this claim took jobs: the wait starts over
    assert after(0) == FULL_RECHECK
