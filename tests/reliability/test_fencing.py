"""Scenario 3, the stale writer: a worker frozen past its lease changes nothing when it
comes back, whichever of its writes (heartbeat, complete, fail) it tries."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from typing import Any

import pytest

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.outcomes import Retry
from django_pgqueue.store.operator import retry_jobs
from django_pgqueue.store.worker import Store
from tests.conftest import sql
from tests.reliability.conftest import ledger_counts, outcome, size, wait_until
from tests.reliability.test_limits_stale import _quiesced

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 2.0
WORKER_ARGS = ("--lease", "2", "--heartbeat-interval", "0.5", "--sweep-interval", "1")
# Pause of the frozen worker, in seconds past the moment its leases run out (negative:
# it comes back just before). Its first-attempt handlers have ~0.9 s of work left when
# it resumes, so around the boundary either it renews first (and keeps its jobs), or its
# own sweep or B's takes them first (and every write it then tries must be refused).
OFFSETS_FULL = (-0.5, -0.25, -0.1, 0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
OFFSETS_CI = (-0.2, 2.0)

STALE_RE = re.compile(r"stale write rejected: (\w+) of job (\d+) with lease_version (\d+)")
LOST_RE = re.compile(r"lease lost: job (\d+) \(lease_version (\d+)\)")


def state(job_id: int) -> tuple[Any, ...]:
    return sql(
        "SELECT status, lease_version, attempts, locked_by FROM queue_job_state WHERE job_id = %s",
        [job_id],
    )[0]


def test_stale_writes_change_nothing_at_the_store_level(report):
    """3. Stale writer: each fenced write with a stale lease_version changes 0 rows"""
    job = enqueue("qa.noop", queue="fence", max_attempts=2)
    a, b, c = (Store("default", f"fencing {name}") for name in "abc")
    versions = [state(job.id)[1]]
    rejected = {"renew": 0, "complete": 0, "fail": 0}
    failure = Retry("RuntimeError", "stale", "", delay=0.0)

    def stale_writes(store: Store, version: int, attempt_id: int) -> None:
        """Try all three writes with a token that is no longer the job's; each must miss."""
        before = state(job.id)
        attempts_before = sql(
            "SELECT id, status, finished_at FROM queue_attempts WHERE job_id = %s ORDER BY id",
            [job.id],
        )
        assert store.renew([(job.id, version)], LEASE) == set()
        rejected["renew"] += 1
        assert store.complete([(job.id, version, attempt_id, '"stale"')]) == set()
        rejected["complete"] += 1
        assert store.fail(job.id, version, attempt_id, failure) is None
        rejected["fail"] += 1
        assert state(job.id) == before
        assert (
            sql(
                "SELECT id, status, finished_at FROM queue_attempts WHERE job_id = %s ORDER BY id",
                [job.id],
            )
            == attempts_before
        )

    try:
        # A claims with a lease that runs out at once; the sweep takes the job back.
        [row_a] = a.claim("fence", 1, "A", 0.05)
        versions.append(state(job.id)[1])
        time.sleep(0.1)
        assert [swept[0] for swept in b.sweep()] == [job.id]
        versions.append(state(job.id)[1])
        stale_writes(a, row_a.lease_version, row_a.attempt_id)  # stale: swept, nobody owns it
        [row_b] = b.claim("fence", 1, "B", LEASE)
        versions.append(state(job.id)[1])
        stale_writes(a, row_a.lease_version, row_a.attempt_id)  # stale: B owns it
        # B's own token still works: the fence is a version check, not a lockout.
        assert b.renew([(job.id, row_b.lease_version)], LEASE) == {job.id}
        assert b.fail(job.id, row_b.lease_version, row_b.attempt_id, failure)[0] == "dead"
        versions.append(state(job.id)[1])
        # An operator retries the dead job: the version grows again, and neither A's
        # nor B's old token counts any more.
        assert retry_jobs("default", [job.id]) == {job.id}
        versions.append(state(job.id)[1])
        stale_writes(a, row_a.lease_version, row_a.attempt_id)
        stale_writes(b, row_b.lease_version, row_b.attempt_id)
        [row_c] = c.claim("fence", 1, "C", LEASE)
        versions.append(state(job.id)[1])
        stale_writes(a, row_a.lease_version, row_a.attempt_id)
        stale_writes(b, row_b.lease_version, row_b.attempt_id)
        assert c.complete([(job.id, row_c.lease_version, row_c.attempt_id, '"c"')]) == {job.id}
        versions.append(state(job.id)[1])
        stale_writes(a, row_a.lease_version, row_a.attempt_id)
        stale_writes(b, row_b.lease_version, row_b.attempt_id)
    finally:
        for store in (a, b, c):
            store.close()

    assert state(job.id)[:2] == ("completed", row_c.lease_version)
    assert versions == sorted(versions), versions  # never decreases
    assert row_a.lease_version < row_b.lease_version < row_c.lease_version
    attempts = sql(
        "SELECT worker_id, status, lease_version, result::text FROM queue_attempts "
        "WHERE job_id = %s ORDER BY id",
        [job.id],
    )
    assert attempts == [
        ("A", "lost", row_a.lease_version, None),
        ("B", "failed", row_b.lease_version, None),
        ("C", "succeeded", row_c.lease_version, '"c"'),
    ]
    report(
        size=sum(rejected.values()),
        stale_writes_rejected=rejected,
        overwritten=0,
        lease_versions=versions,
        notes="Store.renew/complete/fail with a swept, a superseded and a pre-retry token: "
        "each changed 0 rows; lease_version only grew, across an operator retry too.",
    )


def test_frozen_worker_resumed_past_its_lease_is_fenced(worker_process, run_worker, report):
    """3. Stale writer: SIGSTOP past the lease, SIGCONT"""
    offsets = OFFSETS_FULL if size(0, 1) else OFFSETS_CI
    per_round = size(10, 20)
    queues = [f"stale{n}" for n in range(len(offsets))]
    a = worker_process(
        *queues, *WORKER_ARGS, "--concurrency", str(per_round), "--batch-size",
        str(per_round),
        # INFO for the final stats line; faulthandler dumps the threads on SIGABRT.
        env={"PGQUEUE_TEST_LOG_LEVEL": "INFO", "PYTHONFAULTHANDLER": "1"},
    )  # fmt: skip
    job_ids: list[int] = []
    taken_over = 0
    for queue, offset in zip(queues, offsets, strict=True):
        jobs = enqueue_many(
            [("qa.stale", {"seconds": 1.0, "fail": n % 2 == 1}) for n in range(per_round)],
            queue=queue,
        )
        ids = [job.id for job in jobs]
        job_ids += ids
        # Every job of the round is running in A's handlers (A may still be booting).
        wait_until(
            "SELECT count(*) FROM qa_ledger WHERE job_id = ANY(%s) AND pid = %s",
            lambda n, want=per_round: n == want,
            params=[ids, a.pid],
        )
        [(a_id,)] = sql("SELECT DISTINCT worker_id FROM qa_ledger WHERE pid = %s", [a.pid])
        a.signal(signal.SIGSTOP)
        # A renewal already on the wire lands before the lease's end is read: it reaches
        # the server, then runs to its end (A's sessions are autocommit: each goes idle).
        time.sleep(0.05)
        assert _quiesced(a_id), "a statement of the frozen worker did not end"
        [(remaining,)] = sql(
            "SELECT extract(epoch FROM max(locked_until) - clock_timestamp())::float8 "
            "FROM queue_job_state WHERE job_id = ANY(%s)",
            [ids],
        )
        b = run_worker(
            [queue], lease=LEASE, heartbeat_interval=0.5, sweep_interval=1.0,
            concurrency=per_round, batch_size=per_round,
        )  # fmt: skip
        time.sleep(max(0.0, remaining + offset))
        a.signal(signal.SIGCONT)
        wait_until(
            "SELECT count(*) FROM queue_job_state WHERE job_id = ANY(%s) AND status = 'completed'",
            lambda n, want=per_round: n == want,
            params=[ids],
        )
        b.stop()
        taken_over += sql(
            "SELECT count(*) FROM queue_attempts WHERE job_id = ANY(%s) AND worker_id = %s "
            "AND status = 'succeeded'",
            [ids, b.worker.worker_id],
        )[0][0]
        if offset >= 1.5:
            # Well past the boundary: every job was swept from A before it came back.
            assert (
                sql(
                    "SELECT count(*) FROM queue_attempts WHERE job_id = ANY(%s) "
                    "AND attempt_index = 1 AND status = 'lost'",
                    [ids],
                )[0][0]
                == per_round
            )

    a.signal(signal.SIGTERM)
    try:
        code, output = a.wait(60)
    except subprocess.TimeoutExpired:
        a.signal(signal.SIGABRT)  # show where it is stuck
        raise AssertionError(a.proc.communicate(timeout=10)[0][-6000:]) from None
    assert code == 0, output

    # What A says it tried and was refused: per write kind, with the token it used.
    refused = {(kind, int(job), int(version)) for kind, job, version in STALE_RE.findall(output)}
    renew_refused = {(int(job), int(version)) for job, version in LOST_RE.findall(output)}
    stats = re.search(r"'stale_writes': (\d+)", output)
    assert stats is not None, output[-2000:]
    assert int(stats.group(1)) == len(refused), output[-2000:]
    # A's attempts that were taken from it (swept while it was frozen).
    lost = {
        (job, version, fail)
        for job, version, fail in sql(
            "SELECT at.job_id, at.lease_version, (j.payload->>'fail')::boolean "
            "FROM queue_attempts at JOIN queue_jobs j ON j.id = at.job_id "
            "WHERE at.job_id = ANY(%s) AND at.worker_id LIKE %s AND at.status = 'lost'",
            [job_ids, f"%:{a.pid}:%"],
        )
    }
    # A finished every handler it had, so it tried exactly one write per lost attempt,
    # complete or fail as the handler returned; every one of them was refused.
    assert refused == {
        ("fail" if fail else "complete", job, version) for job, version, fail in lost
    }, output[-3000:]
    # A renewal refused is always a lease that really was lost.
    assert renew_refused <= {(job, version) for job, version, _ in lost}

    # Every job: the attempts form one chain of growing lease versions, each superseded
    # attempt closed before the next one started, the last one succeeded and it is the
    # job's state; nothing a stale writer did landed after a newer owner took over.
    overwritten = sql(
        """
        WITH at AS (
            SELECT job_id, id, lease_version, status, started_at, finished_at,
                   lead(started_at) OVER w AS next_started,
                   lead(lease_version) OVER w AS next_version,
                   row_number() OVER (PARTITION BY job_id ORDER BY id DESC) AS from_last
            FROM queue_attempts WHERE job_id = ANY(%s)
            WINDOW w AS (PARTITION BY job_id ORDER BY id)
        )
        SELECT count(DISTINCT at.job_id) FROM at JOIN queue_job_state st USING (job_id)
        WHERE (at.from_last = 1 AND (at.status <> 'succeeded'
                                     OR st.lease_version <> at.lease_version))
           OR (at.from_last > 1 AND (at.status NOT IN ('lost', 'failed')
                                     OR at.finished_at > at.next_started
                                     OR at.next_version <= at.lease_version))
        """,
        [job_ids],
    )[0][0]
    counts = ledger_counts(f"SELECT unnest(ARRAY{job_ids}::bigint[]) AS id")
    assert overwritten == 0
    assert counts["lost"] == 0
    assert counts["completed_twice"] == 0
    assert counts["completed_without_success"] == 0
    by_kind = {
        "renew": len(renew_refused),
        "complete": sum(1 for kind, _, _ in refused if kind == "complete"),
        "fail": sum(1 for kind, _, _ in refused if kind == "fail"),
    }
    assert by_kind["complete"] > 0
    assert by_kind["fail"] > 0
    report(
        size=len(job_ids),
        rounds=len(offsets),
        pause_offsets_s=list(offsets),
        **outcome(counts),
        attempts_taken_from_frozen_worker=len(lost),
        completed_by_b=taken_over,
        stale_writes_rejected=by_kind,
        overwritten=overwritten,
        notes="A run_queue_worker frozen with SIGSTOP around its lease's end, then resumed: "
        "every complete/fail it tried on a swept attempt was refused, and logged.",
    )
