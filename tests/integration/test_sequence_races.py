"""Sequences under races: real connections, each enqueue in its own transaction.

Concurrent enqueues of one sequence queue on its row (the database decides), so however
they interleave, with half of them rolled back, exactly one committed job is the head
and the rest wait in id order; enqueues racing the completions of the head never leave
a job stranded nor let two run at once.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from django.db import connections

from django_pgqueue import enqueue
from tests.conftest import sql
from tests.integration.test_unique_races import HANG_GUARD, wave

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "seq-race:1:abc"


def states(queue: str) -> list[tuple[int, str]]:
    return sql(
        "SELECT job_id, status FROM queue_job_state WHERE queue = %s ORDER BY job_id", [queue]
    )


def test_concurrent_enqueues_of_an_idle_sequence_make_exactly_one_head():
    result = wave(32, lambda n: enqueue("qa.noop", {"n": n}, queue="race1", sequence="k"))
    assert len(result.committed) == 16
    rows = states("race1")
    assert [job_id for job_id, _ in rows] == sorted(result.ids())
    # The ids are drawn under the sequence's lock: the first committed is the head.
    assert [status for _, status in rows] == ["pending"] + ["waiting"] * 15
    assert sql("SELECT head_job_id FROM queue_sequences WHERE queue = 'race1'") == [(rows[0][0],)]


def test_enqueues_racing_the_heads_completions_run_each_job_once_in_order(stores):
    store = stores()
    ran: list[int] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def complete_heads() -> None:
        # Completes each head as soon as it is claimable, while the enqueuers run.
        deadline = time.monotonic() + HANG_GUARD
        try:
            while (not stop.is_set() or unfinished("race2") > 0) and time.monotonic() < deadline:
                claimed = store.claim("race2", 10, WORKER, 300)
                assert len(claimed) <= 1, f"two jobs of one sequence at once: {claimed}"
                for row in claimed:
                    ran.append(row.job_id)
                    done = [(row.job_id, row.lease_version, row.attempt_id, json.dumps(None))]
                    assert store.complete(done)
        except BaseException as exc:  # surfaced by the test
            errors.append(exc)
        finally:
            connections.close_all()

    completer = threading.Thread(target=complete_heads, daemon=True)
    completer.start()
    try:
        result = wave(48, lambda n: enqueue("qa.noop", {"n": n}, queue="race2", sequence="k"))
    finally:
        stop.set()
        completer.join(HANG_GUARD)
    assert not completer.is_alive(), "the completer hung: a job was left waiting"
    assert not errors, errors
    assert ran == sorted(result.ids())
    assert {status for _, status in states("race2")} == {"completed"}


def unfinished(queue: str) -> int:
    """Unfinished jobs of `queue` (on this thread's own connection)."""
    return sql(
        "SELECT count(*) FROM queue_job_state WHERE queue = %s "
        "AND status IN ('waiting', 'pending', 'running')",
        [queue],
    )[0][0]
