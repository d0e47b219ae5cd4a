"""Enqueue from async code: aenqueue, aenqueue_many, Workflow/canvas .aenqueue, abatch and a
task's aenqueue write on the caller's connection, so inside ``async with aatomic():``
the jobs exist only if that block commits, with the ORM's awaited writes."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from asgiref.sync import async_to_sync
from django.db.transaction import TransactionManagementError
from django.test import AsyncClient
from django.urls import reverse
from qa.models import TaskCall
from qa.tasks import add
from shop.models import Product

import django_pgqueue
from django_pgqueue import (
    EnqueueError,
    JobSpec,
    Workflow,
    aatomic,
    abatch,
    aenqueue,
    aenqueue_many,
    chain,
    step,
)
from django_pgqueue.models import Job, JobState
from django_pgqueue.store.connection import connection_params
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)


class Refused(Exception):
    """What the code in a block raises after it enqueued: the block rolls back."""


def run(coroutine_function, *args, **kwargs):
    """Run async code as Django runs an async view under a sync caller: its
    thread-sensitive calls on this thread, which holds the test's connection."""
    return async_to_sync(coroutine_function)(*args, **kwargs)


def seen_elsewhere(job_id: int) -> bool:
    """Whether another connection sees job `job_id` (committed) now."""
    with psycopg.connect(**connection_params("default", "elsewhere"), autocommit=True) as other:
        return (
            other.execute("SELECT 1 FROM queue_jobs WHERE id = %s", [job_id]).fetchone() is not None
        )


def test_aenqueue_outside_a_block_commits_at_once():
    async def view() -> django_pgqueue.EnqueuedJob:
        return await aenqueue("qa.noop", {"n": 1}, queue="async-one", priority=5)

    job = run(view)
    assert (job.queue, job.type, job.created, job.database) == (
        "async-one",
        "qa.noop",
        True,
        "default",
    )
    assert seen_elsewhere(job.id)
    assert JobState.objects.get(pk=job.id).priority == 5


def test_aenqueue_in_aatomic_exists_only_once_the_block_commits():
    looked: list[bool] = []

    async def view() -> tuple[int, int]:
        async with aatomic():
            task_call = await TaskCall.objects.acreate(label="with its job")
            job = await aenqueue("qa.noop", {"call": task_call.pk}, queue="async-block")
            looked.append(await asyncio.to_thread(seen_elsewhere, job.id))
        return task_call.pk, job.id

    call_id, job_id = run(view)
    assert looked == [False]  # not before the commit
    assert seen_elsewhere(job_id)
    assert Job.objects.get(pk=job_id).payload == {"call": call_id}


def test_a_block_that_raises_takes_its_jobs_and_writes_with_it():
    written: list[int] = []

    async def view() -> None:
        async with aatomic():
            await TaskCall.objects.acreate(label="rolled back")
            written.append((await aenqueue("qa.noop", queue="async-rollback")).id)
            many = await aenqueue_many(
                [("qa.noop", {"n": n}) for n in range(3)], queue="async-rollback"
            )
            written.extend(job.id for job in many)
            raise Refused("after enqueueing")

    with pytest.raises(Refused):
        run(view)
    assert len(written) == 4
    assert not Job.objects.filter(pk__in=written).exists()
    assert not TaskCall.objects.filter(label="rolled back").exists()


def test_nested_blocks_roll_back_to_their_savepoint():
    async def view() -> tuple[int, int]:
        async with aatomic():
            kept = await aenqueue("qa.noop", queue="async-nested")
            try:
                async with aatomic():
                    dropped = await aenqueue("qa.noop", queue="async-nested")
                    raise Refused("the inner block only")
            except Refused:
                pass
        return kept.id, dropped.id

    kept, dropped = run(view)
    assert list(Job.objects.filter(queue="async-nested").values_list("id", flat=True)) == [kept]
    assert dropped != kept


def test_a_block_is_entered_once():
    async def view() -> None:
        block = aatomic()
        async with block, block:
            pass

    with pytest.raises(TransactionManagementError, match="entered once"):
        run(view)


def test_aenqueue_many_reads_an_async_iterable_and_validates_all_first():
    async def specs():
        for n in range(3):
            yield JobSpec("qa.noop", {"n": n}, queue="async-many")

    async def view() -> list[django_pgqueue.EnqueuedJob]:
        return await aenqueue_many(specs(), priority=7)

    jobs = run(view)
    assert [Job.objects.get(pk=job.id).payload for job in jobs] == [{"n": 0}, {"n": 1}, {"n": 2}]

    async def bad() -> None:
        await aenqueue_many([("qa.noop", {}), ("qa.noop", {"s": {1}})], queue="async-bad")

    with pytest.raises(django_pgqueue.PayloadError, match="item 1"):
        run(bad)
    assert not Job.objects.filter(queue="async-bad").exists()


def test_a_workflow_and_a_canvas_aenqueue_in_the_block():
    async def view(fail: bool) -> tuple[django_pgqueue.workflows.WorkflowRun, ...]:
        async with aatomic():
            flow = Workflow("async-flow")
            flow.add("a", "qa.noop", queue="async-flow")
            flow.add("b", "qa.noop", queue="async-flow", after=["a"])
            run_a = await flow.aenqueue()
            run_b = await chain(
                step("qa.noop", queue="async-flow"), step("qa.noop", queue="async-flow")
            ).aenqueue(name="async-chain")
            if fail:
                raise Refused("after the workflows")
        return run_a, run_b

    with pytest.raises(Refused):
        run(view, True)
    assert not Job.objects.filter(queue="async-flow").exists()
    run_a, run_b = run(view, False)
    statuses = dict(JobState.objects.filter(queue="async-flow").values_list("job_id", "status"))
    assert statuses[run_a.jobs["a"]] == "pending"
    assert statuses[run_a.jobs["b"]] == "waiting"
    assert sorted(statuses[job_id] for job_id in run_b.jobs.values()) == ["pending", "waiting"]
    names = sql("SELECT name FROM queue_workflows WHERE id IN (%s, %s)", [run_a.id, run_b.id])
    assert sorted(name for (name,) in names) == ["async-chain", "async-flow"]


def test_abatch_gathers_what_is_enqueued_in_its_block(run_worker):
    async def view(fail: bool) -> django_pgqueue.workflows.BatchRun:
        async with abatch(
            name="async-batch", on_finish=step("qa.batch_counts", queue="async-batch")
        ) as run_:
            await aenqueue("qa.noop", queue="async-batch")
            await aenqueue_many([("qa.noop", {}), ("qa.noop", {})], queue="async-batch")
            await add.using(queue_name="qa-tasks").aenqueue(1, 2)  # a task's aenqueue joins too
            if fail:
                raise Refused("the batch is not written")
        return run_

    with pytest.raises(Refused):
        run(view, True)
    assert not Job.objects.filter(queue__in=["async-batch", "qa-tasks"]).exists()

    batch = run(view, False)
    assert len(batch.jobs) == 4
    assert list(batch.callbacks) == ["on_finish"]
    run_worker(["async-batch", "qa-tasks"], burst=True).join()
    status = batch.status()
    assert (status.size, status.completed, status.state) == (4, 4, "succeeded")
    assert status.callbacks["on_finish"][1] == "completed"


def test_a_call_that_escaped_the_blocks_thread_is_refused_before_it_writes():
    escaped: list[BaseException] = []

    async def elsewhere() -> None:
        try:
            await aenqueue("qa.noop", queue="async-escaped")
        except EnqueueError as exc:
            escaped.append(exc)

    async def view() -> None:
        async with aatomic():
            # Another event loop in another thread, this context copied into it: its
            # thread-sensitive calls run on asgiref's own thread, not on this block's.
            await asyncio.to_thread(asyncio.run, elsewhere())

    run(view)
    [error] = escaped
    assert "another thread than the aatomic() block" in str(error)
    assert not Job.objects.filter(queue="async-escaped").exists()


# -- an async view of the shop, served by Django's AsyncClient ---------------------------


@pytest.fixture
def lamp() -> Product:
    return Product.objects.create(sku="LAMP", name="Desk lamp", price_cents=2_500, stock=3)


def adjust(sku: str, change: str):
    url = reverse("shop:adjust-stock", args=[sku])
    return async_to_sync(AsyncClient().post)(url, {"change": change})


def sync_jobs() -> list[tuple[int, dict]]:
    return list(Job.objects.filter(type="shop.sync_stock").values_list("id", "payload"))


def test_an_async_view_commits_its_update_and_its_job_together(lamp, run_worker):
    response = adjust("LAMP", "+5")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["sku"], body["stock"]) == ("LAMP", 8)
    assert sync_jobs() == [(body["sync_job"], {"sku": "LAMP"})]
    assert JobState.objects.get(pk=body["sync_job"]).queue == "warehouse"

    run_worker(["warehouse"], burst=True).join()
    assert django_pgqueue.wait(body["sync_job"], timeout=10) == {"sku": "LAMP", "stock": 8}


def test_an_async_view_that_fails_after_aenqueue_leaves_no_job(lamp):
    response = adjust("LAMP", "-4")  # below zero: the CHECK refuses the update
    assert response.status_code == 409
    assert sync_jobs() == []
    lamp.refresh_from_db()
    assert lamp.stock == 3

    assert adjust("NOPE", "1").status_code == 404  # Http404 raised inside the block
    assert sync_jobs() == []
    assert adjust("LAMP", "many").status_code == 400


# A CSRF secret, sent as the cookie and as the form's token (the page would carry both).
CSRF = "a" * 32


def asgi_post(path: str, body: bytes) -> tuple[int, bytes]:
    """POST a form through Django's ASGI handler, as an ASGI server serves it: each
    request gets its own thread for thread-sensitive calls (ThreadSensitiveContext)."""
    from django.core.asgi import get_asgi_application

    application = get_asgi_application()
    body += f"&csrfmiddlewaretoken={CSRF}".encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"content-type", b"application/x-www-form-urlencoded"),
            (b"content-length", str(len(body)).encode()),
            (b"cookie", f"csrftoken={CSRF}".encode()),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    sent: list[dict] = []
    received = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict:
        if received:
            return received.pop(0)
        await asyncio.Event().wait()  # the client stays: Django cancels this wait
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    async_to_sync(application)(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_the_async_view_under_an_asgi_server_commits_or_rolls_back_with_its_job(lamp):
    path = reverse("shop:adjust-stock", args=["LAMP"])
    status, _ = asgi_post(path, b"change=-9")
    assert status == 409
    assert sync_jobs() == []
    status, content = asgi_post(path, b"change=2")
    assert status == 200, content
    assert [payload for _, payload in sync_jobs()] == [{"sku": "LAMP"}]
    lamp.refresh_from_db()
    assert lamp.stock == 5
