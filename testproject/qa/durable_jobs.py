"""Durable handlers the tests run in real workers (imported by `qa.jobs`).

Each step's function writes a `DurableCall` row committed at once (its own autocommit
statement outside the step's transaction), so re-executions are counted whatever the
queue recorded; an atomic step writes a `DurableEffect`, unique per (job, step).
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.test.utils import CaptureQueriesContext

import django_pgqueue
from django_pgqueue import EventTimeout, JobContext

from .models import DurableCall, DurableEffect


def _call(ctx: JobContext, step: str, hold: str | None = None, work: float = 0.0) -> str:
    """A step's function: count the call, then (first attempt, `hold` a path) wait until
    that file exists, then work (sleep) `work` seconds; the step's result is its name."""
    DurableCall.objects.using(ctx.database or DEFAULT_DB_ALIAS).create(
        job_id=ctx.job_id, step=step, lease_version=ctx.lease_version
    )
    _hold(ctx, hold)
    time.sleep(work)
    return step


def _effect(ctx: JobContext, step: str, hold: str | None = None) -> int:
    """An atomic step's function: its database effect, then (first attempt, `hold` a
    path) wait, the transaction open, until that file exists."""
    effect = DurableEffect.objects.using(ctx.database or DEFAULT_DB_ALIAS).create(
        job_id=ctx.job_id, step=step, lease_version=ctx.lease_version
    )
    _hold(ctx, hold)
    return effect.pk


def _hold(ctx: JobContext, path: str | None) -> None:
    if path and ctx.lease_version == 1:
        deadline = time.monotonic() + 120
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.02)


def _noop(i: int) -> int:
    return i


def _db_clock(ctx: JobContext) -> str:
    with connections[ctx.database or DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0].isoformat()


@django_pgqueue.handler("qa.durable_steps", max_attempts=5)
def durable_steps(ctx: JobContext) -> list[Any]:
    """payload: steps (count), hold_at (a step's index) and hold (a path): that step's
    function waits on its first attempt; fail_first: the first attempt fails after its
    steps."""
    payload = ctx.payload
    hold_at = payload.get("hold_at")
    results = [
        ctx.step(f"s{i}", _call, ctx, f"s{i}", payload.get("hold") if i == hold_at else None)
        for i in range(payload.get("steps", 3))
    ]
    if payload.get("fail_first") and ctx.attempt == 1:
        raise ValueError("the first attempt fails after its steps")
    return results


@django_pgqueue.handler("qa.durable_fails_at", max_attempts=1)
def durable_fails_at(ctx: JobContext) -> list[Any]:
    """Steps s1 to s5 (payload steps: how many); step payload["fail_at"] raises on the
    job's first lease (its first attempt), so the job dies there until it is retried."""
    fail_at = ctx.payload.get("fail_at")
    return [
        ctx.step(f"s{i}", _fail_first if i == fail_at else _call, ctx, f"s{i}")
        for i in range(1, ctx.payload.get("steps", 5) + 1)
    ]


def _fail_first(ctx: JobContext, step: str) -> str:
    _call(ctx, step)
    if ctx.lease_version == 1:
        raise RuntimeError(f"{step} fails on the job's first attempt")
    return step


@django_pgqueue.handler("qa.durable_atomic", max_attempts=5)
def durable_atomic(ctx: JobContext) -> list[Any]:
    """Two atomic steps around a plain one; payload hold (a path): the first atomic
    step's transaction waits, open, on the first attempt until that file exists."""
    first = ctx.atomic_step("a1", _effect, ctx, "a1", ctx.payload.get("hold"))
    middle = ctx.step("s", _call, ctx, "s")
    second = ctx.atomic_step("a2", _effect, ctx, "a2")
    return [first, middle, second]


@django_pgqueue.handler("qa.durable_sleep", max_attempts=3)
def durable_sleep(ctx: JobContext) -> dict[str, Any]:
    """A step, a durable sleep of payload seconds, then a step that reads the database's
    clock (checked against the sleep's wake-up)."""
    ctx.step("before", _call, ctx, "before")
    ctx.sleep("nap", ctx.payload["seconds"])
    woke = ctx.step("after", _db_clock, ctx)
    return {"woke": woke}


@django_pgqueue.handler("qa.durable_event", max_attempts=3)
def durable_event(ctx: JobContext) -> Any:
    """A step, then the payload of event payload["key"] (payload["timeout"] seconds at
    most: then "timed out"), then a step counting the handler's runs past the wait."""
    ctx.step("before", _call, ctx, "before")
    try:
        got = ctx.wait_for_event(ctx.payload["key"], timeout=ctx.payload.get("timeout"))
    except EventTimeout:
        got = "timed out"
    ctx.step("after", _call, ctx, "after")
    return got


@django_pgqueue.handler("qa.durable_complete", max_attempts=3)
def durable_complete(ctx: JobContext) -> Any:
    """Its effect and the job's completion in one transaction."""
    return ctx.complete_atomically(_effect, ctx, "done")


async def _acall(ctx: JobContext, step: str) -> str:
    await DurableCall.objects.acreate(job_id=ctx.job_id, step=step, lease_version=ctx.lease_version)
    return step


@django_pgqueue.handler("qa.adurable", max_attempts=3)
async def adurable(ctx: JobContext) -> list[Any]:
    """The async spellings: an async step, an atomic step, a sleep, an event wait."""
    first = await ctx.astep("a", _acall, ctx, "a")
    second = await ctx.aatomic_step("b", _effect, ctx, "b")
    await ctx.asleep("nap", 0.2)
    got = await ctx.await_event(ctx.payload["key"])
    return [first, second, got]


@django_pgqueue.handler("qa.durable_five", max_attempts=20)
def durable_five(ctx: JobContext) -> Any:
    """Five steps: an atomic step, a sleep, a step (its call's time checked against the
    sleep's wake-up; it works payload["work"] seconds), a wait for event payload["key"]
    (payload["timeout"] at most), an atomic step."""
    ctx.atomic_step("a1", _effect, ctx, "a1")
    ctx.sleep("nap", ctx.payload.get("nap", 0.5))
    ctx.step("after-nap", _call, ctx, "after-nap", None, ctx.payload.get("work", 0.0))
    try:
        got = ctx.wait_for_event(ctx.payload["key"], timeout=ctx.payload["timeout"])
    except EventTimeout:
        got = "timed out"
    ctx.atomic_step("a2", _effect, ctx, "a2")
    return got


@django_pgqueue.handler("qa.adurable_complete", max_attempts=3)
async def adurable_complete(ctx: JobContext) -> Any:
    """The async spelling of the job's completion with its effect."""
    return await ctx.acomplete_atomically(_effect, ctx, "done")


@django_pgqueue.handler("qa.durable_counted", max_attempts=3)
def durable_counted(ctx: JobContext) -> dict[str, Any]:
    """payload steps: that many no-op steps, the statements each sent on the handler's
    connection counted; fail_first: the first attempt fails after its steps. Returns
    the count per step and the first line of every statement the steps sent (the
    package's statements start with their name, "-- name: ...")."""
    connection = connections[ctx.database or DEFAULT_DB_ALIAS]
    per_step = []
    with CaptureQueriesContext(connection) as queries:
        for i in range(ctx.payload["steps"]):
            before = len(queries)
            ctx.step(f"s{i}", _noop, i)
            per_step.append(len(queries) - before)
    if ctx.payload.get("fail_first") and ctx.attempt == 1:
        raise ValueError("the first attempt fails after its steps")
    return {"per_step": per_step, "statements": [q["sql"].splitlines()[0] for q in queries]}


# benchmarks/durable.py's runs: the same shapes as its peers' (benchmarks/peers/).


@django_pgqueue.handler("bench.durable_five", max_attempts=3)
def bench_durable_five(ctx: JobContext) -> int:
    """A run of five no-op steps."""
    return sum(ctx.step(f"s{i}", _noop, i) for i in range(5))


def _resume_mark(ready: str) -> float:
    """The killed run's third step: the first time, say so and hang until SIGKILL;
    resumed, the wall time it started again."""
    if not os.path.exists(ready):
        with open(ready, "w") as f:
            f.write("ready")
        time.sleep(3600)
    return time.time()


@django_pgqueue.handler("bench.durable_resumable", max_attempts=3)
def bench_durable_resumable(ctx: JobContext) -> float:
    """Five steps, the third hanging on the first run (payload ready: its marker file)."""
    ctx.step("s0", _noop, 0)
    ctx.step("s1", _noop, 1)
    resumed = ctx.step("s2", _resume_mark, ctx.payload["ready"])
    ctx.step("s3", _noop, 3)
    ctx.step("s4", _noop, 4)
    return resumed


@django_pgqueue.handler("bench.durable_overhead", max_attempts=1)
def bench_durable_overhead(ctx: JobContext) -> dict[str, float]:
    """payload n: µs per no-op step, per plain call of the same function, and per bare
    INSERT of a checkpoint's row (no lease fence, its own autocommit transaction: the
    floor a step's write is held to), steps and INSERTs alternating."""
    n = ctx.payload["n"]
    started = time.perf_counter()
    for i in range(n):
        _noop(i)
    call = time.perf_counter() - started
    step = bare = 0.0
    with connections[ctx.database or DEFAULT_DB_ALIAS].cursor() as cursor:
        for i in range(n):
            started = time.perf_counter()
            ctx.step(f"s{i}", _noop, i)
            step += time.perf_counter() - started
            started = time.perf_counter()
            cursor.execute(
                "INSERT INTO queue_job_steps (job_id, name, kind, result) "
                "VALUES (%s, %s, 'step', %s::jsonb)",
                [ctx.job_id, f"bare{i}", str(i)],
            )
            bare += time.perf_counter() - started
    return {"step_us": step / n * 1e6, "plain_us": call / n * 1e6, "bare_insert_us": bare / n * 1e6}
