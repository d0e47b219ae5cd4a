"""Batches: the jobs enqueued in a ``batch()`` block, and callbacks fired once when all end.

Run by real workers on the real database; the concurrent case ends the members from
two worker processes' worth of connections at once (threads, each its own Store).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import transaction

from django_pgqueue import (
    BatchNotFound,
    EnqueueError,
    JobSpec,
    PayloadError,
    batch,
    batch_status,
    enqueue,
    enqueue_many,
    step,
)
from django_pgqueue.actions import cancel, retry_now
from django_pgqueue.maintenance import prune
from django_pgqueue.models import Attempt, Batch, BatchJob, JobState
from django_pgqueue.outcomes import Dead
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)

Q = "batch"
FINISHED = ("completed", "dead", "cancelled")
CALLBACK = "qa.batch_counts"


def status(job_id: int) -> str:
    return JobState.objects.get(pk=job_id).status


def attempts(job_id: int) -> int:
    return Attempt.objects.filter(job_id=job_id).count()


def result(job_id: int):
    return Attempt.objects.get(job_id=job_id, status="succeeded").result


def wait_until(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def settled(run) -> bool:
    """Every member and every callback of `run` finished."""
    ids = [*run.jobs, *run.callbacks.values()]
    return JobState.objects.filter(pk__in=ids).exclude(status__in=FINISHED).count() == 0


def drain(run_worker, run, **options):
    options.setdefault("concurrency", 4)
    worker = run_worker([Q], poll_interval=0.05, **options)
    wait_until(lambda: settled(run))
    worker.stop()
    return worker


def callbacks(**events):
    return {event: step(CALLBACK, {"event": event}, queue=Q) for event in events}


ALL = ("on_success", "on_finish", "on_discard")


def test_all_members_succeed_fire_on_success_and_on_finish_once_with_the_counts(run_worker):
    with batch(name="import", **callbacks(**dict.fromkeys(ALL))) as run:
        enqueue("qa.noop", queue=Q)
        enqueue_many([("qa.noop", i) for i in range(3)], queue=Q)
    assert len(run.jobs) == 4
    drain(run_worker, run)
    assert {event: status(job_id) for event, job_id in run.callbacks.items()} == {
        "on_success": "completed",
        "on_finish": "completed",
        "on_discard": "cancelled",  # skipped: nothing failed
    }
    for event in ("on_success", "on_finish"):
        job_id = run.callbacks[event]
        assert attempts(job_id) == 1
        seen = result(job_id)
        assert seen["payload"] == {"event": event}
        assert seen["batch"] == {
            "id": run.id,
            "name": "import",
            "size": 4,
            "completed": 4,
            "dead": 0,
            "cancelled": 0,
            "unfinished": 0,
            "state": "succeeded",
        }
    assert attempts(run.callbacks["on_discard"]) == 0
    assert "skipped" in JobState.objects.get(pk=run.callbacks["on_discard"]).last_error
    assert batch_status(run.id).state == "succeeded"


def test_a_dead_member_fires_on_discard_and_on_finish_not_on_success(run_worker):
    with batch(**callbacks(**dict.fromkeys(ALL))) as run:
        enqueue_many([("qa.noop", i) for i in range(3)], queue=Q)
        dead = enqueue("qa.parents_fail", "boom", queue=Q).id
    drain(run_worker, run)
    assert status(dead) == "dead"
    assert {event: status(job_id) for event, job_id in run.callbacks.items()} == {
        "on_success": "cancelled",
        "on_finish": "completed",
        "on_discard": "completed",
    }
    assert attempts(run.callbacks["on_success"]) == 0
    for event in ("on_discard", "on_finish"):
        assert attempts(run.callbacks[event]) == 1
        counts = result(run.callbacks[event])["batch"]
        assert (counts["completed"], counts["dead"], counts["state"]) == (3, 1, "discarded")


def test_a_member_that_failed_then_succeeded_on_retry_counts_as_succeeded(run_worker):
    with batch(**callbacks(**dict.fromkeys(ALL))) as run:
        flaky = enqueue("qa.batch_flaky", queue=Q).id
        enqueue("qa.noop", queue=Q)
    drain(run_worker, run)
    assert Attempt.objects.filter(job_id=flaky, status="failed").count() == 1
    assert status(run.callbacks["on_success"]) == "completed"
    assert status(run.callbacks["on_discard"]) == "cancelled"
    counts = result(run.callbacks["on_success"])["batch"]
    assert (counts["completed"], counts["dead"]) == (2, 0)


def test_a_tasks_enqueue_joins_and_a_task_callback_reads_the_counts(run_worker):
    from qa.tasks import add, batch_report

    first = enqueue("qa.noop", queue=Q, idempotency_key="once").id
    with batch(on_finish=step(batch_report), name="tasks") as run:
        task_job = add.enqueue(2, 3).id
        # An idempotency key that matched a job enqueued before: that job joins nothing.
        assert enqueue("qa.noop", queue=Q, idempotency_key="once").id == first
    assert run.jobs == [int(task_job)]
    worker = run_worker(["qa-tasks", Q], poll_interval=0.05, concurrency=4)
    wait_until(lambda: settled(run))
    worker.stop()
    assert result(run.callbacks["on_finish"])["completed"] == 1
    assert result(run.callbacks["on_finish"])["size"] == 1


def test_a_cancelled_member_counts_as_discarded(run_worker):
    with batch(**callbacks(on_discard=None, on_finish=None)) as run:
        doomed = enqueue("qa.noop", queue=Q).id
        enqueue("qa.noop", queue=Q)
    assert cancel([doomed]).changed == [doomed]
    drain(run_worker, run)
    counts = result(run.callbacks["on_discard"])["batch"]
    assert (counts["completed"], counts["cancelled"], counts["state"]) == (1, 1, "discarded")


@pytest.mark.parametrize("failures", [0, 5])
def test_members_ended_by_two_workers_at_once_fire_each_callback_once(stores, failures):
    """60 members ended from two connections at once, completions in batches: each
    callback is made pending exactly once, after its last member's ending began (on_success
    is cancelled by the first death, at once)."""
    with batch(**callbacks(**dict.fromkeys(ALL))) as run:
        enqueue_many([JobSpec("qa.noop", i, queue=Q) for i in range(60)])
    doomed = set(run.jobs[:failures])
    members = set(run.jobs)
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def work(n: int) -> None:
        store = stores(f"w{n}")
        barrier.wait()
        try:
            while rows := store.claim(Q, 3, f"w{n}", 30):
                done = []
                for row in rows:
                    if row.job_id not in members:
                        continue  # a callback made pending: counted below
                    if row.job_id in doomed:
                        failure = Dead("X", "dies", "")
                        store.fail(row.job_id, row.lease_version, row.attempt_id, failure)
                    else:
                        done.append((row.job_id, row.lease_version, row.attempt_id, None))
                assert store.complete(done) == {job_id for job_id, *_ in done}
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    expected = (
        {"on_success": "pending", "on_finish": "pending", "on_discard": "cancelled"}
        if not failures
        else {"on_success": "cancelled", "on_finish": "pending", "on_discard": "pending"}
    )
    # A callback claimed by a worker above is running (left unfinished): count as due.
    seen = {
        event: "pending" if status(job_id) == "running" else status(job_id)
        for event, job_id in run.callbacks.items()
    }
    assert seen == expected
    for job_id in run.callbacks.values():
        # Made due at most once: at most one attempt, never more.
        assert attempts(job_id) <= 1
    steps = sql(
        "SELECT waiting_for, failed FROM queue_workflow_steps WHERE job_id = ANY(%s) "
        "ORDER BY job_id",
        [list(run.callbacks.values())],
    )
    assert steps == [(0, failures)] * 3
    last_member = sql(
        "SELECT max(updated_at) FROM queue_job_state WHERE job_id = ANY(%s)", [run.jobs]
    )[0][0]
    due = [run.callbacks[event] for event, state in expected.items() if state == "pending"]
    made_due = sql("SELECT min(updated_at) FROM queue_job_state WHERE job_id = ANY(%s)", [due])[0][
        0
    ]
    assert made_due >= last_member


def test_two_real_workers_running_a_batch_fire_each_callback_once(run_worker):
    with batch(**callbacks(**dict.fromkeys(ALL))) as run:
        enqueue_many([("qa.noop", i) for i in range(40)], queue=Q)
        enqueue("qa.parents_fail", "boom", queue=Q)
    workers = [run_worker([Q], poll_interval=0.05, concurrency=4) for _ in range(2)]
    wait_until(lambda: settled(run))
    for worker in workers:
        worker.stop()
    assert {event: attempts(job_id) for event, job_id in run.callbacks.items()} == {
        "on_success": 0,
        "on_finish": 1,
        "on_discard": 1,
    }
    counts = result(run.callbacks["on_finish"])["batch"]
    assert (counts["completed"], counts["dead"], counts["unfinished"]) == (40, 1, 0)


def test_a_stale_workers_refused_write_settles_nothing(stores):
    with batch(**callbacks(on_finish=None)) as run:
        only = enqueue("qa.noop", queue=Q).id
    old, new = stores("old"), stores("new")
    first = old.claim(Q, 1, "old", 0.2)[0]
    time.sleep(0.4)  # the lease runs out on the database clock
    assert [row[0] for row in new.sweep()] == [only]
    second = new.claim(Q, 1, "new", 30)[0]
    assert old.complete([(only, first.lease_version, first.attempt_id, None)]) == set()
    assert status(run.callbacks["on_finish"]) == "waiting"
    assert new.complete([(only, second.lease_version, second.attempt_id, None)]) == {only}
    assert status(run.callbacks["on_finish"]) == "pending"


def _fails_after_the_block() -> None:
    with transaction.atomic():
        with batch(**callbacks(on_finish=None)):
            enqueue("qa.noop", queue=Q)
            enqueue_many([("qa.noop", 1)], queue=Q)
        raise RuntimeError("the caller's transaction fails after the block")


def _fails_in_the_block() -> None:
    with batch(**callbacks(on_finish=None)):
        enqueue("qa.noop", queue=Q)
        raise RuntimeError("the block fails")


def test_a_rolled_back_batch_leaves_nothing():
    before = sql("SELECT count(*) FROM queue_jobs")[0][0]
    with pytest.raises(RuntimeError, match="after the block"):
        _fails_after_the_block()
    with pytest.raises(RuntimeError, match="the block fails"):
        _fails_in_the_block()
    assert sql("SELECT count(*) FROM queue_jobs")[0][0] == before
    assert Batch.objects.count() == 0
    assert BatchJob.objects.count() == 0


def _rolled_back_to_a_savepoint() -> None:
    with transaction.atomic():
        enqueue("qa.noop", queue=Q)
        raise RuntimeError("rolled back to the savepoint")


def test_a_job_rolled_back_to_a_savepoint_inside_the_block_is_no_member(run_worker):
    with batch(**callbacks(on_finish=None)) as run:
        kept = enqueue("qa.noop", queue=Q).id
        with pytest.raises(RuntimeError):
            _rolled_back_to_a_savepoint()
    assert run.jobs == [kept]
    drain(run_worker, run)
    assert result(run.callbacks["on_finish"])["batch"]["size"] == 1


def test_an_empty_batch_fires_on_success_and_on_finish_at_once(run_worker):
    with batch(**callbacks(**dict.fromkeys(ALL))) as run:
        pass
    assert run.jobs == []
    assert set(run.callbacks) == {"on_success", "on_finish"}  # nothing to discard
    assert {status(job_id) for job_id in run.callbacks.values()} == {"pending"}
    drain(run_worker, run)
    counts = result(run.callbacks["on_finish"])["batch"]
    assert (counts["size"], counts["state"]) == (0, "succeeded")


def _nested() -> None:
    with batch(name="outer", **callbacks(on_finish=None)):
        enqueue("qa.noop", queue=Q)
        with batch(name="inner"):
            enqueue("qa.noop", queue=Q)


def test_a_nested_batch_is_refused_and_the_outer_one_rolls_back():
    with pytest.raises(EnqueueError, match="batch 'inner' is opened inside batch 'outer'"):
        _nested()
    assert sql("SELECT count(*) FROM queue_jobs")[0][0] == 0
    # The refusal left no batch open: a new block opens and gathers its job.
    with batch() as run:
        enqueue("qa.noop", queue=Q)
    assert len(run.jobs) == 1


def _open(**options) -> None:
    with batch(name="b", **options):
        pass


def test_bad_callbacks_are_refused_on_entry_naming_them():
    with pytest.raises(EnqueueError, match=r"batch 'b', on_finish: .*Step, a job type"):
        _open(on_finish=42)
    with pytest.raises(EnqueueError, match=r"batch 'b', on_success: .*queue"):
        _open(on_success=step(CALLBACK, queue="no spaces allowed"))
    with pytest.raises(PayloadError, match=r"batch 'b', on_discard: "):
        _open(on_discard=step(CALLBACK, {"x": object()}))
    assert sql("SELECT count(*) FROM queue_jobs")[0][0] == 0
    assert Batch.objects.count() == 0


def _joins_from_another_database(run: list, on_commit: bool) -> None:
    with batch(using="default") as opened:
        run.append(opened)
        enqueue("qa.noop", queue=Q)
        # Refused before anything touches "other" (no such alias here).
        enqueue("qa.noop", queue=Q, using="other", on_commit=on_commit)


@pytest.mark.parametrize("on_commit", [False, True])
def test_a_job_on_another_database_is_refused_before_it_is_written(on_commit: bool):
    run: list = []
    with pytest.raises(
        EnqueueError,
        match=r"queue 'batch' \(database 'other'\) was enqueued inside batch 'batch' "
        r"\(database 'default'\).*could not join the transaction of the block",
    ):
        _joins_from_another_database(run, on_commit)
    assert run[0].id is None
    assert Batch.objects.count() == 0
    assert sql("SELECT count(*) FROM queue_jobs")[0][0] == 0


def test_batch_status_reads_a_member_a_callback_or_an_id_and_refuses_others():
    with batch(name="st", **callbacks(on_finish=None)) as run:
        member = enqueue("qa.noop", queue=Q).id
    plain = enqueue("qa.noop", queue=Q).id

    class Ctx:
        def __init__(self, job_id: int) -> None:
            self.job_id = job_id

    for target in (run.id, run, Ctx(member), Ctx(run.callbacks["on_finish"])):
        found = batch_status(target)
        assert (found.id, found.size, found.unfinished, found.state) == (run.id, 1, 1, "running")
    assert found.callbacks == {"on_finish": (run.callbacks["on_finish"], "waiting")}
    with pytest.raises(BatchNotFound):
        batch_status(Ctx(plain))
    with pytest.raises(BatchNotFound):
        batch_status(run.id + 1000)


def test_operator_retry_of_a_dead_member_after_the_batch_discarded(run_worker):
    """Callbacks that fired stay fired (none runs twice); on_success, cancelled by the
    dead member, waits again and fires if the retried member succeeds."""
    with batch(**callbacks(**dict.fromkeys(ALL))) as run:
        enqueue("qa.noop", queue=Q)
        dead = enqueue("qa.parents_fail", "boom", queue=Q).id
    drain(run_worker, run)
    assert status(run.callbacks["on_discard"]) == "completed"
    assert retry_now([dead]).changed == [dead]
    assert status(run.callbacks["on_success"]) == "waiting"
    drain(run_worker, run)  # the member dies again (it always fails)
    assert status(dead) == "dead"
    assert attempts(run.callbacks["on_discard"]) == 1
    assert attempts(run.callbacks["on_finish"]) == 1
    assert status(run.callbacks["on_success"]) == "cancelled"
    assert attempts(run.callbacks["on_success"]) == 0


def test_a_plain_enqueue_outside_a_batch_joins_nothing(django_assert_num_queries):
    enqueue("qa.noop", queue=Q)  # the connection is open, the statement prepared
    with django_assert_num_queries(1):
        enqueue("qa.noop", queue=Q)
    assert BatchJob.objects.count() == 0


def _finish(job_ids, status: str = "completed") -> None:
    """Mark jobs finished a month ago (so a 7-day prune would take them)."""
    sql(
        "UPDATE queue_job_state SET status = %s, finished_at = now() - interval '30 days' "
        "WHERE job_id = ANY(%s)",
        [status, list(job_ids)],
    )


def _age_batches() -> None:
    sql("UPDATE queue_batches SET created_at = now() - interval '31 days'")
    sql("UPDATE queue_workflows SET created_at = now() - interval '31 days'")


def test_pruning_keeps_a_batchs_members_until_the_batch_settled():
    with batch(**callbacks(on_finish=None)) as run:
        enqueue_many([("qa.noop", i) for i in range(3)], queue=Q)
    with batch() as bare:  # no callbacks: settled once every member finished
        enqueue_many([("qa.noop", i) for i in range(2)], queue=Q)
    plain = enqueue("qa.noop", queue=Q).id
    _finish([*run.jobs[:2], bare.jobs[0], plain])
    _age_batches()
    week = dt.timedelta(days=7)

    assert prune(week, dry_run=True).jobs == {"completed": 1}
    result = prune(week)
    assert result.jobs == {"completed": 1}
    assert sql("SELECT count(*) FROM queue_jobs WHERE id = %s", [plain]) == [(0,)]
    counts = batch_status(run.id)
    assert (counts.completed, counts.unfinished, counts.size) == (2, 1, 3)
    assert batch_status(bare.id).completed == 1

    # The last members finish; the callback is due, so the batch is not settled yet.
    _finish([run.jobs[2], bare.jobs[1]])
    sql(
        "UPDATE queue_job_state SET status = 'pending' WHERE job_id = %s",
        [run.callbacks["on_finish"]],
    )
    assert prune(week).jobs == {"completed": 2}
    assert batch_status(run.id).completed == 3
    assert not Batch.objects.filter(pk=bare.id).exists()
    assert not BatchJob.objects.filter(batch_id=bare.id).exists()

    # The callback finishes: the batch settled, its members, callback and row go.
    _finish([run.callbacks["on_finish"]])
    result = prune(week)
    assert result.jobs == {"completed": 4}
    assert result.batches_deleted == 1
    assert sql("SELECT count(*) FROM queue_jobs") == [(0,)]
    assert sql("SELECT count(*) FROM queue_batches") == [(0,)]
    assert sql("SELECT count(*) FROM queue_batch_jobs") == [(0,)]
    assert sql("SELECT count(*) FROM queue_workflows") == [(0,)]


def test_pruning_keeps_a_batchs_early_cancelled_callback_while_members_run():
    """on_success is cancelled by the first death, at once: it stays (and the dead
    member with it) while the other members run, so batch_status still tells it."""
    with batch(**callbacks(on_success=None)) as run:
        enqueue_many([("qa.noop", i) for i in range(2)], queue=Q)
    _finish([run.jobs[0]], "dead")
    _finish([run.callbacks["on_success"]], "cancelled")
    _age_batches()
    week = dt.timedelta(days=7)
    assert prune(week).jobs == {}
    assert batch_status(run.id).callbacks == {
        "on_success": (run.callbacks["on_success"], "cancelled")
    }
    assert batch_status(run.id).dead == 1

    _finish([run.jobs[1]])
    result = prune(week)
    assert result.jobs == {"dead": 1, "completed": 1, "cancelled": 1}
    assert result.batches_deleted == 1


def test_a_young_batch_row_outlives_its_pruned_members_until_the_cutoff():
    with batch() as run:
        enqueue("qa.noop", queue=Q)
    _finish(run.jobs)
    week = dt.timedelta(days=7)
    result = prune(week)
    assert result.jobs == {"completed": 1}
    assert result.batches_deleted == 0
    assert Batch.objects.filter(pk=run.id).exists()


def test_the_prune_command_says_how_many_batch_rows_it_deleted():
    with batch() as run:
        enqueue("qa.noop", queue=Q)
    _finish(run.jobs)
    _age_batches()
    out = StringIO()
    call_command("prune_queue_jobs", "--older-than", "7d", stdout=out)
    assert "Deleted 1 batch (batch() rows) whose members and callbacks were all gone." in (
        out.getvalue()
    )


def _end(store, rows, dead=()) -> None:
    """Complete the claimed rows, or fail for good those in `dead`."""
    for row in rows:
        if row.job_id in dead:
            failure = Dead("X", "dies", "")
            assert store.fail(row.job_id, row.lease_version, row.attempt_id, failure)[0] == "dead"
        else:
            assert store.complete([(row.job_id, row.lease_version, row.attempt_id, None)])


def test_retrying_a_dead_member_puts_due_callbacks_back_to_waiting(stores):
    """The last member died: on_finish and on_discard are due. Retried before a worker
    claims them, the member is unfinished again, so they wait for it again (not
    claimable meanwhile), and each fires once, after the member's new ending."""
    with batch(**callbacks(on_finish=None, on_discard=None)) as run:
        enqueue("qa.noop", queue=Q)
        dead = enqueue("qa.noop", queue=Q).id
    store = stores()
    _end(store, store.claim(Q, 5, "w", 30), dead={dead})
    assert {status(job_id) for job_id in run.callbacks.values()} == {"pending"}
    assert retry_now([dead]).changed == [dead]
    assert {status(job_id) for job_id in run.callbacks.values()} == {"waiting"}
    rows = store.claim(Q, 5, "w", 30)
    assert [row.job_id for row in rows] == [dead]
    _end(store, rows)  # it completes this time
    assert status(run.callbacks["on_discard"]) == "cancelled"  # skipped: none failed now
    rows = store.claim(Q, 5, "w", 30)
    assert [row.job_id for row in rows] == [run.callbacks["on_finish"]]
    _end(store, rows)
    assert [attempts(job_id) for job_id in run.callbacks.values()] == [1, 0]


def test_a_batch_that_ended_across_the_cutoff_is_pruned_whole_or_not_at_all(stores):
    """One member completed a month ago, the other died an hour ago: a prune keeps the
    whole batch, so a later retry of the dead member runs on_success with both counted."""
    with batch(**callbacks(on_success=None)) as run:
        early = enqueue("qa.noop", queue=Q).id
        dead = enqueue("qa.noop", queue=Q).id
    store = stores()
    _end(store, store.claim(Q, 5, "w", 30), dead={dead})
    assert status(run.callbacks["on_success"]) == "cancelled"
    sql(
        "UPDATE queue_job_state SET finished_at = now() - interval '30 days' WHERE job_id = %s",
        [early],
    )
    _age_batches()
    pruned = prune(dt.timedelta(days=7)).jobs
    assert retry_now([dead]).changed == [dead]
    _end(store, store.claim(Q, 5, "w", 30))
    assert status(run.callbacks["on_success"]) == "pending"
    counts = batch_status(run.id)
    assert (counts.completed, counts.size) == (2, 2)
    assert pruned == {}
