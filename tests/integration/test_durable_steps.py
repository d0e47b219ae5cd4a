"""Durable steps in real workers: each step's function runs once per job, its result
stored under the lease and given back to later runs; a step that raised runs again."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from qa.models import DurableCall, DurableEffect

from django_pgqueue import JobContext, StepMismatch, StepNotRecorded, enqueue
from django_pgqueue.models import Attempt, JobState, JobStep
from django_pgqueue.sql import QUERIES
from tests.conftest import sql
from tests.integration.test_worker import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def calls(job_id: int) -> dict[str, int]:
    rows = sql(
        "SELECT step, count(*) FROM qa_durable_call WHERE job_id = %s GROUP BY step", [job_id]
    )
    return dict(rows)


def test_a_retried_run_gets_its_steps_results_without_running_them(run_worker):
    job = enqueue("qa.durable_steps", {"steps": 4, "fail_first": True}, queue="ds")
    run_worker(["ds"], poll_interval=0.05)
    wait_until(lambda: JobState.objects.get(pk=job.id).status == "completed")
    assert calls(job.id) == {"s0": 1, "s1": 1, "s2": 1, "s3": 1}
    attempts = Attempt.objects.filter(job_id=job.id).order_by("lease_version")
    assert [a.status for a in attempts] == ["failed", "succeeded"]
    assert attempts[1].result == ["s0", "s1", "s2", "s3"]
    steps = {s.name: s for s in JobStep.objects.filter(job_id=job.id)}
    assert {name: (s.kind, s.result, s.lease_version) for name, s in steps.items()} == {
        f"s{i}": ("step", f"s{i}", 1) for i in range(4)
    }
    assert all(s.runtime is not None and s.runtime >= 0 for s in steps.values())


def _claimed(stores, job_id: int) -> JobContext:
    """A context of `job_id` claimed now (its lease held by no worker thread)."""
    store = stores()
    (row,) = store.claim("dq", 1, "test", 60.0)
    assert row.job_id == job_id
    return JobContext(
        job_id=row.job_id,
        queue=row.queue,
        type=row.type,
        payload=None,
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        lease_version=row.lease_version,
        attempt_id=row.attempt_id,
    )


def _give_back(job_id: int) -> None:
    sql(
        "UPDATE queue_job_state SET status = 'pending', locked_by = NULL, "
        "locked_until = NULL WHERE job_id = %s",
        [job_id],
    )


def test_a_resumed_run_reads_a_thousand_checkpoints_in_one_statement(stores):
    job = enqueue("qa.noop", queue="dq")
    first = _claimed(stores, job.id)
    assert [first.step(f"s{i}", lambda i=i: {"i": i}) for i in range(1000)] == [
        {"i": i} for i in range(1000)
    ]
    _give_back(job.id)
    resumed = _claimed(stores, job.id)

    def never() -> None:
        raise AssertionError("a step with a checkpoint ran again")

    with CaptureQueriesContext(connection) as queries:
        results = [resumed.step(f"s{i}", never) for i in range(1000)]
    assert results == [{"i": i} for i in range(1000)]
    assert len(queries) == 1, [q["sql"][:60] for q in queries]


def test_each_step_of_a_worker_run_sends_one_statement_its_checkpoint(run_worker):
    job = enqueue("qa.durable_counted", {"steps": 5}, queue="ds")
    run_worker(["ds"], poll_interval=0.05)
    wait_until(lambda: JobState.objects.get(pk=job.id).status == "completed")
    result = Attempt.objects.get(job_id=job.id, status="succeeded").result
    # The first step reads the job's checkpoints (none) once for the run; each step
    # then writes its checkpoint in one statement.
    assert result["per_step"] == [2, 1, 1, 1, 1]
    assert result["statements"] == ["-- name: step_load"] + ["-- name: step_record"] * 5
    assert JobStep.objects.filter(job_id=job.id).count() == 5


def test_a_worker_resuming_a_thousand_steps_reads_their_checkpoints_in_one_statement(
    run_worker,
):
    job = enqueue("qa.durable_counted", {"steps": 1000, "fail_first": True}, queue="ds")
    run_worker(["ds"], poll_interval=0.05)
    wait_until(lambda: JobState.objects.get(pk=job.id).status == "completed")
    attempts = list(Attempt.objects.filter(job_id=job.id).order_by("lease_version"))
    assert [a.status for a in attempts] == ["failed", "succeeded"]
    # The retry met 1,000 checkpoints of the first attempt: one statement read them all,
    # and no step ran or wrote again.
    result = attempts[1].result
    assert result["per_step"] == [1] + [0] * 999
    assert result["statements"] == ["-- name: step_load"]
    recorded = JobStep.objects.filter(job_id=job.id)
    assert recorded.count() == 1000
    assert set(recorded.values_list("lease_version", flat=True)) == {1}


def _commit_mode() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0]


def test_a_plain_steps_checkpoint_alone_commits_without_waiting_for_the_disk(stores):
    job = enqueue("qa.noop", queue="dq")
    ctx = _claimed(stores, job.id)
    params = {"job_id": job.id, "lease_version": ctx.lease_version, "kind": "step"}
    params |= {"result": "1", "runtime": None, "seconds": None, "wake_at": None}
    server_default = _commit_mode()
    assert server_default != "off"
    # The statement sets the commit mode of its own transaction only, and only unflushed.
    for name, flush, mode in (("unflushed", False, "off"), ("flushed", True, server_default)):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(QUERIES["step_record"], {**params, "name": name, "flush": flush})
            assert cursor.fetchone() is not None
            assert _commit_mode() == mode
    assert _commit_mode() == server_default
    # A plain step alone asks for it; one in a transaction of the handler's, or an atomic
    # step, leaves that transaction's commit as it is.
    flushes: list[bool] = []

    def spy(execute, query, params, many, context):
        if query.startswith("-- name: step_record"):
            flushes.append(params["flush"])
        return execute(query, params, many, context)

    with connection.execute_wrapper(spy):
        assert ctx.step("alone", lambda: 2) == 2
        with transaction.atomic():
            assert ctx.step("in a transaction", lambda: 3) == 3
            assert _commit_mode() == server_default
        assert ctx.atomic_step("atomic", lambda: 4) == 4
    assert flushes == [False, True, True]
    recorded = set(JobStep.objects.filter(job_id=job.id).values_list("name", flat=True))
    assert recorded == {"unflushed", "flushed", "alone", "in a transaction", "atomic"}


def test_a_step_of_a_worker_whose_lease_was_lost_records_nothing(stores):
    job = enqueue("qa.noop", queue="dq")
    stale = _claimed(stores, job.id)
    stale.step("early", lambda: 1)
    _give_back(job.id)  # as the sweep does once the lease ran out
    with pytest.raises(StepNotRecorded, match="lease"):
        stale.step("late", lambda: 2)
    with pytest.raises(StepNotRecorded):
        stale.atomic_step(
            "late-atomic",
            lambda: (
                DurableEffect.objects.create(
                    job_id=job.id, step="late-atomic", lease_version=stale.lease_version
                ).pk
            ),
        )
    assert DurableEffect.objects.count() == 0  # rolled back with its checkpoint
    assert set(JobStep.objects.values_list("name", flat=True)) == {"early"}


def test_a_step_that_raised_has_no_checkpoint_and_runs_again(stores):
    job = enqueue("qa.noop", queue="dq")
    ctx = _claimed(stores, job.id)

    def boom() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        ctx.atomic_step(
            "a",
            lambda: (DurableCall.objects.create(job_id=job.id, step="a", lease_version=1), boom()),
        )
    assert DurableCall.objects.count() == 0  # the atomic step's write rolled back
    assert not JobStep.objects.exists()
    _give_back(job.id)
    again = _claimed(stores, job.id)
    assert again.atomic_step("a", lambda: "ran") == "ran"


def test_bad_steps_are_refused_with_what_was_wrong(stores):
    job = enqueue("qa.noop", queue="dq")
    ctx = _claimed(stores, job.id)
    ctx.step("once", lambda: None)
    with pytest.raises(ValueError, match="'once' ran twice in one run"):
        ctx.step("once", lambda: None)
    with pytest.raises(ValueError, match="name must be a string"):
        ctx.step("", lambda: None)
    with pytest.raises(TypeError, match="the result of step 'obj'"):
        ctx.step("obj", object)
    assert not JobStep.objects.filter(name="obj").exists()
    ctx.sleep_until("nap", JobState.objects.get(pk=job.id).updated_at)  # due: returns
    _give_back(job.id)
    resumed = _claimed(stores, job.id)
    with pytest.raises(StepMismatch, match="recorded as a sleep step"):
        resumed.step("nap", lambda: None)


def test_a_step_result_is_its_json_on_the_first_run_too(stores):
    job = enqueue("qa.noop", queue="dq")
    ctx = _claimed(stores, job.id)
    assert ctx.step("t", lambda: (1, "a")) == [1, "a"]
    assert ctx.step("none", lambda: None) is None
    _give_back(job.id)
    resumed = _claimed(stores, job.id)
    assert resumed.step("none", lambda: 5) is None


@pytest.mark.parametrize("type_", ["qa.durable_complete", "qa.adurable_complete"])
def test_a_handler_completes_its_job_in_its_own_transaction(run_worker, type_):
    job = enqueue(type_, queue="dc")
    worker = run_worker(["dc"], poll_interval=0.05)
    wait_until(lambda: JobState.objects.get(pk=job.id).status == "completed")
    effect = DurableEffect.objects.get(job_id=job.id)
    attempt = Attempt.objects.get(job_id=job.id)
    assert (attempt.status, attempt.result) == ("succeeded", effect.pk)
    wait_until(lambda: worker.worker.stats["completed"] == 1)
    assert worker.worker.stats["stale_writes"] == 0  # nothing written twice


def test_a_stale_owners_completion_rolls_back_its_writes(stores):
    job = enqueue("qa.noop", queue="dq")
    stale = _claimed(stores, job.id)
    _give_back(job.id)

    def write() -> int:
        return DurableEffect.objects.create(job_id=job.id, step="done", lease_version=1).pk

    with pytest.raises(StepNotRecorded, match="was not completed"):
        stale.complete_atomically(write)
    assert not DurableEffect.objects.exists()
    assert JobState.objects.get(pk=job.id).status == "pending"
    fresh = _claimed(stores, job.id)
    assert fresh.complete_atomically(write) == DurableEffect.objects.get().pk
    assert JobState.objects.get(pk=job.id).status == "completed"
    with transaction.atomic(), pytest.raises(RuntimeError, match="outside"):
        fresh.complete_atomically(write)


def test_patched_keeps_runs_started_by_old_code_on_the_old_path(stores):
    old = enqueue("qa.noop", queue="dq")
    new = enqueue("qa.noop", queue="dq")
    # The old code: two steps, no patch between them.
    ctx = _claimed(stores, old.id)
    ctx.step("reserve", lambda: 1)
    ctx.step("charge", lambda: "v1")
    _give_back(old.id)

    def new_code(ctx: JobContext) -> str:
        ctx.step("reserve", lambda: 1)
        if ctx.patched("charge-v2"):
            return ctx.step("charge-v2", lambda: "v2")
        return ctx.step("charge", lambda: "v1")

    assert new_code(_claimed(stores, old.id)) == "v1"  # replays the old history
    _give_back(old.id)
    assert new_code(_claimed(stores, old.id)) == "v1"  # and decides the same again
    assert new_code(_claimed(stores, new.id)) == "v2"
    _give_back(new.id)
    assert new_code(_claimed(stores, new.id)) == "v2"
    assert set(JobStep.objects.filter(job_id=new.id).values_list("name", flat=True)) == {
        "reserve",
        "patch:charge-v2",
        "charge-v2",
    }
