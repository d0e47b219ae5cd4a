"""`run_queue_worker --processes N`: a supervisor and N full worker processes."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from django_pgqueue import enqueue_many
from django_pgqueue.store.worker import Store
from django_pgqueue.supervisor import EXIT_GAVE_UP, GIVE_UP_AFTER
from tests.acceptance.test_metrics import scrape, value
from tests.conftest import sql
from tests.reliability.conftest import wait_ready, wait_until
from tests.supervised import process_gone

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FAST = ("--lease", "2", "--heartbeat-interval", "0.5", "--sweep-interval", "1", "-v", "0")


def sockets_of(pid: int) -> int:
    """How many sockets the process has open."""
    fds = f"/proc/{pid}/fd"
    return sum(os.readlink(f"{fds}/{fd}").startswith("socket:") for fd in os.listdir(fds))


def free_ports(count: int) -> int:
    """A port P with P..P+count-1 all free just now."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        socks = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise AssertionError("no run of free ports")


def test_children_are_full_workers_each_registered_and_serving_metrics(supervised):
    port = free_ports(2)
    workers = supervised(
        "pp", "--processes", "2", "--worker-id", "pp", "--concurrency", "2",
        "--metrics-port", str(port), *FAST,
    )  # fmt: skip
    children = workers.wait_children(2)
    assert {child.worker_id for child in children.values()} == {"pp-0.1", "pp-1.1"}
    for child in children.values():
        wait_ready(child.worker_id)
    jobs = 40
    enqueue_many([("qa.ledger", {"seconds": 0.05}) for _ in range(jobs)], queue="pp")
    wait_until(
        "SELECT count(*) FROM queue_job_state WHERE status = 'completed'", lambda n: n == jobs
    )
    # Each child is its own worker: its own pid and id in the registry and the attempts.
    registry = dict(sql("SELECT id, pid FROM queue_workers WHERE gone_at IS NULL"))
    assert registry == {child.worker_id: child.pid for child in children.values()}
    ran_by = dict(sql("SELECT worker_id, count(*) FROM qa_ledger GROUP BY 1"))
    assert set(ran_by) == set(registry), ran_by  # both children ran jobs
    assert sum(ran_by.values()) == jobs
    # Child i serves its own counters on port + i; together they count every attempt.
    succeeded = [
        value(
            scrape(f"http://127.0.0.1:{port + index}/metrics"),
            "pgqueue_attempts_total",
            queue="pp",
            type="qa.ledger",
            outcome="succeeded",
        )
        for index in range(2)
    ]
    assert succeeded == [ran_by["pp-0.1"], ran_by["pp-1.1"]]
    # The supervisor holds no database connection: not a socket open, while each child
    # holds its worker's connections.
    assert sockets_of(workers.pid) == 0
    assert all(sockets_of(child.pid) >= 3 for child in children.values())
    workers.signal(signal.SIGTERM)
    code, output = workers.wait(60)
    assert code == 0, output
    assert all(process_gone(child.pid) for child in children.values())
    assert sql("SELECT count(*) FROM queue_workers WHERE gone_at IS NULL") == [(0,)]


def test_a_killed_child_is_restarted_and_a_stop_reaches_the_new_one(supervised):
    workers = supervised("pk", "--processes", "2", "--worker-id", "pk", *FAST)
    before = workers.wait_children(2)
    victim = before[1]
    os.kill(victim.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while (child := workers.children().get(1)) is None or child.pid == victim.pid:
        assert time.monotonic() < deadline, "child 1 was not restarted"
        time.sleep(0.05)
    assert child.worker_id == "pk-1.2"  # a new identity for the new process
    assert workers.children()[0].pid == before[0].pid  # the other child untouched
    wait_ready(child.worker_id)
    workers.signal(signal.SIGINT)  # passed on like SIGTERM
    code, output = workers.wait(60)
    assert code == 0, output
    assert "supervisor: SIGINT: stopping the workers gracefully" in output
    assert "child 1 (pid" in output
    assert "killed by SIGKILL; restarting it in 0.5s" in output


def test_a_second_signal_to_the_supervisor_stops_the_children_at_once(supervised):
    workers = supervised(
        "p2", "--processes", "2", "--worker-id", "p2", "--concurrency", "1",
        "--shutdown-grace", "120", *FAST,
    )  # fmt: skip
    for child in workers.wait_children(2).values():
        wait_ready(child.worker_id)
    jobs = [job.id for job in enqueue_many([("qa.ledger", {"seconds": 120})] * 2, queue="p2")]
    wait_until("SELECT count(DISTINCT worker_id) FROM qa_ledger", lambda n: n == 2)
    workers.signal(signal.SIGTERM)
    workers.read_until("stopping the workers gracefully")
    assert workers.proc.poll() is None  # the first waits for the handlers' 120 s
    workers.signal(signal.SIGTERM)
    code, output = workers.wait(60)  # well inside the 120 s grace: the second one forced it
    assert code == 0, output
    assert "supervisor: second SIGTERM: the workers stop now" in output
    # Each child closed its running job's attempt as interrupted and kept the row held
    # while the handler could still run; with the processes gone, the first sweep gives
    # the attempts back: due again at once, none spent by the stop.
    assert sql(
        "SELECT status, count(*) FROM queue_job_state WHERE job_id = ANY(%s) "
        "AND locked_until <= now() GROUP BY 1",
        [jobs],
    ) == [("running", 2)]
    store = Store("default", "processes test sweep")
    try:
        assert sorted(row[0] for row in store.sweep()) == sorted(jobs)
    finally:
        store.close()
    assert sql(
        "SELECT status, attempts, count(*) FROM queue_job_state WHERE job_id = ANY(%s) "
        "GROUP BY 1, 2",
        [jobs],
    ) == [("pending", 0, 2)]
    assert sql("SELECT status, count(*) FROM queue_attempts GROUP BY 1") == [("interrupted", 2)]


def test_a_child_that_cannot_start_makes_the_supervisor_give_up(supervised):
    port = free_ports(2)
    with socket.socket() as taken:  # child 1's port is taken: it exits at once, every time
        taken.bind(("127.0.0.1", port + 1))
        taken.listen()
        workers = supervised(
            "pg", "--processes", "2", "--worker-id", "pg", "--metrics-port", str(port), *FAST
        )
        code, output = workers.wait(120)
    assert code == EXIT_GAVE_UP, output
    assert output.count("cannot listen on 127.0.0.1") == GIVE_UP_AFTER
    died = "child 1 died at its start (before it was up, or within 10s)"
    assert f"{died} {GIVE_UP_AFTER} times in a row" in output
    # The healthy child was stopped gracefully (its registry row closed), not left running.
    assert sql("SELECT id, gone_at IS NOT NULL FROM queue_workers") == [("pg-0.1", True)]


def test_children_stop_gracefully_when_the_supervisor_is_sigkilled(supervised):
    workers = supervised("ps", "--processes", "2", "--worker-id", "ps", "--concurrency", "2", *FAST)
    children = workers.wait_children(2)
    for child in children.values():
        wait_ready(child.worker_id)
    jobs = [job.id for job in enqueue_many([("qa.ledger", {"seconds": 2})] * 4, queue="ps")]
    wait_until("SELECT count(DISTINCT worker_id) FROM qa_ledger", lambda n: n == 2)
    wait_until("SELECT count(*) FROM qa_ledger", lambda n: n == 4)
    workers.proc.kill()  # SIGKILL: the supervisor cannot forward anything
    workers.proc.wait(10)
    wait_until(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgqueue %% ps-%%'",
        lambda n: n == 0,
    )
    # The handlers ran to their end and were written by their own worker: no lease
    # expired, no attempt lost, nothing left for the sweep.
    assert sql(
        "SELECT status, count(*) FROM queue_job_state WHERE job_id = ANY(%s) GROUP BY 1", [jobs]
    ) == [("completed", 4)]
    assert sql("SELECT status, count(*) FROM queue_attempts GROUP BY 1") == [("succeeded", 4)]
    assert sql("SELECT count(*) FROM queue_workers WHERE gone_at IS NULL") == [(0,)]
    deadline = time.monotonic() + 30
    while not all(process_gone(child.pid) for child in children.values()):
        assert time.monotonic() < deadline, "a child outlived its supervisor"
        time.sleep(0.05)


def test_burst_children_exit_when_the_queue_is_done_and_are_not_restarted(supervised):
    jobs = 30
    enqueue_many([("qa.ledger", {"seconds": 0.01}) for _ in range(jobs)], queue="pb")
    workers = supervised("pb", "--processes", "2", "--burst", *FAST)
    code, output = workers.wait(120)
    assert code == 0, output
    assert sql("SELECT status, count(*) FROM queue_job_state GROUP BY 1") == [("completed", jobs)]
    assert "restarting" not in output
