"""Recycling in real worker processes: a child that ran --max-jobs-per-process jobs, or
whose memory passed --max-memory-per-process, lets its handlers end, exits, and is
replaced; no job is lost or run twice."""

from __future__ import annotations

import pytest

from django_pgqueue import enqueue, enqueue_many
from tests.acceptance.test_time_limits import LIMITED, stop
from tests.conftest import sql
from tests.reliability.conftest import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FAST = ("--lease", "30", "--heartbeat-interval", "0.5", "--sweep-interval", "1", "-v", "1")
INFO = {"PGQUEUE_TEST_LOG_LEVEL": "INFO"}


def test_a_child_that_ran_its_share_of_jobs_is_replaced_and_no_job_runs_twice(supervised):
    workers = supervised(
        "rj", "--concurrency", "4", "--max-jobs-per-process", "50", "--worker-id", "rj",
        *FAST, env=INFO,
    )  # fmt: skip
    first = workers.wait_children(1)[0]  # recycling: a supervisor with one child
    jobs = [job.id for job in enqueue_many([("qa.ledger", {})] * 160, queue="rj")]
    wait_until(
        "SELECT count(*) FROM queue_job_state WHERE job_id = ANY(%s) AND status = 'completed'",
        lambda n: n == len(jobs),
        timeout=180,
        params=[jobs],
    )
    # Each job ran once, its one attempt its only one.
    assert sql(
        "SELECT count(*), count(DISTINCT job_id) FROM qa_ledger WHERE job_id = ANY(%s)", [jobs]
    ) == [(len(jobs), len(jobs))]
    assert sql("SELECT count(*) FROM queue_attempts WHERE job_id = ANY(%s)", [jobs]) == [
        (len(jobs),)
    ]
    # Four processes in turn, the first three 50 jobs each.
    per_process = sorted(n for (n,) in sql("SELECT count(*) FROM qa_ledger GROUP BY pid"))
    assert per_process == [10, 50, 50, 50]
    assert first.pid in {pid for (pid,) in sql("SELECT DISTINCT pid FROM qa_ledger")}
    output = stop(workers)
    assert output.count("recycled; starting a fresh one") == 3


def test_a_child_past_its_memory_limit_finishes_its_job_and_is_replaced(supervised):
    workers = supervised(
        "rm", "--concurrency", "1", "--max-memory-per-process", "200", "--worker-id", "rm",
        *FAST, env={**LIMITED, **INFO},
    )  # fmt: skip
    workers.wait_children(1)
    leak = enqueue("qa.leak", {"mib": 300}, queue="rm", priority=10).id
    after = [job.id for job in enqueue_many([("qa.ledger", {})] * 3, queue="rm")]
    everything = [leak, *after]
    wait_until(
        "SELECT count(*) FROM queue_job_state WHERE job_id = ANY(%s) AND status = 'completed'",
        lambda n: n == len(everything),
        timeout=120,
        params=[everything],
    )
    # The leaking job finished in its process; the jobs after it ran in a fresh one.
    ran = dict(sql("SELECT job_id, pid FROM qa_ledger WHERE job_id = ANY(%s)", [everything]))
    assert len(ran) == len(everything)
    assert ran[leak] not in {ran[job] for job in after}
    assert sql("SELECT count(*) FROM queue_attempts WHERE job_id = ANY(%s)", [everything]) == [
        (len(everything),)
    ]
    output = stop(workers)
    assert "--max-memory-per-process 200" in output
