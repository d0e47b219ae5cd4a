"""inspect_queue_workers and control_queue_workers against a real `--processes 2` worker:
what it says of its processes, and each request (stop, drain, resume, concurrency)
reaching every child through the database."""

from __future__ import annotations

import json
import os
import signal
import time
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_pgqueue import enqueue
from tests.acceptance.test_time_limits import stop
from tests.conftest import sql
from tests.reliability.conftest import wait_until
from tests.supervised import process_gone

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# A lease of 2 s: each process beats (reports, takes requests) every second.
FAST = ("--lease", "2", "--heartbeat-interval", "0.5", "--sweep-interval", "1", "-v", "1")
HANG_GUARD = 60.0


def inspect(*args: str) -> list[dict[str, Any]]:
    out = StringIO()
    call_command("inspect_queue_workers", "--json", *args, stdout=out)
    return json.loads(out.getvalue())["workers"]


def control(*args: str) -> str:
    out = StringIO()
    call_command("control_queue_workers", *args, stdout=out)
    return out.getvalue()


def wait_for(what: str, check: Any, timeout: float = HANG_GUARD) -> Any:
    """Until check() returns something true (a hang guard, not a bound); that."""
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"no {what} after {timeout}s"
        time.sleep(0.1)
    return found


def the_worker(processes: int = 2) -> dict[str, Any]:
    """The one live worker, once it has `processes` live processes that reported."""

    def found() -> dict[str, Any] | None:
        workers = inspect()
        if len(workers) != 1:
            return None
        live = [p for p in workers[0]["processes"] if p["alive"] and p["report"]]
        return workers[0] if len(live) == processes else None

    return wait_for(f"worker of {processes} live processes", found)


def reports(worker_id: str) -> list[dict[str, Any]]:
    """The reports of the live processes of the worker `worker_id`."""
    workers = [w for w in inspect() if w["id"] == worker_id]
    return [p["report"] for w in workers for p in w["processes"] if p["alive"] and p["report"]]


def claims_nothing(worker_id: str, processes: int, queue: str) -> int:
    """Enqueue a job on `queue` and require that the worker's `processes` live processes
    (draining) leave it pending over two beats each; its id."""
    job_id = enqueue("qa.echo", {"x": 1}, queue=queue).id
    since = sql("SELECT now()")[0][0]
    wait_until(
        "SELECT count(*) FROM queue_workers WHERE supervisor = %s AND last_seen_at > "
        "%s + interval '2 seconds' AND gone_at IS NULL",
        lambda n: n == processes,
        params=[worker_id, since],
    )
    assert sql("SELECT status FROM queue_job_state WHERE job_id = %s", [job_id]) == [("pending",)]
    return job_id


def test_inspect_answers_for_a_worker_of_two_processes(supervised):
    workers = supervised("insp", "--processes", "2", "--concurrency", "3", *FAST)
    workers.wait_children(2)
    job_id = enqueue("qa.sleep", {"seconds": 120}, queue="insp").id
    worker = the_worker()

    def running() -> list[dict[str, Any]]:
        return [job for r in reports(worker["id"]) for job in r["running"]]

    [job] = wait_for("the job running", running)
    assert (job["job_id"], job["type"], job["queue"], job["attempt"]) == (
        job_id,
        "qa.sleep",
        "insp",
        1,
    )
    assert job["running_seconds"] >= 0
    worker = the_worker()
    assert worker["supervised"]
    assert worker["alive"]
    assert worker["queues"] == ["insp"]
    assert (worker["concurrency"], worker["running"]) == (6, 1)
    assert len(worker["codes"]) == 1  # both children run the same code
    pids = {p["pid"] for p in worker["processes"]}
    assert pids == {child.pid for child in workers.children().values()}
    for process in worker["processes"]:
        report = process["report"]
        assert process["supervisor"] == worker["id"]
        assert report["queues"] == [{"name": "insp", "weight": 1}]
        assert {"qa.sleep", "qa.echo"} <= set(report["handlers"])
        assert report["rss_bytes"] > 0
        assert report["concurrency"] == 3
    assert worker["queue_controls"] == {"insp": None}  # no limits set
    # The text form says the same, per process.
    out = StringIO()
    call_command("inspect_queue_workers", worker["id"], stdout=out)
    text = out.getvalue()
    assert f"worker {worker['id']} (supervisor of 2 live process(es))" in text
    assert f"running #{job_id} qa.sleep on insp, attempt 1/" in text
    assert "queue insp: weight 1, no limits" in text


def test_drain_resume_concurrency_and_stop_reach_every_child(supervised):
    workers = supervised("ctl", "--processes", "2", "--concurrency", "2", *FAST)
    workers.wait_children(2)
    worker = the_worker()

    out = control("drain", "--worker", worker["id"], "--wait", str(HANG_GUARD))
    assert out.count("draining: no more claims") == 2
    wait_for("both reports draining", lambda: all(r["draining"] for r in reports(worker["id"])))
    job_id = claims_nothing(worker["id"], 2, "ctl")

    out = control("resume", "--queue", "ctl", "--wait", str(HANG_GUARD))
    assert out.count("claiming again") == 2
    wait_until(
        "SELECT status FROM queue_job_state WHERE job_id = %s",
        lambda status: status == "completed",
        params=[job_id],
    )

    out = control("concurrency", "5", "--queue", "ctl", "--wait", str(HANG_GUARD))
    assert out.count("concurrency 5 from the next claim") == 2
    wait_for(
        "both at concurrency 5",
        lambda: [r["concurrency"] for r in reports(worker["id"])] == [5, 5],
    )
    assert the_worker()["concurrency"] == 10

    # Stop: every child stops gracefully, none is restarted, the supervisor exits 0.
    children = workers.children()
    out = control("stop", "--worker", worker["id"], "--wait", str(HANG_GUARD))
    assert out.count("stopping: no more claims") == 2
    code, output = workers.wait(HANG_GUARD)
    assert code == 0, output
    assert "restarting it" not in output
    assert all(process_gone(child.pid) for child in children.values())
    # Every request is logged: by the workers, and in queue_worker_requests.
    assert output.count("(control_queue_workers) asked to stop") == 2
    logged = sql(
        "SELECT action, count(*) FROM queue_worker_requests WHERE answer IS NOT NULL "
        "GROUP BY action ORDER BY action"
    )
    assert logged == [("concurrency", 2), ("drain", 2), ("resume", 2), ("stop", 2)]

    # The worker is gone now: a request to it is refused, and says so.
    with pytest.raises(CommandError, match=rf"worker '{worker['id']}' is gone \(last seen"):
        control("drain", "--worker", worker["id"])
    with pytest.raises(CommandError, match="no live worker serves the queue 'ctl'"):
        control("resume", "--queue", "ctl")


def test_a_killed_child_shows_gone_within_its_beats_and_its_restart_joins_the_worker(
    supervised,
):
    workers = supervised("kil", "--processes", "2", *FAST)
    children = workers.wait_children(2)
    the_worker()
    os.kill(children[0].pid, signal.SIGKILL)

    # It reads as gone once three of its beats (1 s each here) were missed.
    def killed_gone() -> bool:
        processes = [p for w in inspect("--all") for p in w["processes"]]
        return any(p["pid"] == children[0].pid and not p["alive"] for p in processes)

    wait_for("the killed child gone", killed_gone)
    # Its restart registers under the same supervisor: still one worker, 2 live processes.
    worker = the_worker()
    assert len(worker["processes"]) == 3
    assert sum(1 for p in worker["processes"] if not p["alive"]) == 1


def a_fresh_child(workers: Any, old_pid: int) -> dict[str, Any]:
    """The report of the child started in place of `old_pid`, once it beat."""

    def fresh() -> dict[str, Any] | None:
        processes = [p for w in inspect() for p in w["processes"]]
        found = [p for p in processes if p["alive"] and p["report"] and p["pid"] != old_pid]
        return found[0]["report"] if found else None

    return wait_for("a fresh child's report", fresh)


def test_a_child_recycled_after_a_drain_and_a_concurrency_is_replaced_in_that_state(
    supervised,
):
    # Each child runs one job, then is replaced (a supervisor with one child).
    workers = supervised(
        "crc", "--concurrency", "2", "--max-jobs-per-process", "1", "--worker-id", "crc", *FAST
    )
    [first] = workers.wait_children(1).values()
    worker = the_worker(1)
    busy = enqueue("qa.sleep", {"seconds": 6}, queue="crc").id
    wait_until("SELECT count(*) FROM qa_ledger WHERE job_id = %s", lambda n: n == 1, params=[busy])
    # Asked while it runs its last job (recycling: it takes no new one).
    assert "concurrency 3" in control("concurrency", "3", "--worker", worker["id"], "--wait", "60")
    assert "draining" in control("drain", "--worker", worker["id"], "--wait", "60")
    wait_until(
        "SELECT status FROM queue_job_state WHERE job_id = %s",
        lambda status: status == "completed",
        params=[busy],
    )
    report = a_fresh_child(workers, first.pid)
    assert (report["draining"], report["concurrency"]) == (True, 3)
    # It obeys: drained, it claims nothing; resumed, it does.
    job_id = claims_nothing(worker["id"], 1, "crc")
    assert "claiming again" in control("resume", "--worker", worker["id"], "--wait", "60")
    wait_until(
        "SELECT status FROM queue_job_state WHERE job_id = %s",
        lambda status: status == "completed",
        params=[job_id],
    )
    stop(workers)


def test_a_request_made_as_a_child_leaves_for_its_recycle_is_obeyed(supervised):
    # A lease of 30 s: each process beats every 5 s, so the request made after the
    # beat that follows its start reaches it only as it leaves (a 1.5 s job).
    workers = supervised(
        "crl", "--max-jobs-per-process", "1", "--worker-id", "crl",
        "--lease", "30", "--heartbeat-interval", "0.5", "-v", "1",
    )  # fmt: skip
    [first] = workers.wait_children(1).values()
    worker = the_worker(1)
    seen = sql("SELECT last_seen_at FROM queue_workers WHERE pid = %s", [first.pid])[0][0]
    wait_until(
        "SELECT last_seen_at FROM queue_workers WHERE pid = %s",
        lambda last: last > seen,
        params=[first.pid],
    )
    busy = enqueue("qa.sleep", {"seconds": 1.5}, queue="crl").id
    wait_until("SELECT count(*) FROM qa_ledger WHERE job_id = %s", lambda n: n == 1, params=[busy])
    control("drain", "--worker", worker["id"])
    # Taken and answered, by the leaving child; the child started in its place drained.
    answered = wait_until(
        "SELECT answer FROM queue_worker_requests WHERE action = 'drain'",
        lambda answer: answer is not None,
    )
    assert answered.startswith("draining")
    report = a_fresh_child(workers, first.pid)
    assert report["draining"]
    stop(workers)
