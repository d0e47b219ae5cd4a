"""A job reference carries its database: every API that takes a job or its id reads
that job's database from the reference, never PGQUEUE["DATABASE"] by default. Each
test puts a job on `default` and one on `queues2` under the same id (each database
numbers its own jobs), so an API that looks on the wrong database finds the other job
and shows it."""

from __future__ import annotations

import asyncio
import re
from functools import partial
from typing import Any

import pytest
from django.db import connections
from django.urls import reverse

from django_pgqueue import (
    EnqueuedJob,
    EnqueueError,
    JobCancelled,
    JobDead,
    WaitTimeout,
    Workflow,
    WorkflowFailed,
    actions,
    await_job,
    batch,
    chain,
    enqueue,
    enqueue_many,
    step,
    wait,
)
from django_pgqueue.models import Batch
from django_pgqueue.testing import run_due_jobs
from django_pgqueue.workflows import cancel_workflow
from tests.multidb.conftest import jobs

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "queues2"])

HANG_GUARD = 60.0
HOME, AWAY = "mail", "q2.work"  # a queue on default, one routed to queues2


def same_ids(make_here: Any, make_there: Any) -> tuple[EnqueuedJob, EnqueuedJob]:
    """A job `make_here()` writes on default and one `make_there()` writes on queues2,
    under the same id: both databases' job sequences are set just past either's highest
    job id first (whatever earlier tests left in them)."""
    past = 1 + max(_last_id("default"), _last_id("queues2"))
    for alias in ("default", "queues2"):
        with connections[alias].cursor() as cursor:
            cursor.execute(
                "SELECT setval(pg_get_serial_sequence('queue_jobs', 'id'), %s, false)", [past]
            )
    here, there = make_here(), make_there()
    assert here.id == there.id, (here.id, there.id)
    return here, there


def _last_id(alias: str) -> int:
    """The highest job id on `alias` (a sequence moved back to just past it gives no id
    a row holds)."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT coalesce(max(id), 0) FROM queue_jobs")
        return int(cursor.fetchone()[0])


def twins(type_: str = "qa.echo") -> tuple[EnqueuedJob, EnqueuedJob]:
    """A job of `type_` on default and one on queues2 with the same id; each payload
    names its database, so that qa.echo's result says which job was read."""
    return same_ids(
        lambda: enqueue(type_, {"database": "default"}, queue=HOME),
        lambda: enqueue(type_, {"database": "queues2"}, queue=AWAY),
    )


def status(alias: str, job_id: int) -> str:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT status FROM queue_job_state WHERE job_id = %s", [job_id])
        (value,) = cursor.fetchone()
    return value


# -- wait and await_job -------------------------------------------------------------------


def test_wait_reads_the_job_on_the_database_its_reference_names() -> None:
    here, there = twins()
    run_due_jobs()
    assert wait(there, timeout=HANG_GUARD) == {"database": "queues2"}
    assert wait(f"queues2:{there.id}", timeout=HANG_GUARD) == {"database": "queues2"}
    assert there.wait(timeout=HANG_GUARD) == {"database": "queues2"}
    # A bare id, or a result id without an alias, is a job of DATABASE.
    assert wait(here.id, timeout=HANG_GUARD) == {"database": "default"}
    assert wait(str(here.id), timeout=HANG_GUARD) == {"database": "default"}
    assert wait(here, timeout=HANG_GUARD) == {"database": "default"}
    # A bare id on another database names it with using=.
    assert wait(there.id, timeout=HANG_GUARD, using="queues2") == {"database": "queues2"}


def test_await_job_reads_the_job_on_the_database_its_reference_names() -> None:
    here, there = twins()
    run_due_jobs()

    async def main() -> list[Any]:
        return [
            await await_job(there, timeout=HANG_GUARD),
            await await_job(f"queues2:{there.id}", timeout=HANG_GUARD),
            await there.wait_async(timeout=HANG_GUARD),
            await await_job(here.id, timeout=HANG_GUARD),
        ]

    assert asyncio.run(main()) == [{"database": "queues2"}] * 3 + [{"database": "default"}]


def test_a_wait_told_another_database_than_its_jobs_is_refused_naming_both() -> None:
    _, there = twins()
    with pytest.raises(ValueError, match=r"on database 'queues2'.*using='default'"):
        wait(there, timeout=0, using="default")
    with pytest.raises(ValueError, match=r"on database 'queues2'.*using='default'"):
        asyncio.run(await_job(f"queues2:{there.id}", timeout=0, using="default"))
    with pytest.raises(TypeError, match=r"takes a job id \(a bigint >= 1\), a result id"):
        wait(1.5, timeout=0)
    with pytest.raises(ValueError, match=r"database 'nowhere' is not one of settings.DATABASES"):
        wait("nowhere:1", timeout=0)


def test_a_job_enqueued_with_using_is_waited_for_where_it_was_written() -> None:
    # q2.work lives on queues2, but using= writes this one on default, where no worker
    # serves q2.work: it stays pending. The queues2 job of the same id completes.
    here, there = same_ids(
        lambda: enqueue("qa.echo", {"database": "default"}, queue=AWAY, using="default"),
        lambda: enqueue("qa.echo", {"database": "queues2"}, queue=AWAY),
    )
    run_due_jobs([AWAY])
    assert (status("default", here.id), status("queues2", there.id)) == ("pending", "completed")
    assert (here.database, there.database) == ("default", "queues2")
    with pytest.raises(WaitTimeout):
        here.wait(timeout=0)
    with pytest.raises(WaitTimeout):
        wait(here, timeout=0)


# -- operator actions ------------------------------------------------------------------


def test_cancel_and_retry_now_act_on_the_jobs_database() -> None:
    here, there = twins("qa.noop")
    report = actions.cancel([there])
    assert report.changed == [there.id]
    assert (status("queues2", there.id), status("default", here.id)) == ("cancelled", "pending")
    with pytest.raises(JobCancelled):
        wait(there, timeout=0)

    assert actions.retry_now([f"queues2:{there.id}"]).changed == [there.id]
    assert status("queues2", there.id) == "pending"
    # A bare id is DATABASE's job, unless alias= names another.
    assert actions.cancel([here.id]).changed == [here.id]
    assert status("queues2", there.id) == "pending"
    assert actions.cancel([there.id], alias="queues2").changed == [there.id]
    assert status("queues2", there.id) == "cancelled"


def test_an_action_given_jobs_of_two_databases_is_refused_and_changes_nothing() -> None:
    here, there = twins("qa.noop")
    with pytest.raises(ValueError, match=r"jobs of several databases \('default', 'queues2'\)"):
        actions.cancel([here, there])
    with pytest.raises(ValueError, match=r"on database 'queues2'.*alias='default'"):
        actions.retry_now([there], alias="default")
    assert (status("default", here.id), status("queues2", there.id)) == ("pending", "pending")


# -- workflows -------------------------------------------------------------------------


def flow(queue: str) -> Any:
    built = Workflow("pair")
    built.add("first", step("qa.fail", queue=queue, max_attempts=1))
    built.add("second", step("qa.echo", {"on": queue}, queue=queue), after=["first"])
    return built.enqueue()


def test_a_workflow_run_names_its_database_to_cancel_and_to_wait() -> None:
    home = flow(HOME)
    away = flow(AWAY)
    assert away.using == "queues2"
    cancel_workflow(away)
    assert {status("queues2", job_id) for job_id in away.jobs.values()} == {"cancelled"}
    assert {status("default", job_id) for job_id in home.jobs.values()} == {"pending", "waiting"}
    # Each step's job, as a reference that carries the workflow's database.
    with pytest.raises(JobCancelled):
        wait(away.job("second"), timeout=0)
    run_due_jobs([HOME])
    with pytest.raises(JobDead):
        wait(home.job("first"), timeout=HANG_GUARD)
    with pytest.raises(KeyError, match="no step 'third'"):
        away.job("third")


def test_a_workflow_runs_result_and_failure_are_read_on_its_database() -> None:
    # A chain on each database, their steps under the same job id: a wait that read the
    # other database would return the other result.
    runs: dict[str, Any] = {}

    def chained(queue: str, database: str) -> Any:
        runs[database] = chain(step("qa.echo", {"database": database}, queue=queue)).enqueue()
        return runs[database].job(next(iter(runs[database].jobs)))

    same_ids(partial(chained, HOME, "default"), partial(chained, AWAY, "queues2"))
    failing = flow(AWAY)
    run_due_jobs([HOME, AWAY])
    assert runs["queues2"].using == "queues2"
    assert runs["queues2"].wait(HANG_GUARD) == {"database": "queues2"}
    assert runs["default"].wait(HANG_GUARD) == {"database": "default"}
    with pytest.raises(WorkflowFailed, match="'first'") as raised:
        failing.wait(HANG_GUARD)
    assert raised.value.job_id == failing.jobs["first"]


# -- batches ---------------------------------------------------------------------------


def nothing_written() -> None:
    assert jobs("default") == []
    assert jobs("queues2") == []
    assert Batch.objects.using("default").count() == 0
    assert Batch.objects.using("queues2").count() == 0


def in_batch(*calls: Any, **options: Any) -> None:
    """Make `calls` inside a batch "b" on default."""
    with batch(name="b", **options):
        for call in calls:
            call()


REFUSED_AWAY = r"queue 'q2\.work' \(database 'queues2'\).*batch 'b' \(database 'default'\)"
REFUSED_USING = r"queue 'mail' \(database 'queues2'\).*batch 'b' \(database 'default'\)"


def test_enqueue_on_commit_to_another_database_inside_a_batch_is_refused() -> None:
    # on_commit would defer the job past the batch's commit: written out of the batch.
    home = partial(enqueue, "qa.noop", queue=HOME)
    away = partial(enqueue, "qa.noop", queue=AWAY, on_commit=True)
    with pytest.raises(EnqueueError, match=REFUSED_AWAY):
        in_batch(home, away, on_finish=step("qa.noop", queue=HOME))
    nothing_written()
    many = partial(enqueue_many, [("qa.noop", None)] * 2, queue=AWAY, on_commit=True)
    with pytest.raises(EnqueueError, match=REFUSED_AWAY):
        in_batch(home, many)
    nothing_written()


def test_a_batch_refuses_a_job_of_another_database_before_writing_it(settings: Any) -> None:
    # Without routes, using= writes where it says; in autocommit there, the job would
    # commit at once, whatever became of the batch.
    settings.PGQUEUE = {**settings.PGQUEUE, "QUEUE_DATABASES": {}}
    with pytest.raises(EnqueueError, match=REFUSED_USING):
        in_batch(partial(enqueue, "qa.noop", queue=HOME, using="queues2"))
    nothing_written()
    many = partial(enqueue_many, [("qa.noop", None)], queue=HOME, using="queues2")
    with pytest.raises(EnqueueError, match=REFUSED_USING):
        in_batch(many)
    nothing_written()


def test_a_batch_on_queues2_gathers_its_jobs_enqueued_on_commit() -> None:
    with batch(name="b", using="queues2") as run:
        made = enqueue("qa.noop", queue=AWAY, on_commit=True)
    assert made is not None  # the batch's transaction is open there: written now
    assert run.jobs == [made.id]


# -- the admin's links -----------------------------------------------------------------


def test_the_jobs_lists_figures_link_to_the_lists_of_the_same_database(
    operator_client: Any,
) -> None:
    enqueue("qa.noop", queue=AWAY)
    listed = operator_client.get(
        reverse("admin:django_pgqueue_job_changelist"), {"database": "queues2"}
    ).content.decode()
    glance = listed.split('id="pgqueue-glance-title"', 1)[1].split("</section>", 1)[0]
    links = re.findall(r'href="([^"]*queue=q2\.work[^"]*)"', glance)
    links += re.findall(r'href="([^"]*)">Dead jobs, newest first', glance)
    assert len(links) == 5, glance  # the queue, its pending, running and dead; all dead
    assert all("database=queues2" in link for link in links), links
