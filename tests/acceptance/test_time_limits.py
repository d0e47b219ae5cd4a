"""Hard and soft time limits in real worker processes: a handler past its hard limit
ends the process running it, the supervisor fails its job and gives the others back,
and starts a fresh process; the soft limit raises in the handler."""

from __future__ import annotations

import signal
import threading
import time
from io import StringIO
from typing import Any

import psutil
import pytest
from django.core.management import call_command
from django.db import connections

from django_pgqueue import enqueue, set_queue_limit
from tests.conftest import sql
from tests.reliability.conftest import wait_until
from tests.supervised import process_gone

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FAST = ("--lease", "30", "--heartbeat-interval", "0.5", "--sweep-interval", "1", "-v", "1")
QUICK_BEATS = ("--lease", "2", "--heartbeat-interval", "0.5", "--sweep-interval", "1", "-v", "1")
LIMITED = {"PGQUEUE_TEST_TIME_LIMITS": "1"}


class RunningSampler(threading.Thread):
    """Reads how many jobs of `queue` run, every 20 ms, until stopped; the most seen.

    Two readings: the queue's (its rows in 'running'), and the handlers still executing
    by the ledger (a run not finished whose process is still alive: a handler of a
    process ended for its time limit, or SIGKILLed, stopped with the process)."""

    def __init__(self, queue: str) -> None:
        super().__init__(daemon=True)
        self.queue = queue
        self.most = 0
        self.most_executing = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            running = sql(
                "SELECT count(*) FROM queue_job_state WHERE queue = %s AND status = 'running'",
                [self.queue],
            )[0][0]
            self.most = max(self.most, running)
            unfinished = sql(
                "SELECT l.pid, extract(epoch FROM l.started_at)::float8 FROM qa_ledger l "
                "JOIN queue_jobs j ON j.id = l.job_id "
                "WHERE j.queue = %s AND l.finished_at IS NULL",
                [self.queue],
            )
            executing = sum(1 for pid, started in unfinished if runs_since(pid, started))
            self.most_executing = max(self.most_executing, executing)
            time.sleep(0.02)
        connections.close_all()  # this thread's own connection

    def stop(self) -> int:
        """Stop sampling; the most jobs seen running (`most_executing`: the most
        handlers seen executing)."""
        self.done.set()
        self.join(10)
        return self.most


def runs_since(pid: int, started: float) -> bool:
    """The process `pid` that started a handler at `started` (epoch seconds) still runs:
    alive, and not a later process given the same pid (pids wrap at 32,768 here)."""
    try:
        created = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return False
    return created <= started and not process_gone(pid)


def stop(workers: Any) -> str:
    """SIGTERM the supervisor; its output, once it exited 0."""
    workers.signal(signal.SIGTERM)
    code, output = workers.wait(60)
    assert code == 0, output
    return output


def attempts_of(job_id: int) -> list[tuple[str, str | None]]:
    return [
        (status, error_class)
        for status, error_class in sql(
            "SELECT status, error_class FROM queue_attempts WHERE job_id = %s ORDER BY id",
            [job_id],
        )
    ]


@pytest.mark.parametrize("type_", ["qa.limit_sleep", "qa.limit_spin", "qa.limit_asleep"])
def test_a_handler_past_its_hard_limit_ends_its_process_and_its_job_is_retried(supervised, type_):
    queue = "tl"
    set_queue_limit(queue, 3)
    workers = supervised(queue, "--concurrency", "4", "--worker-id", "tl", *FAST, env=LIMITED)
    first = workers.wait_children(1)[0]  # a hard limit: a supervisor with one child
    # max_attempts given here: the test's process does not register the qa.limit_* handlers.
    limited = enqueue(type_, {}, queue=queue, max_attempts=2).id
    # Others of the same process, running when the limit fires; and one that waits for
    # a place in the queue's limit of 3.
    others = [enqueue("qa.sleep", {"seconds": 4}, queue=queue).id for _ in range(3)]
    sampler = RunningSampler(queue)
    sampler.start()
    try:
        # The limited job's two attempts each end their process (hang guard, not a bound).
        wait_until(
            "SELECT status FROM queue_job_state WHERE job_id = %s",
            lambda status: status == "dead",
            timeout=120,
            params=[limited],
        )
        wait_until(
            "SELECT count(*) FROM queue_job_state WHERE job_id = ANY(%s) AND status = 'completed'",
            lambda n: n == len(others),
            timeout=120,
            params=[others],
        )
    finally:
        most = sampler.stop()
    assert most <= 3, f"{most} jobs of a queue limited to 3 ran at once"
    assert sampler.most_executing <= 3, f"{sampler.most_executing} handlers executed at once"
    assert attempts_of(limited) == [("failed", "django_pgqueue.TimeLimitExceeded")] * 2
    (error,) = sql("SELECT last_error FROM queue_job_state WHERE job_id = %s", [limited])[0]
    assert "hard time limit of 2s" in error
    for job in others:
        # Given back by the ended processes without spending an attempt: one attempt
        # spent, the one that completed.
        history = attempts_of(job)
        assert history[-1] == ("succeeded", None), history
        assert all(
            entry == ("interrupted", "django_pgqueue.TimeLimitExceeded") for entry in history[:-1]
        ), history
        assert sql("SELECT attempts FROM queue_job_state WHERE job_id = %s", [job]) == [(1,)]
    # The code really stopped: each attempt of the limited job ran in a process of its
    # own, and none of those processes is left.
    pids = [pid for (pid,) in sql("SELECT pid FROM qa_ledger WHERE job_id = %s", [limited])]
    assert len(set(pids)) == 2
    assert first.pid in pids
    assert all(pid not in {c.pid for c in workers.children().values()} for pid in pids)
    stop(workers)


@pytest.mark.parametrize(
    ("type_", "raised"),
    [("qa.soft_limit", "SoftTimeLimitExceeded"), ("qa.soft_limit_async", "CancelledError")],
)
def test_a_soft_limit_raises_in_the_handler_and_its_except_runs(supervised, type_, raised):
    workers = supervised("ts", "--worker-id", "ts", *FAST, env=LIMITED)
    workers.wait_children(1)
    job = enqueue(type_, {}, queue="ts").id
    wait_until(
        "SELECT status FROM queue_job_state WHERE job_id = %s",
        lambda status: status == "completed",
        timeout=60,
        params=[job],
    )
    assert sql("SELECT result->>'cleaned_up' FROM queue_attempts WHERE job_id = %s", [job]) == [
        (raised,)
    ]
    # Its finally block ran too.
    assert sql("SELECT finished_at IS NOT NULL FROM qa_ledger WHERE job_id = %s", [job]) == [
        (True,)
    ]
    stop(workers)


def test_a_child_an_operator_stopped_is_not_restarted_when_a_handler_passes_its_limit(
    supervised,
):
    # A shutdown grace longer than the handler's hard limit of 10 s: the limit ends the
    # child during its stop. A lease of 2 s: the child takes requests every second.
    workers = supervised(
        "tls", "--worker-id", "tls", "--shutdown-grace", "60", *QUICK_BEATS, env=LIMITED
    )
    [child] = workers.wait_children(1).values()
    job = enqueue("qa.limit_sleep_long", {}, queue="tls", max_attempts=2).id
    wait_until(
        "SELECT count(*) FROM qa_ledger WHERE job_id = %s",
        lambda n: n == 1,
        timeout=60,
        params=[job],
    )
    out = StringIO()
    call_command("control_queue_workers", "stop", "--queue", "tls", "--wait", "60", stdout=out)
    assert "stopping: no more claims" in out.getvalue()

    # The child ends (its limit); then the supervisor exits, or starts another one.
    def settled() -> bool:
        if not process_gone(child.pid):
            return False
        return workers.proc.poll() is not None or bool(workers.children())

    deadline = time.monotonic() + 120  # a hang guard, not a bound
    while not settled():
        assert time.monotonic() < deadline, "the stopped child neither ended nor was replaced"
        time.sleep(0.1)
    assert not workers.children(), "the child an operator stopped was restarted"
    code, output = workers.wait(60)
    assert code == 0, output
    # Its supervisor wrote its last words: the job failed its first attempt for the limit.
    assert attempts_of(job) == [("failed", "django_pgqueue.TimeLimitExceeded")]
