"""The worker in real threads of this process, against the real database."""

from __future__ import annotations

import itertools
import time

import pytest
from django.db import connection

import django_pgqueue
from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.models import Attempt, JobState
from django_pgqueue.retry import ExponentialBackoff, FixedDelay
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)


def wait_until(predicate, timeout: float = 120.0, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError("condition not reached in time")


def statuses(queue: str | None = None) -> dict[str, int]:
    rows = sql(
        "SELECT status, count(*) FROM queue_job_state WHERE %s::text IS NULL OR queue = %s "
        "GROUP BY status",
        [queue, queue],
    )
    return dict(rows)


def test_burst_worker_completes_everything_and_stores_results(run_worker):
    jobs = enqueue_many([("qa.echo", {"n": i}) for i in range(200)], queue="a")
    enqueue_many([("qa.noop", i) for i in range(100)], queue="b")
    worker = run_worker(["a", "b"], concurrency=4, batch_size=8, burst=True)
    worker.join()
    assert statuses() == {"completed": 300}
    assert worker.worker.stats["completed"] == 300
    assert Attempt.objects.filter(status="succeeded").count() == 300
    assert Attempt.objects.get(job_id=jobs[7].id).result == {"n": 7}
    assert sql("SELECT count(*) FROM queue_job_state WHERE locked_by IS NOT NULL")[0][0] == 0


def test_failing_job_retries_within_the_policy_bounds_then_dies(run_worker, settings):
    settings.PGQUEUE = {"RETRY_BACKOFF_BASE": 0.2, "RETRY_BACKOFF_CAP": 0.6}
    job = enqueue("qa.fail", queue="f")  # max_attempts=3 from its @handler
    run_worker(["f"], burst=False, poll_interval=0.05)
    wait_until(lambda: JobState.objects.get(pk=job.id).status == "dead")
    attempts = list(Attempt.objects.filter(job_id=job.id).order_by("lease_version"))
    assert [a.attempt_index for a in attempts] == [1, 2, 3]
    assert all(a.status == "failed" and a.error_class == "ValueError" for a in attempts)
    assert [a.error_message for a in attempts] == [
        f"qa.fail always fails (attempt {n})" for n in (1, 2, 3)
    ]
    assert all("Traceback" in a.traceback for a in attempts)
    policy = ExponentialBackoff(base=0.2, cap=0.6)
    # Each retry starts no earlier than its failure, and (allowing for the poll) not
    # much later than the largest delay the policy could draw.
    for earlier, later in itertools.pairwise(attempts):
        gap = (later.started_at - earlier.finished_at).total_seconds()
        assert 0 <= gap <= policy.ceiling(earlier.attempt_index) + 1.0
    state = JobState.objects.get(pk=job.id)
    assert state.attempts == 3
    assert state.last_error.startswith("ValueError")


def test_retry_delays_read_from_run_at_are_inside_the_bounds(run_worker, settings):
    """Many failing jobs; for every retry, run_at - failure time is in [0, ceiling]."""
    settings.PGQUEUE = {"RETRY_BACKOFF_BASE": 30.0, "RETRY_BACKOFF_CAP": 45.0}
    jobs = enqueue_many([("qa.flaky", {"failures": 5}) for _ in range(40)], queue="r")
    worker = run_worker(["r"], concurrency=8, batch_size=8, burst=True)
    worker.join()
    # Each job's latest attempt: a first delay drawn near 0 can come due while the burst
    # is still claiming, so a few jobs may have failed twice before the worker stops.
    rows = sql(
        "SELECT extract(epoch FROM s.run_at - a.finished_at), s.status, a.attempt_index "
        "FROM queue_job_state s JOIN queue_attempts a "
        "ON a.job_id = s.job_id AND a.lease_version = s.lease_version WHERE s.queue = 'r'"
    )
    assert len(rows) == len(jobs) == 40
    delays = [float(delay) for delay, _, _ in rows]
    assert all(status == "pending" for _, status, _ in rows)
    # attempt n: uniform(0, min(45, 30 * 2 ** (n - 1)))
    assert all(0 <= float(delay) <= min(45.0, 30.0 * 2 ** (n - 1)) + 1e-6 for delay, _, n in rows)
    assert max(delays) - min(delays) > 5  # jittered, not fixed


def test_retry_later_and_permanent_failure(run_worker):
    later = enqueue("qa.retry_later", {"delay": 120}, queue="c")
    never = enqueue("qa.permanent", queue="c")
    run_worker(["c"], burst=True).join()
    later_state = JobState.objects.get(pk=later.id)
    assert later_state.status == "pending"
    (ahead,) = sql(
        "SELECT extract(epoch FROM run_at - now()) FROM queue_job_state WHERE job_id = %s",
        [later.id],
    )[0]
    assert 100 < float(ahead) <= 120
    never_state = JobState.objects.get(pk=never.id)
    assert (never_state.status, never_state.attempts) == ("dead", 1)
    assert "this input can never succeed" in never_state.last_error


def test_unknown_type_dies_and_the_worker_goes_on(run_worker):
    unknown = enqueue("qa.does_not_exist", queue="u")
    fine = enqueue_many([("qa.noop", i) for i in range(5)], queue="u")
    run_worker(["u"], burst=True).join()
    state = JobState.objects.get(pk=unknown.id)
    assert state.status == "dead"
    assert "No handler is registered" in state.last_error
    assert JobState.objects.filter(pk__in=[j.id for j in fine], status="completed").count() == 5


def test_handlers_raising_system_exit_or_keyboard_interrupt_do_not_stop_the_worker(run_worker):
    bad = [
        enqueue("qa.exit", {"raise": "SystemExit"}, queue="x", max_attempts=1),
        enqueue("qa.exit", {"raise": "KeyboardInterrupt"}, queue="x", max_attempts=1),
    ]
    good = enqueue_many([("qa.noop", i) for i in range(5)], queue="x")
    worker = run_worker(["x"], concurrency=2, burst=True)
    worker.join()
    assert [JobState.objects.get(pk=j.id).status for j in bad] == ["dead", "dead"]
    errors = set(
        Attempt.objects.filter(job_id__in=[j.id for j in bad]).values_list("error_class", flat=True)
    )
    assert errors == {"SystemExit", "KeyboardInterrupt"}
    assert JobState.objects.filter(pk__in=[j.id for j in good], status="completed").count() == 5


@pytest.mark.parametrize("jobs", [0, 3])
def test_a_stopping_worker_does_not_wait_out_its_listeners_timeout(run_worker, monkeypatch, jobs):
    """The listener waits up to LISTEN_TIMEOUT for a NOTIFY before it looks at its stop
    flag; a stopping worker wakes it, so a burst run ends when its queue is empty, not
    a wait later (before: 1 s, which doubled an empty burst run's wall time). With a
    30 s timeout here, a missed wake-up shows as a listener still alive once the join's
    5 s are over (not timed here: a loaded machine is slow, and that proves nothing)."""
    from django_pgqueue.worker import listener

    monkeypatch.setattr(listener, "LISTEN_TIMEOUT", 30.0)
    enqueue_many([("qa.noop", None)] * jobs, queue="wake")
    for _ in range(3):  # the stop lands wherever the listener is: before, at or after its LISTEN
        worker = run_worker(["wake"], burst=True)
        worker.join()
        assert not [t for t in worker.worker._threads if t.is_alive()]
    assert JobState.objects.filter(queue="wake", status="completed").count() == jobs


def test_unstorable_error_text_and_result_are_recorded(run_worker):
    nul = enqueue("qa.nul_error", queue="n", max_attempts=1)
    bad = enqueue("qa.bad_result", queue="n")
    nul_result = enqueue("qa.nul_result", queue="n")
    fine = enqueue_many([("qa.echo", {"n": i}) for i in range(5)], queue="n")
    worker = run_worker(["n"], burst=True)
    worker.join()
    assert worker.worker.stats["completed"] == 5
    nul_result_state = JobState.objects.get(pk=nul_result.id)
    assert nul_result_state.status == "dead"
    assert "NUL" in nul_result_state.last_error
    assert JobState.objects.filter(pk__in=[j.id for j in fine], status="completed").count() == 5
    attempt = Attempt.objects.get(job_id=nul.id)
    assert attempt.status == "failed"
    assert "\\x00" in attempt.error_message
    state = JobState.objects.get(pk=bad.id)
    assert state.status == "dead"
    assert "cannot be stored as JSON" in state.last_error


def test_expired_lease_is_reclaimed_by_another_worker(run_worker):
    """A job held by a worker that vanished is swept, claimed again and completed."""
    job = enqueue("qa.ledger", queue="l")
    from django_pgqueue.store.worker import Store

    ghost = Store("default", "ghost")
    ghost.claim("l", 1, "ghost-worker", 0.5)  # claims, then never renews nor finishes
    ghost.close()
    worker = run_worker(["l"], lease=2, sweep_interval=0.2, poll_interval=0.1)
    wait_until(lambda: JobState.objects.get(pk=job.id).status == "completed", timeout=120)
    attempts = list(Attempt.objects.filter(job_id=job.id).order_by("lease_version"))
    assert [(a.worker_id, a.status) for a in attempts] == [
        ("ghost-worker", "lost"),
        (worker.worker.worker_id, "succeeded"),
    ]
    assert sql("SELECT count(*) FROM qa_ledger WHERE job_id = %s", [job.id])[0][0] == 1


def test_long_handler_keeps_its_lease_through_heartbeats(run_worker):
    # Two and a half leases long. Renewals every 0.67 s (lease / 3) leave 1.33 s for a
    # stall of the heartbeat thread before the other worker's sweep may take the job.
    job = enqueue("qa.sleep", {"seconds": 5.0}, queue="long")
    worker = run_worker(["long"], lease=2.0, sweep_interval=0.2)
    other = run_worker(["long"], lease=2.0, sweep_interval=0.2)
    wait_until(lambda: JobState.objects.get(pk=job.id).status == "completed", timeout=120)
    assert Attempt.objects.filter(job_id=job.id).count() == 1  # never swept, never re-run
    assert sql("SELECT count(*) FROM qa_ledger WHERE job_id = %s", [job.id])[0][0] == 1
    gaps = worker.worker.heartbeat_gaps + other.worker.heartbeat_gaps
    assert gaps
    assert max(gaps) < 2.0  # renewed within every lease


def test_stop_releases_unstarted_jobs_and_loses_nothing(run_worker):
    jobs = enqueue_many([("qa.sleep", {"seconds": 0.5}) for _ in range(12)], queue="s")
    worker = run_worker(["s"], concurrency=2, batch_size=2, shutdown_grace=5)
    wait_until(lambda: sql("SELECT count(*) FROM qa_ledger")[0][0] >= 2)
    worker.stop()
    counts = statuses("s")
    assert "running" not in counts
    assert counts.get("completed", 0) + counts.get("pending", 0) == len(jobs)
    assert counts.get("completed", 0) >= 2
    # Whatever ran, ran once; what never started is pending with its attempt given back.
    assert sql("SELECT count(*), count(DISTINCT job_id) FROM qa_ledger")[0] == (
        counts["completed"],
        counts["completed"],
    )
    assert (
        sql("SELECT count(*) FROM queue_job_state WHERE status = 'pending' AND attempts > 0")[0][0]
        == 0
    )


def test_weighted_worker_drains_both_queues(run_worker):
    enqueue_many([("qa.noop", i) for i in range(60)], queue="heavy")
    enqueue_many([("qa.noop", i) for i in range(20)], queue="light")
    worker = run_worker(
        ["heavy", "light"], weights={"heavy": 3}, concurrency=1, batch_size=1, burst=True
    )
    worker.join()
    assert statuses() == {"completed": 80}
    # With one slot and batch 1, claims interleave 3:1 while both queues have work.
    order = [
        queue
        for (queue,) in sql(
            "SELECT s.queue FROM queue_attempts a JOIN queue_job_state s USING (job_id) "
            "ORDER BY a.id LIMIT 40"
        )
    ]
    assert order.count("heavy") == 30
    assert order.count("light") == 10


def test_notify_wakes_an_idle_worker_quickly(run_worker):
    worker = run_worker(["wake"], poll_interval=30)
    # Idle and listening (not a guessed 0.5 s: a slow start counted in the latency).
    wait_until(lambda: worker.worker._dispatcher.claims.listening)
    job = enqueue("qa.noop", queue="wake")
    wait_until(lambda: JobState.objects.get(pk=job.id).status == "completed", timeout=120)
    (latency,) = sql(
        "SELECT extract(epoch FROM a.started_at - j.created_at) FROM queue_attempts a "
        "JOIN queue_jobs j ON j.id = a.job_id WHERE j.id = %s",
        [job.id],
    )[0]
    # Woken by the NOTIFY: well before the 30 s poll interval would have claimed it
    # (how promptly is not a bound a loaded machine keeps).
    assert float(latency) < 15.0
    assert worker.worker.stats["claimed"] == 1


def test_an_idle_worker_waits_right_after_a_claim_that_came_back_short(run_worker):
    """The job it handed over starts with no second cycle of the dispatcher's in its
    way: that cycle would find the queue just marked empty and do nothing."""
    # No sweep falls due meanwhile: a sweep also sends the dispatcher round again.
    worker = run_worker(["shortclaim"], poll_interval=30, sweep_interval=3600)
    dispatcher = worker.worker._dispatcher
    wait_until(lambda: dispatcher.claims.listening)
    events: list[str] = []
    cycle, wait = dispatcher._cycle, dispatcher._wait

    def spied_cycle(now: float) -> bool:
        running = len(dispatcher.capacity)
        more = cycle(now)
        events.append("claimed" if len(dispatcher.capacity) > running else "cycle")
        return more

    def spied_wait(next_sweep: float) -> None:
        events.append("wait")
        wait(next_sweep)

    dispatcher._cycle, dispatcher._wait = spied_cycle, spied_wait
    # Its first rounds done (the first sweep among them, which sends it round again).
    wait_until(lambda: "wait" in events)
    events.clear()
    job = enqueue("qa.noop", queue="shortclaim")
    wait_until(lambda: JobState.objects.get(pk=job.id).status == "completed")
    claimed = events.index("claimed")
    assert events[claimed + 1] == "wait", events


def test_stale_completion_is_rejected_counted_and_leaves_the_new_owners_state(run_worker):
    """A worker's lease is taken over mid-job; its completion must change nothing."""
    from django_pgqueue.store.worker import Store

    job = enqueue("qa.sleep", {"seconds": 1.5}, queue="stale")
    worker = run_worker(["stale"], lease=30, sweep_interval=3600)
    wait_until(lambda: sql("SELECT count(*) FROM qa_ledger")[0][0] == 1)
    # The lease ends (as if the worker froze), and another worker takes the job over, in
    # one transaction: neither the first worker's reclaim nor its own sweep (its first one
    # may come after the handler started) can come in between.
    other = Store("default", "other")
    try:
        other.raw.autocommit = False
        other.raw.execute(
            "UPDATE queue_job_state SET locked_until = now() - interval '1 second'"
            " WHERE job_id = %s",
            [job.id],
        )
        assert [row[0] for row in other.sweep()] == [job.id]
        takeover = other.claim("stale", 1, "worker-b", 30)[0]
        other.raw.commit()
        other.raw.autocommit = True
        wait_until(lambda: worker.worker.stats["stale_writes"] == 1, timeout=120)
        state = JobState.objects.get(pk=job.id)
        assert (state.status, state.locked_by, state.lease_version) == (
            "running",
            "worker-b",
            takeover.lease_version,
        )
        assert other.complete([(job.id, takeover.lease_version, takeover.attempt_id, None)]) == {
            job.id
        }
    finally:
        other.close()
    assert worker.worker.stats["completed"] == 0
    statuses_by_version = dict(
        sql("SELECT lease_version, status FROM queue_attempts WHERE job_id = %s", [job.id])
    )
    assert sorted(statuses_by_version.values()) == ["lost", "succeeded"]


def test_reclaiming_a_job_its_old_handler_still_runs_keeps_the_new_lease(run_worker):
    """A worker that lost a lease may claim the job again while the old handler runs.

    The old run's stale completion must drop only its own bookkeeping: dropping the new
    claim's lease stopped its renewals, the sweep took the job from the new run too,
    and so on until the attempts were spent and the job was dead.
    """
    from django_pgqueue.store.worker import Store

    job = enqueue("qa.sleep", {"seconds": 6.0}, queue="again")
    worker = run_worker(["again"], lease=1.0, sweep_interval=0.2, concurrency=2)
    wait_until(lambda: sql("SELECT count(*) FROM qa_ledger")[0][0] == 1)
    # The new run outlives the old run's end by 2 s, more than a lease and a sweep
    # (1.2 s), so lost renewals would show; the job is swept and claimed again with
    # 4 s to spare before the old run ends (its completion must come after).
    time.sleep(2.0)
    expired = sql(
        "UPDATE queue_job_state SET locked_until = now() - interval '1 second' "
        "WHERE job_id = %s AND status = 'running' RETURNING job_id",
        [job.id],
    )
    assert expired, "the first run ended before its lease was taken (a stalled machine)"
    sweeper = Store("default", "sweeper")
    try:
        # The worker's own sweep (every 0.2 s) may take the expired lease first.
        assert [row[0] for row in sweeper.sweep()] in ([job.id], [])
    finally:
        sweeper.close()
    wait_until(lambda: JobState.objects.get(pk=job.id).lease_version >= 2, timeout=120)
    wait_until(lambda: JobState.objects.get(pk=job.id).status != "pending", timeout=120)
    wait_until(lambda: JobState.objects.get(pk=job.id).status == "completed", timeout=120)
    worker.stop()
    attempts = list(Attempt.objects.filter(job_id=job.id).order_by("lease_version"))
    assert [(a.worker_id, a.status) for a in attempts] == [
        (worker.worker.worker_id, "lost"),
        (worker.worker.worker_id, "succeeded"),
    ]
    assert worker.worker.stats["stale_writes"] == 1
    assert sql("SELECT count(*) FROM qa_ledger WHERE job_id = %s", [job.id])[0][0] == 2


def test_handler_connections_survive_conn_max_age_zero_and_recover_when_killed(run_worker):
    from django.db import connection

    assert connection.settings_dict["CONN_MAX_AGE"] == 0  # Django's default: close per request
    first = enqueue_many([("qa.backend_pid", i) for i in range(10)], queue="pid")
    worker = run_worker(["pid"], concurrency=1, batch_size=1, burst=True)
    worker.join()
    pids = {a.result for a in Attempt.objects.filter(job_id__in=[j.id for j in first])}
    assert len(pids) == 1  # one connection for all ten jobs
    (pid,) = pids
    sql("SELECT pg_terminate_backend(%s)", [pid])
    time.sleep(0.2)
    job = enqueue("qa.backend_pid", queue="pid")
    worker = run_worker(["pid"], concurrency=1, batch_size=1, poll_interval=0.05)
    wait_until(lambda: JobState.objects.get(pk=job.id).status == "completed")
    worker.stop()
    new_pid = Attempt.objects.get(job_id=job.id, status="succeeded").result
    assert new_pid != pid


def test_worker_reconnects_after_its_connections_are_terminated(run_worker):
    worker = run_worker(["reconnect"], poll_interval=0.1)
    dispatcher = worker.worker._dispatcher
    wait_until(lambda: dispatcher.store.connected and dispatcher.claims.listening)
    # Only this test database's connections: the server may be shared with other runs.
    killed = sql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name LIKE 'pgqueue %%' AND datname = current_database() "
        "AND pid <> pg_backend_pid()"
    )[0][0]
    assert killed >= 2  # the dispatcher and the listener at least
    job = enqueue("qa.noop", queue="reconnect")
    wait_until(lambda: JobState.objects.get(pk=job.id).status == "completed", timeout=120)
    assert worker.worker.stats["completed"] == 1


def write_claimed(queue: str, count: int, outcome_of):
    """Claim `count` jobs of `queue` for a new Worker and write, as one batch, the
    outcome `outcome_of(row)` gives each (rows in job id order); return the Worker."""
    from django_pgqueue.retry import FixedDelay
    from django_pgqueue.worker import ClaimedJob, Worker

    worker = Worker([queue], install_signal_handlers=False)
    rows = sorted(worker._store.claim(queue, count, worker.worker_id, 30), key=lambda r: r.job_id)
    batch = [
        (ClaimedJob.claimed(row, None, FixedDelay(1), None, worker.worker_id, 0), outcome_of(row))
        for row in rows
    ]
    try:
        worker._dispatcher._write(batch, None)
    finally:
        worker._store.close()
    return worker


def test_a_completion_postgresql_refuses_is_recorded_not_fatal():
    """The batch falls back to one-by-one writes; the refused job dies with the error."""
    from django_pgqueue.outcomes import Success

    jobs = enqueue_many([("qa.noop", i) for i in range(3)], queue="refuse")
    # jsonb refuses \u0000: the first job's "result" cannot be stored.
    worker = write_claimed(
        "refuse",
        3,
        lambda row: Success('"\\u0000"' if row.job_id == jobs[0].id else '{"ok": true}'),
    )
    states = dict(JobState.objects.filter(queue="refuse").values_list("job_id", "status"))
    assert states == {jobs[0].id: "dead", jobs[1].id: "completed", jobs[2].id: "completed"}
    assert "ResultNotStorable" in JobState.objects.get(pk=jobs[0].id).last_error
    assert worker.stats["completed"] == 2
    assert worker.stats["dead"] == 1


def test_burst_worker_waits_for_a_retry_it_scheduled_moments_ahead(run_worker, settings):
    settings.PGQUEUE = {"RETRY_BACKOFF_BASE": 0.05, "RETRY_BACKOFF_CAP": 0.1}
    job = enqueue("qa.flaky", {"failures": 2}, queue="soon")
    worker = run_worker(["soon"], burst=True, poll_interval=0.5)
    worker.join()
    state = JobState.objects.get(pk=job.id)
    assert (state.status, state.attempts) == ("completed", 3)
    assert worker.worker.stats["retried"] == 2


def test_claims_resume_after_their_last_key_and_a_later_urgent_job_waits_little(run_worker):
    """Consecutive claims skip the claimed (dead) start of the queue's index entries,
    and a job that sorts before where they resume still starts within RESUME_TTL."""
    from django_pgqueue.worker import RESUME_TTL

    enqueue_many([("qa.nap", {"seconds": 0.005})] * 300, queue="resume")
    worker = run_worker(["resume"], concurrency=1, batch_size=1, burst=True)
    wait_until(lambda: statuses("resume").get("completed", 0) >= 30)
    urgent = enqueue("qa.noop", queue="resume", priority=10)
    worker.join()
    assert statuses("resume") == {"completed": 301}
    assert worker.worker.stats["claims_resumed"] > 100
    (waited, backlog_after) = sql(
        "SELECT extract(epoch FROM a.started_at - j.created_at),"
        " (SELECT count(*) FROM queue_attempts b JOIN queue_jobs k ON k.id = b.job_id"
        "  WHERE k.queue = 'resume' AND b.started_at > a.started_at)"
        " FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id WHERE j.id = %s",
        [urgent.id],
    )[0]
    # The walk from the start comes with the first claim after RESUME_TTL: the wait is
    # at most RESUME_TTL and the claim cycle then running, the longest pause between
    # two claims while it waited (about 10 ms; as long as a stall of a loaded machine).
    (longest_pause,) = sql(
        "SELECT extract(epoch FROM max(pause)) FROM ("
        "  SELECT a.started_at, a.started_at - lag(a.started_at) OVER (ORDER BY a.started_at)"
        "  AS pause FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id"
        "  WHERE j.queue = 'resume') claims"
        " WHERE started_at > (SELECT created_at FROM queue_jobs WHERE id = %s)"
        " AND started_at <= (SELECT started_at FROM queue_attempts WHERE job_id = %s)",
        [urgent.id, urgent.id],
    )[0]
    assert float(waited) < RESUME_TTL + float(longest_pause) + 0.25, (waited, longest_pause)
    assert backlog_after > 50  # it jumped the backlog
    # Every job ran once, in claim order apart from the urgent one.
    order = [
        job_id
        for (job_id,) in sql(
            "SELECT a.job_id FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id"
            " WHERE j.queue = 'resume' AND j.id <> %s ORDER BY a.started_at",
            [urgent.id],
        )
    ]
    assert order == sorted(order)
    assert len(order) == 300


@pytest.mark.parametrize("attempts_before", [0, 2])
def test_a_shutdown_past_the_grace_gives_the_attempt_back(run_worker, stores, attempts_before):
    """A deploy is not the handler's failure: a job on its last attempt whose handler
    still runs when the grace ends is never dead, its attempt given back (the attempt
    row says interrupted). While the handler may still run, its row stays running,
    held by the stopping worker (its slot under a limit too): the sweep passes over it
    although its lease ended. Once the handler returned, it is pending, due at once."""
    job = enqueue("qa.sleep", {"seconds": 3}, queue="deploy", max_attempts=attempts_before + 1)
    sql("UPDATE queue_job_state SET attempts = %s WHERE job_id = %s", [attempts_before, job.id])
    worker = run_worker(["deploy"], shutdown_grace=0.2)
    # The handler started: its ledger row is written first thing.
    wait_until(lambda: sql("SELECT count(*) FROM qa_ledger WHERE job_id = %s", [job.id])[0][0])
    worker.stop()
    state = JobState.objects.get(pk=job.id)
    assert (state.status, state.attempts) == ("running", attempts_before + 1)
    [attempt] = Attempt.objects.filter(job_id=job.id)
    assert (attempt.status, attempt.error_class) == ("interrupted", "django_pgqueue.WorkerShutdown")
    assert sql("SELECT locked_until <= now() FROM queue_job_state WHERE job_id = %s", [job.id]) == [
        (True,)
    ]
    assert stores().sweep() == []  # held: its handler still runs
    # Given back once the handler returned, not before.
    seen = set()
    deadline = time.monotonic() + 30
    while "pending" not in {status for status, _ in seen}:
        assert time.monotonic() < deadline, seen
        [(status, returned)] = sql(
            "SELECT s.status, l.finished_at IS NOT NULL FROM queue_job_state s "
            "JOIN qa_ledger l ON l.job_id = s.job_id WHERE s.job_id = %s",
            [job.id],
        )
        seen.add((status, returned))
        time.sleep(0.02)
    assert ("pending", False) not in seen
    assert ("running", False) in seen
    state = JobState.objects.get(pk=job.id)
    assert (state.status, state.attempts) == ("pending", attempts_before)
    assert state.run_at <= sql("SELECT now()")[0][0]  # due again at once
    [attempt] = Attempt.objects.filter(job_id=job.id)
    assert (attempt.status, attempt.error_class) == ("interrupted", "django_pgqueue.WorkerShutdown")
    assert worker.worker.stats["interrupted"] == 1


def test_the_sweep_gives_an_interrupted_attempt_back_once_its_worker_is_gone(run_worker, stores):
    """A worker process that ends while its interrupted handler runs takes its hold of
    the row with it (here the hold's session alone ends: the test process lives on).
    The sweep then takes the job, and gives its attempt back: pending, never dead on
    its last attempt."""
    job = enqueue("qa.sleep", {"seconds": 5}, queue="deploy", max_attempts=1)
    worker = run_worker(["deploy"], shutdown_grace=0.2)
    wait_until(lambda: sql("SELECT count(*) FROM qa_ledger WHERE job_id = %s", [job.id])[0][0])
    worker.stop()
    assert stores().sweep() == []  # held
    [(ended,)] = sql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
        [f"pgqueue hold {worker.worker.worker_id}"],
    )
    assert ended == 1
    sweeper = stores()
    swept = []
    wait_until(lambda: bool(swept.extend(sweeper.sweep()) or swept))
    assert [(job_id, status) for job_id, _, _, status in swept] == [(job.id, "pending")]
    state = JobState.objects.get(pk=job.id)
    assert (state.status, state.attempts) == ("pending", 0)
    assert state.last_error.startswith("interrupted: worker ")
    [attempt] = Attempt.objects.filter(job_id=job.id)
    assert attempt.status == "interrupted"  # not 'lost'


@django_pgqueue.handler("test.fails_once_listened", max_attempts=4, retry=FixedDelay(2.0))
def fails_once_listened(ctx):
    """Fails, but only once its worker's listener is connected: the worker then knows
    NOTIFYs arrive, and an idle worker of that kind would sleep until the retry."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                [f"pgqueue listener {ctx.worker_id}"],
            )
            if cursor.fetchone()[0]:
                break
        time.sleep(0.02)
    raise ConnectionError("the service does not answer")


def test_a_burst_worker_leaves_a_retry_due_later_even_while_listening(run_worker):
    job = enqueue("test.fails_once_listened", {}, queue="burstlisten")
    worker = run_worker(["burstlisten"], burst=True, concurrency=1, poll_interval=0.05)
    worker.join(60)
    # It ran the job once and exited: the retry, due 2 s later, is left for later.
    state = JobState.objects.get(pk=job.id)
    assert (state.status, state.attempts) == ("pending", 1)
