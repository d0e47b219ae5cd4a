"""A supervisor writing the jobs of a child ended for its hard time limit while the
database is slow to answer (its postmaster SIGSTOPped: a new connection waits, up to
its connect_timeout of 10 s) keeps supervising its other children: a child SIGKILLed
meanwhile is restarted before that write ended, and the write lands once the database
answers again (before the write's connection could time out)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import psutil
import pytest

from tests.acceptance.test_time_limits import LIMITED, stop
from tests.reliability.pgserver import running_server
from tests.supervised import process_gone

pytestmark = pytest.mark.django_db(transaction=True)

HANG_GUARD = 60.0
ENQUEUE = (
    "from django_pgqueue import enqueue; "
    "print(enqueue('qa.limit_sleep_long', {}, queue='stall', max_attempts=2).id)"
)


def wait_for(what: str, check: Callable[[], object]) -> None:
    deadline = time.monotonic() + HANG_GUARD  # a hang guard, not a bound
    while not check():
        assert time.monotonic() < deadline, f"no {what} after {HANG_GUARD}s"
        time.sleep(0.05)


def connecting_to(pid: int, port: int) -> bool:
    """Process `pid` has a TCP connection to `port` (its write's, opened or opening)."""
    return any(
        conn.raddr and conn.raddr.port == port
        for conn in psutil.Process(pid).net_connections(kind="tcp")
    )


def test_a_slow_database_does_not_hold_the_supervision_of_the_other_children(supervised):
    with running_server() as server:
        workers = supervised(
            "stall", "--processes", "2", "--concurrency", "2", "--lease", "30",
            "--heartbeat-interval", "0.5", "--sweep-interval", "1", "-v", "0",
            env={**LIMITED, "DATABASE_URL": server.url},
        )  # fmt: skip
        workers.wait_children(2)
        wait_for(
            "both children listening",
            lambda: (
                sum(name.startswith("pgqueue listener") for _, name, _, _ in server.backends()) == 2
            ),
        )
        job = int(server.manage("shell", "-c", ENQUEUE).split()[-1])

        def attempts() -> list[tuple[str, str | None]]:
            return server.sql(
                "SELECT status, error_class FROM queue_attempts WHERE job_id = %s ORDER BY id",
                [job],
            )

        wait_for("the limited job started", lambda: server.sql(
            "SELECT count(*) FROM qa_ledger WHERE job_id = %s", [job]) == [(1,)])  # fmt: skip
        [(runner,)] = server.sql("SELECT pid FROM qa_ledger WHERE job_id = %s", [job])
        # Its hard limit of 10 s leaves the time to pause the database before it fires.
        # The children now (one may have been restarted since the first look).
        children = workers.wait_children(2)
        assert runner in {child.pid for child in children.values()}, "the limit fired already"
        [other] = [child for child in children.values() if child.pid != runner]
        postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGSTOP)  # new connections wait; open ones still work
        try:
            wait_for("the limited child gone", lambda: process_gone(runner))
            # The supervisor is writing its jobs: its connection waits for the server.
            wait_for("the supervisor's write", lambda: connecting_to(workers.pid, server.port))
            os.kill(other.pid, signal.SIGKILL)
            wait_for(
                "the killed child restarted",
                lambda: (child := workers.children().get(other.index)) and child.pid != other.pid,
            )
        finally:
            os.kill(postmaster, signal.SIGCONT)
        # The write was still waiting (a supervisor that waited for it restarts the
        # child only once its connection timed out, the jobs then left to the sweep):
        # it landed once the database answered, the job failed for its limit (not
        # taken back by the sweep, whose lease of 30 s has not ended).
        limited = ("failed", "django_pgqueue.TimeLimitExceeded")
        wait_for("the limited job's first attempt failed", lambda: attempts()[:1] == [limited])
        # Its retry ends a process too; then the supervisor stops in order.
        wait_for("the limited job's retry failed", lambda: attempts() == [limited] * 2)
        stop(workers)
