"""A worker's report of itself and the operators' requests it obeys, in this process
(`Worker.inspect`, `Worker.obey`); through the database and real processes in
tests/acceptance/test_worker_control.py."""

from __future__ import annotations

import time
from typing import Any

import pytest

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.worker.controls import check_request

pytestmark = pytest.mark.django_db(transaction=True)

HANG_GUARD = 60.0


def wait_for(what: str, check: Any) -> Any:
    """Until check() returns something true (a hang guard, not a bound); that."""
    deadline = time.monotonic() + HANG_GUARD
    while not (found := check()):
        assert time.monotonic() < deadline, f"no {what} after {HANG_GUARD}s"
        time.sleep(0.05)
    return found


def test_the_report_says_what_runs_and_a_larger_concurrency_runs_more(run_worker):
    worker = run_worker(["wr"], concurrency=1, batch_size=1).worker
    first = enqueue("qa.sleep", {"seconds": 60}, queue="wr").id
    wait_for("the first job running", lambda: worker.inspect()["running_count"] == 1)
    report = worker.inspect()
    [job] = report["running"]
    assert (job["job_id"], job["type"], job["queue"], job["attempt"]) == (
        first,
        "qa.sleep",
        "wr",
        1,
    )
    assert report["concurrency"] == 1
    assert report["queues"] == [{"name": "wr", "weight": 1}]
    assert "qa.sleep" in report["handlers"]
    assert report["counters"]["claimed"] == 1
    assert report["rss_bytes"] > 0
    assert report["draining"] is False

    # One thread: more jobs wait. Three threads: they run beside the first.
    enqueue_many([("qa.sleep", {"seconds": 60})] * 2, queue="wr")
    assert worker.obey("concurrency", 3) == "concurrency 3 from the next claim"
    wait_for("three jobs running", lambda: worker.inspect()["running_count"] == 3)
    assert worker.inspect()["concurrency"] == 3


def test_a_drained_worker_takes_nothing_until_resumed(run_worker):
    worker = run_worker(["wd"]).worker
    wait_for("the worker's first report", lambda: worker.inspect())
    assert worker.obey("drain").startswith("draining")
    assert worker.inspect()["draining"] is True
    enqueue("qa.echo", {"x": 1}, queue="wd")
    # Its dispatcher went round meanwhile (a burst of polls at 0.1 s), claiming nothing.
    time.sleep(0.5)
    assert worker.inspect()["counters"].get("claimed", 0) == 0
    assert worker.obey("resume") == "claiming again"
    wait_for("the job completed", lambda: worker.inspect()["counters"].get("completed") == 1)


def test_stop_stops_gracefully_and_says_it_was_asked(run_worker):
    running = run_worker(["ws"])
    assert running.worker.obey("stop").startswith("stopping")
    running.join()
    assert running.worker.stopped_on_request


@pytest.mark.parametrize(
    ("action", "concurrency", "message"),
    [
        ("restart", None, "unknown action 'restart'"),
        ("concurrency", None, "give the number of handler threads"),
        ("concurrency", 0, "concurrency"),
        ("drain", 3, "drain takes no concurrency"),
    ],
)
def test_a_request_a_worker_cannot_take_is_refused(action, concurrency, message):
    with pytest.raises(ValueError, match=message):
        check_request(action, concurrency)
