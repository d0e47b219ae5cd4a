"""Property: the hold and the capacity count hold whatever happens to the handlers.

A Hypothesis state machine drives two real workers (threads of this process, each with
its own connections to the test database) over one queue with a queue limit and a key
limit, while it enqueues sync and async jobs that return in time, outlive their timeout
in a call the timeout cannot reach (a C call, a sync call holding the event loop), or
ignore their cancellation; cancels running jobs; cuts the workers' heartbeat and
dispatcher connections; and stops a worker (a short grace, handlers still running) to
start another. Every execution is recorded by the handler itself (`qa.jobs.EXECUTIONS`:
worker, kind, queue, key, start and end in this process's monotonic clock).

After each step, and once everything drained, these must hold:

- never more sync handlers executing in a worker than its `concurrency`, nor more async
  ones than its `async_concurrency`;
- never two executions of one job overlapping;
- never more executions of the queue at once than its limit, nor of one key than the
  key limit: a handler past its timeout, cancelled, or held by a stopping worker counts
  until its code really returned.

The leases are long enough that a cut connection never loses one (the heartbeat
reconnects at once): a lease really lost lets another worker run the job while the old
handler runs (fencing then refuses the old one's writes, tested elsewhere).
`make test` runs a few short examples; `make reliability` many more, longer.
"""

from __future__ import annotations

import itertools
import re
import time
from typing import Any

import pytest

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from qa.jobs import EXECUTIONS, RELEASE

from django_pgqueue import actions, enqueue
from django_pgqueue.control.api import set_key_limit, set_queue_limit
from tests.conftest import WorkerThread, sql
from tests.reliability.conftest import FULL

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "hold-props"
QUEUE_LIMIT = 3
KEY_LIMIT = 1
KEYS = ("a", "b")
THREADS = 2
TASKS = 1
TIMEOUT = 0.3  # seconds: the job timeout of both workers
GRACE = 0.2  # seconds: a stopping worker's grace
HANG_GUARD = 120.0  # seconds: a bound on a hang, never a bound the test measures

# How each job ends: (handler, payload). Every handler returns within a few seconds. A
# sync one past its timeout returns before twice it: past that it counts as stuck, and a
# worker whose threads are all stuck exits for a supervisor this test does not run.
BEHAVIOURS = {
    "sync": ("qa.span", {"seconds": 0.05}),
    "sync-past-timeout": ("qa.span", {"seconds": TIMEOUT * 1.5, "c": True, "later": 0.02}),
    "async": ("qa.aspan", {"seconds": 0.05}),
    "async-past-timeout": ("qa.aspan", {"seconds": TIMEOUT * 2, "later": 0.02}),
    "async-blocking-loop": ("qa.aspan", {"seconds": TIMEOUT * 3, "block": True, "later": 0.02}),
    "async-ignoring-cancel": ("qa.aspan", {"seconds": TIMEOUT * 3, "swallow": True, "later": 0.02}),
}


def most_at_once(spans: list[tuple[float, float]]) -> tuple[int, list[int]]:
    """The most of `spans` (start, end) that overlapped at one instant, and the places
    in `spans` of those that did (the first such instant)."""
    # An end and a start at the same instant: the end first (they did not overlap).
    events = sorted(
        [(start, 1, n) for n, (start, _) in enumerate(spans)]
        + [(end, -1, n) for n, (_, end) in enumerate(spans)]
    )
    running: set[int] = set()
    most: list[int] = []
    for _, step, n in events:
        if step == 1:
            running.add(n)
        else:
            running.discard(n)
        if len(running) > len(most):
            most = sorted(running)
    return len(most), most


def violations() -> list[str]:
    """What the recorded executions break of the rules above (open ones end now), each
    with the executions that overlapped: job, worker, kind, its nth execution, start and end in
    seconds from the first execution's start."""
    now = time.monotonic()
    runs = [
        (job, worker, kind, queue, key, start, now if end is None else end)
        for job, worker, kind, queue, key, start, end in EXECUTIONS.snapshot()
    ]
    origin = min((run[5] for run in runs), default=now)
    found = []
    groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for run in runs:
        job, worker, kind, queue, key = run[:5]
        groups.setdefault(("worker", worker, kind), []).append(run)
        groups.setdefault(("job", job), []).append(run)
        groups.setdefault(("queue", queue), []).append(run)
        if key is not None:
            groups.setdefault(("key", key), []).append(run)
    limits = {"sync": THREADS, "async": TASKS}
    for group, members in groups.items():
        if group[0] == "worker":
            limit = limits[group[2]]
        else:
            limit = {"job": 1, "queue": QUEUE_LIMIT, "key": KEY_LIMIT}[group[0]]
        most, which = most_at_once([(run[5], run[6]) for run in members])
        if most > limit:
            overlapping = [
                f"job {run[0]} ({run[1]}, {run[2]}, execution {run[7]}) "
                f"{run[5] - origin:.3f}-{run[6] - origin:.3f}"
                for run in (members[n] + (execution_of(members[n]),) for n in which)
            ]
            found.append(f"{group}: {most} at once, limit {limit}: {'; '.join(overlapping)}")
    return found


def execution_of(run: tuple[Any, ...]) -> int:
    """The place of `run` among its job's executions, from 1."""
    job, start = run[0], run[5]
    return 1 + sum(1 for other in EXECUTIONS.snapshot() if other[0] == job and other[5] < start)


def attempts_written(found: list[str]) -> str:
    """The attempts the database recorded for the jobs named in `found`."""
    jobs = sorted({int(job) for line in found for job in re.findall(r"job (\d+) \(", line)})
    rows = sql(
        "SELECT job_id, attempt_index, lease_version, worker_id, status, error_class, "
        "started_at, finished_at FROM queue_attempts WHERE job_id = ANY(%s) "
        "ORDER BY job_id, id",
        [jobs],
    )
    return "attempts written:\n" + "\n".join(map(str, rows))


def drained() -> bool:
    [(left,)] = sql(
        "SELECT count(*) FROM queue_job_state WHERE queue = %s "
        "AND status NOT IN ('completed', 'dead', 'cancelled')",
        [QUEUE],
    )
    return left == 0 and not any(end is None for *_, end in EXECUTIONS.snapshot())


class HoldAndCapacity(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        EXECUTIONS.reset()
        sql("TRUNCATE queue_jobs, queue_job_state, queue_attempts, queue_controls CASCADE")
        set_queue_limit(QUEUE, QUEUE_LIMIT)
        set_key_limit(QUEUE, KEY_LIMIT)
        self.names = itertools.count()
        self.workers = [self._start(), self._start()]
        self.stopped: list[WorkerThread] = []

    def _start(self) -> WorkerThread:
        return WorkerThread(
            [QUEUE],
            worker_id=f"props-{next(self.names)}",
            concurrency=THREADS,
            async_concurrency=TASKS,
            job_timeout=TIMEOUT,
            lease=4.0,
            heartbeat_interval=0.5,
            sweep_interval=0.5,
            shutdown_grace=GRACE,
            poll_interval=0.05,
        ).start()

    @rule(
        behaviour=st.sampled_from(sorted(BEHAVIOURS)),
        key=st.sampled_from((None, *KEYS)),
        count=st.integers(1, 3),
    )
    def enqueue_jobs(self, behaviour: str, key: str | None, count: int) -> None:
        handler, payload = BEHAVIOURS[behaviour]
        for _ in range(count):
            enqueue(handler, {**payload, "key": key}, queue=QUEUE, concurrency_key=key)

    @rule(pause=st.sampled_from((0.05, 0.2, 0.6)))
    def let_them_run(self, pause: float) -> None:
        time.sleep(pause)

    @rule()
    def cancel_a_running_job(self) -> None:
        running = sql(
            "SELECT job_id FROM queue_job_state WHERE queue = %s AND status = 'running' "
            "ORDER BY job_id LIMIT 1",
            [QUEUE],
        )
        if running:
            actions.cancel([running[0][0]])

    @rule(which=st.sampled_from(("heartbeat", "worker")))
    def cut_a_connection(self, which: str) -> None:
        # The heartbeat's or the dispatcher's session ends; each reconnects.
        names = [f"pgqueue {which} {w.worker.worker_id}" for w in self.workers]
        sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = ANY(%s)",
            [names[:1]],
        )

    @precondition(lambda self: len(self.stopped) < 3)
    @rule()
    def stop_a_worker_and_start_another(self) -> None:
        stopping = self.workers.pop(0)
        stopping.worker.stop_gracefully()
        stopping.join(HANG_GUARD)
        self.stopped.append(stopping)
        self.workers.append(self._start())

    @invariant()
    def the_rules_hold(self) -> None:
        found = violations()
        assert found == [], attempts_written(found)

    def teardown(self) -> None:
        try:
            deadline = time.monotonic() + HANG_GUARD
            while not drained():
                assert time.monotonic() < deadline, "the queue did not drain"
                time.sleep(0.05)
            found = violations()
            assert found == [], attempts_written(found)
        finally:
            for worker in self.workers:
                worker.stop(HANG_GUARD, force=True)
            RELEASE.set()
            try:
                for worker in [*self.workers, *self.stopped]:
                    assert worker.worker.wait_for_held(HANG_GUARD)
            finally:
                RELEASE.clear()


HoldAndCapacity.TestCase.settings = settings(
    max_examples=40 if FULL else 4,
    stateful_step_count=30 if FULL else 12,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def test_the_hold_and_the_capacity_count(transactional_db: Any, report: Any) -> None:
    """20. Hold and capacity: no limit passed, no job run twice at once, whatever the handlers do"""
    examples = HoldAndCapacity.TestCase.settings.max_examples
    steps = HoldAndCapacity.TestCase.settings.stateful_step_count
    report(
        size=f"{examples} runs of up to {steps} steps, 2 workers x {THREADS} threads + "
        f"{TASKS} task",
        notes="a Hypothesis state machine: sync and async jobs in time, past their timeout "
        "in a C call or a blocked event loop, ignoring cancellation; cancels, cut "
        "connections, workers stopped mid-job",
    )
    HoldAndCapacity.TestCase("runTest").runTest()
