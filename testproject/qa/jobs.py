"""Handlers the test suite and the reliability scenarios run in real worker processes.

`ledger` rows are written on the handler's own autocommit connection to the job's
database, apart from the queue's tables, so executions can be counted independently of
what the queue says.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import struct
import threading
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection

import django_pgqueue
from django_pgqueue import JobContext, PermanentFailure, RetryLater
from django_pgqueue.retry import ExponentialBackoff, FixedDelay

from .ledger import ledger_end, ledger_start
from .models import LedgerEntry

# Set by the test fixtures when a test ends: handlers that hang return, so a worker
# running in the test's process lets go of the jobs it held (see Worker.wait_for_held).
RELEASE = threading.Event()


@django_pgqueue.handler("qa.noop")
def noop(ctx: JobContext) -> None:
    return None


@django_pgqueue.handler("qa.echo")
def echo(ctx: JobContext) -> Any:
    return ctx.payload


@django_pgqueue.handler("qa.sleep")
def sleep(ctx: JobContext) -> None:
    """Sleep payload['seconds'] (in a test's own process: at most until the test ends),
    recording the run in the ledger."""
    entry = ledger_start(ctx)
    deadline = time.monotonic() + float(ctx.payload.get("seconds", 1.0))
    while time.monotonic() < deadline and not RELEASE.is_set():
        time.sleep(0.01)
    ledger_end(entry)


@django_pgqueue.handler("qa.ledger")
def ledger(ctx: JobContext) -> None:
    """Record the run in the ledger, optionally sleeping in between."""
    entry = ledger_start(ctx)
    seconds = float((ctx.payload or {}).get("seconds", 0))
    if seconds:
        time.sleep(seconds)
    ledger_end(entry)


@django_pgqueue.handler("qa.ledger_flaky", max_attempts=25)
def ledger_flaky(ctx: JobContext) -> None:
    """Record the run in the ledger (sleeping payload['seconds'] in between), then ask
    for a retry while the attempt is at most payload['failures']."""
    entry = ledger_start(ctx)
    time.sleep(float(ctx.payload.get("seconds", 0)))
    ledger_end(entry)
    if ctx.attempt <= int(ctx.payload.get("failures", 0)):
        raise RetryLater(0, f"asked to retry (attempt {ctx.attempt})")


@django_pgqueue.handler("qa.offline")
def offline(ctx: JobContext) -> None:
    """Record the start in the ledger, then sleep without touching the database.

    Its end does not depend on the database, so a run that overlaps an outage finishes
    normally and only the queue decides whether it is run again.
    """
    ledger_start(ctx)
    time.sleep(float((ctx.payload or {}).get("seconds", 0)))


@django_pgqueue.handler("qa.nap")
def nap(ctx: JobContext) -> None:
    """Sleep payload['seconds'] (in a test's own process: at most until the test ends)
    and write nothing (the bloat soak's steady load)."""
    RELEASE.wait(float(ctx.payload.get("seconds", 0.02)))


@django_pgqueue.handler("qa.fail", max_attempts=3)
def fail(ctx: JobContext) -> None:
    raise ValueError(f"qa.fail always fails (attempt {ctx.attempt})")


@django_pgqueue.handler("qa.flaky", max_attempts=5)
def flaky(ctx: JobContext) -> str:
    if ctx.attempt <= int(ctx.payload.get("failures", 1)):
        raise ConnectionError(f"flaky dependency down (attempt {ctx.attempt})")
    return "ok"


@django_pgqueue.handler("qa.permanent")
def permanent(ctx: JobContext) -> None:
    raise PermanentFailure("this input can never succeed")


@django_pgqueue.handler("qa.retry_later")
def retry_later(ctx: JobContext) -> None:
    if ctx.attempt == 1:
        raise RetryLater(float(ctx.payload.get("delay", 5)), "asked to come back later")


@django_pgqueue.handler("qa.exit")
def exit_handler(ctx: JobContext) -> None:
    kind = ctx.payload.get("raise", "SystemExit")
    raise {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}[kind]("bye")


@django_pgqueue.handler("qa.kill_process", max_attempts=2)
def kill_process(ctx: JobContext) -> None:
    """A poison job: takes its worker process down with it."""
    os._exit(13)


@django_pgqueue.handler("qa.hang")
def hang(ctx: JobContext) -> None:
    """Never returns on its own (in a test's own process: until the test ends)."""
    RELEASE.wait()


@django_pgqueue.handler("qa.bad_result")
def bad_result(ctx: JobContext) -> Any:
    return {"when": object()}


@django_pgqueue.handler("qa.nul_error")
def nul_error(ctx: JobContext) -> None:
    raise ValueError("bad \x00 byte and a lone surrogate \udc80")


@django_pgqueue.handler("qa.backend_pid", max_attempts=3)
def backend_pid(ctx: JobContext) -> int:
    """The PostgreSQL backend serving this handler thread's Django connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


@django_pgqueue.handler("qa.clock")
def clock(ctx: JobContext) -> float:
    """The wall clock at the handler's first line (for pickup-latency measurements: the
    producer's clock on the same machine; the peers' drivers take theirs the same way)."""
    return time.time()


@django_pgqueue.handler("qa.nul_result")
def nul_result(ctx: JobContext) -> str:
    """A result jsonb refuses: text with a NUL character."""
    return "bad \x00 result"


# -- benchmarks/retry_storm.py ---------------------------------------------------------
# A dependency that is down until payload["down_until"] (a Unix time): every attempt
# before then fails with ConnectionError, and the retry policy decides when the next
# one comes. The policies' parameters come from the environment, so the benchmark can
# size them (seconds): fixed delay, and full-jitter exponential backoff base and cap.


def _storm_call(ctx: JobContext) -> str:
    if time.time() < float(ctx.payload["down_until"]):
        raise ConnectionError(f"dependency down (attempt {ctx.attempt})")
    return "ok"


@django_pgqueue.handler(
    "bench.storm_fixed",
    max_attempts=20,
    retry=FixedDelay(float(os.environ.get("PGQUEUE_BENCH_STORM_FIXED", "10"))),
)
def storm_fixed(ctx: JobContext) -> str:
    """Call the flaky dependency; retry after a fixed delay."""
    return _storm_call(ctx)


@django_pgqueue.handler(
    "bench.storm_jitter",
    max_attempts=20,
    retry=ExponentialBackoff(
        base=float(os.environ.get("PGQUEUE_BENCH_STORM_BASE", "60")),
        cap=float(os.environ.get("PGQUEUE_BENCH_STORM_CAP", "3600")),
    ),
)
def storm_jitter(ctx: JobContext) -> str:
    """Call the flaky dependency; retry with full-jitter exponential backoff."""
    return _storm_call(ctx)


# -- tests/reliability ------------------------------------------------------------------


def _active_sleep(seconds: float) -> None:
    """Sleep `seconds` of time this process was running: a stretch frozen by SIGSTOP
    does not count, so a resumed handler still has work left when it comes back."""
    active = 0.0
    last = time.monotonic()
    while active < seconds:
        time.sleep(0.01)
        now = time.monotonic()
        active += min(now - last, 0.05)
        last = now


@django_pgqueue.handler("qa.stale", max_attempts=5, retry=FixedDelay(0.05))
def stale(ctx: JobContext) -> None:
    """The stale-writer scenario's job: the first attempt works payload['seconds'] of
    unfrozen time, then fails if payload['fail']; later attempts succeed quickly."""
    entry = ledger_start(ctx)
    first = ctx.attempt == 1
    _active_sleep(float(ctx.payload.get("seconds", 1.0)) if first else 0.1)
    ledger_end(entry)
    if first and ctx.payload.get("fail"):
        raise RuntimeError("qa.stale fails its first attempt")


@django_pgqueue.handler("qa.hang_retry", max_attempts=2, retry=FixedDelay(0.05))
def hang_retry(ctx: JobContext) -> None:
    """Never returns (blocked in C, where the timeout's exception cannot reach it; in a
    test's own process: until the test ends)."""
    ledger_start(ctx)
    RELEASE.wait()


@django_pgqueue.handler("qa.spin")
def spin(ctx: JobContext) -> None:
    """Keep the CPU busy in Python for payload['seconds'], recording the run in the ledger."""
    entry = ledger_start(ctx)
    deadline = time.monotonic() + float(ctx.payload.get("seconds", 1.0))
    while time.monotonic() < deadline:
        sum(range(1000))
    ledger_end(entry)


# -- tests/reliability/test_invariant.py -------------------------------------------------
# One handler for every way a handler can end. It writes the ledger first, so the
# harness sees each execution; payload["do"] says how it ends.


class QaBaseException(BaseException):
    """A BaseException subclass no one catches by name."""


def _recurse(depth: int) -> int:
    return _recurse(depth + 1) + 1


@django_pgqueue.handler("qa.outcome", max_attempts=2, retry=FixedDelay(0.05))
def outcome(ctx: JobContext) -> Any:
    ledger_start(ctx)
    do = ctx.payload["do"] if isinstance(ctx.payload, dict) else "nested"
    if do == "return":
        return {"ok": ctx.job_id}
    if do == "backslash":
        return r"C:\u0000dir"  # a backslash, a 'u' and four digits: no NUL anywhere
    if do == "raise":
        raise ValueError("qa.outcome raised")
    if do in ("SystemExit", "KeyboardInterrupt", "GeneratorExit"):
        raise {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}.get(
            do, GeneratorExit
        )("qa.outcome")
    if do == "base_exception":
        raise QaBaseException("qa.outcome")
    if do == "recursion":
        return _recurse(0)
    if do == "memory":
        raise MemoryError("qa.outcome")
    if do == "hang":
        RELEASE.wait(float(ctx.payload.get("seconds", 30)))
        return None
    if do == "unstorable":
        return {"nan": float("nan")}
    if do == "nul":
        return "nul \x00 result"
    raise AssertionError(f"unknown outcome {do!r}")


# -- queue control (issue 14) ------------------------------------------------------------


@django_pgqueue.handler("qa.snooze")
def snooze(ctx: JobContext) -> str:
    """Snooze payload['seconds'] until the job was snoozed payload['times'] times."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM queue_attempts WHERE job_id = %s AND status = 'snoozed'",
            [ctx.job_id],
        )
        snoozed = cursor.fetchone()[0]
    if snoozed < int(ctx.payload.get("times", 1)):
        raise django_pgqueue.Snooze(float(ctx.payload.get("seconds", 0.1)), "not yet")
    return f"ran after {snoozed} snooze(s)"


@django_pgqueue.handler("qa.cancellable")
def cancellable(ctx: JobContext) -> str:
    """Work in small steps until an operator cancels the job (or payload['seconds'] pass)."""
    deadline = time.monotonic() + float(ctx.payload.get("seconds", 30))
    while time.monotonic() < deadline:
        if ctx.cancel_requested():
            return "stopped on request"
        time.sleep(0.02)
    return "ran to the end"


@django_pgqueue.handler("qa.report")
def report(ctx: JobContext) -> dict[str, Any]:
    """A scheduled report: the tick it is for, its attempt and its payload."""
    tick = ctx.scheduled_for
    if ctx.lease_lost() or ctx.cancel_requested():
        return {"stopped": True}
    return {
        "day": None if tick is None else tick.date().isoformat(),
        "attempt": ctx.attempt,
        "payload": ctx.payload,
    }


@django_pgqueue.handler("qa.keys")
def keys(ctx: JobContext) -> Any:
    """Return the job's idempotency key and the queue database its context names."""
    return {"key": ctx.idempotency_key, "database": ctx.database}


@django_pgqueue.handler("qa.parents")
def parents(ctx: JobContext) -> Any:
    """A workflow step: return its payload and the stored results of the steps it waited for."""
    return {"payload": ctx.payload, "parents": ctx.parent_results}


@django_pgqueue.handler("qa.parents_fail", max_attempts=1)
def parents_fail(ctx: JobContext) -> None:
    """A workflow step that dies at once (one attempt)."""
    raise ValueError(f"step {ctx.payload!r} fails")


# -- async handlers: run on the worker's event loop ---------------------------------------


@django_pgqueue.handler("qa.aoutcome", max_attempts=2, retry=FixedDelay(0.05))
async def aoutcome(ctx: JobContext) -> Any:
    """An async handler; payload["do"] says how it ends. The ledger row is written
    through sync_to_async (Django's thread for thread-sensitive calls)."""
    await sync_to_async(ledger_start)(ctx)
    do = ctx.payload["do"]
    seconds = float(ctx.payload.get("seconds", 30))
    if do == "return":
        await asyncio.sleep(float(ctx.payload.get("seconds", 0)))
        return {"ok": ctx.job_id}
    if do == "raise":
        raise ValueError("qa.aoutcome raised")
    if do == "permanent":
        raise PermanentFailure("qa.aoutcome gave up")
    if do == "retry_later":
        raise RetryLater(0.2, "qa.aoutcome later")
    if do == "snooze":
        raise django_pgqueue.Snooze(0.2, "qa.aoutcome snoozed")
    if do == "hang":
        await asyncio.sleep(seconds)
        return None
    if do == "swallow":  # ignores its cancellation and goes on (until RELEASE)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not RELEASE.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue
        return "swallowed"
    if do == "swallow_return":  # ignores its cancellation and returns at once
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            return "swallowed"
        return None
    if do == "block":  # a sync call that blocks the loop
        time.sleep(seconds)
        return None
    if do == "orm":  # Django's async ORM, then sync code through sync_to_async
        count = await LedgerEntry.objects.filter(job_id=ctx.job_id).acount()
        await asyncio.sleep(float(ctx.payload.get("pause", 0)))
        total = await sync_to_async(lambda: LedgerEntry.objects.filter(job_id=ctx.job_id).count())()
        return {"async": count, "sync": total}
    raise AssertionError(f"unknown outcome {do!r}")


@django_pgqueue.handler("qa.asleep")
async def asleep(ctx: JobContext) -> None:
    """Await payload['seconds'] of I/O, recording the run in the ledger."""
    entry = await sync_to_async(ledger_start)(ctx)
    await asyncio.sleep(float(ctx.payload.get("seconds", 1.0)))
    await sync_to_async(ledger_end)(entry)


# -- the async I/O benchmark (benchmarks/async_io.py): one round trip to a local server
# that answers after its delay ------------------------------------------------------------


@django_pgqueue.handler("bench.async_io", max_attempts=3)
async def async_io(ctx: JobContext) -> int:
    """Send a line to the local delay server and await its answer (or, without a
    port, await asyncio.sleep of payload["delay"])."""
    if "port" not in ctx.payload:
        await asyncio.sleep(float(ctx.payload["delay"]))
        return 0
    reader, writer = await asyncio.open_connection("127.0.0.1", int(ctx.payload["port"]))
    try:
        writer.write(b"%d\n" % ctx.job_id)
        await writer.drain()
        answer = await reader.readline()
    finally:
        writer.close()
    return len(answer)


@django_pgqueue.handler("bench.sync_io", max_attempts=3)
def sync_io(ctx: JobContext) -> int:
    """The same round trip on a handler thread, with a blocking socket (or time.sleep)."""
    if "port" not in ctx.payload:
        time.sleep(float(ctx.payload["delay"]))
        return 0
    with socket.create_connection(("127.0.0.1", int(ctx.payload["port"]))) as sock:
        sock.sendall(b"%d\n" % ctx.job_id)
        answer = sock.makefile("rb").readline()
    return len(answer)


# -- batches ------------------------------------------------------------------------------


@django_pgqueue.handler("qa.batch_counts")
def batch_counts(ctx: JobContext) -> Any:
    """A batch callback: return its payload and the batch's counts as ctx.batch reads them."""
    return {"payload": ctx.payload, "batch": ctx.batch.as_dict()}


@django_pgqueue.handler("qa.batch_flaky", max_attempts=3, retry=FixedDelay(0.05))
def batch_flaky(ctx: JobContext) -> str:
    """A batch member that fails its first attempt, then succeeds."""
    if ctx.attempt == 1:
        raise ValueError("first attempt fails")
    return "ok"


# -- the sustained-load benchmark (benchmarks/sustained.py): 1 ms jobs that report when
# they started ---------------------------------------------------------------------------


@functools.cache
def _starts() -> socket.socket:
    """The datagram socket the handler reports on, made at its first report: a module
    that opens a socket on import gives one to every process that loads the handlers
    (a --processes supervisor holds none)."""
    return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)


@django_pgqueue.handler("bench.sustained")
def sustained(ctx: JobContext) -> None:
    """Sleep 1 ms; with payload["port"], send (payload["t"], this start) as a datagram.

    Both times are time.time() of the same machine: the producer's just before its
    enqueue call, the handler's first line here.
    """
    started = time.time()
    payload = ctx.payload or {}
    time.sleep(0.001)
    if "port" in payload:
        _starts().sendto(struct.pack("!dd", payload["t"], started), ("127.0.0.1", payload["port"]))


# -- tests/integration/test_hold_and_capacity.py: which handlers execute when, in this
# process ---------------------------------------------------------------------------------


class Executions:
    """The handlers of this process executing now, by kind ("sync", "async"), the most
    at once, and each execution's (start, end) in time.monotonic(), by job id; with
    `runs` each execution's worker, kind, queue and concurrency key (payload["key"])."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.now: dict[str, int] = {"sync": 0, "async": 0}
            self.most: dict[str, int] = {"sync": 0, "async": 0}
            self.spans: dict[int, list[list[float | None]]] = {}
            self.runs: list[tuple[int, str, str, str, str | None, list[float | None]]] = []

    def enter(self, kind: str, ctx: JobContext) -> list[float | None]:
        span: list[float | None] = [time.monotonic(), None]
        key = ctx.payload.get("key") if isinstance(ctx.payload, dict) else None
        with self._lock:
            self.now[kind] += 1
            self.most[kind] = max(self.most[kind], self.now[kind])
            self.spans.setdefault(ctx.job_id, []).append(span)
            self.runs.append((ctx.job_id, ctx.worker_id, kind, ctx.queue, key, span))
        return span

    def exit(self, kind: str, span: list[float | None]) -> None:
        """Record the end of `span`, once however often it is called. Its body under the
        lock calls no Python code: an exception raised into the thread (a timeout)
        lands before it or after it, never between the count and the end."""
        end = time.monotonic()
        with self._lock:
            if span[1] is None:
                self.now[kind] -= 1
                span[1] = end

    def running(self, job_id: int) -> set[int]:
        """The executions of `job_id` not ended yet, by their place in its spans."""
        with self._lock:
            return {n for n, (_, end) in enumerate(self.spans.get(job_id, ())) if end is None}

    def started(self, job_id: int) -> bool:
        with self._lock:
            return bool(self.spans.get(job_id))

    def snapshot(self) -> list[tuple[int, str, str, str, str | None, float, float | None]]:
        """Every execution so far: (job, worker, kind, queue, key, start, end or None)."""
        with self._lock:
            return [(*run[:5], run[5][0], run[5][1]) for run in self.runs]  # type: ignore[misc]


EXECUTIONS = Executions()


def _span_seconds(ctx: JobContext) -> float:
    """payload["seconds"] on the first attempt, payload["later"] (default 0) after."""
    key = "seconds" if ctx.attempt == 1 else "later"
    return float(ctx.payload.get(key, 0))


@django_pgqueue.handler("qa.span", max_attempts=3, retry=FixedDelay(0.05))
def span(ctx: JobContext) -> int:
    """Execute for `_span_seconds`, recorded in EXECUTIONS: in one time.sleep call when
    payload["c"] (a call in C, which a timeout's exception reaches only once it returns),
    else in short sleeps."""
    entry = EXECUTIONS.enter("sync", ctx)
    try:
        seconds = _span_seconds(ctx)
        if ctx.payload.get("c"):
            time.sleep(seconds)
        else:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(0.01)
        return ctx.job_id
    finally:
        # A timeout raised into this thread (JobTimeout, at the next bytecode) may land
        # in this block: the end is recorded whatever lands, and what landed goes on.
        landed: BaseException | None = None
        while entry[1] is None:
            try:
                EXECUTIONS.exit("sync", entry)
            except BaseException as exc:
                landed = exc
        if landed is not None:
            raise landed


@django_pgqueue.handler("qa.aspan", max_attempts=3, retry=FixedDelay(0.05))
async def aspan(ctx: JobContext) -> int:
    """The async `span`: awaits `_span_seconds`, or with payload["block"] holds the
    event loop that long in a sync call; payload["swallow"] ignores cancellations."""
    entry = EXECUTIONS.enter("async", ctx)
    try:
        seconds = _span_seconds(ctx)
        if ctx.payload.get("block"):
            time.sleep(seconds)
        elif ctx.payload.get("swallow"):
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                try:
                    await asyncio.sleep(0.02)
                except asyncio.CancelledError:
                    continue
        else:
            await asyncio.sleep(seconds)
        return ctx.job_id
    finally:
        EXECUTIONS.exit("async", entry)


# The durable handlers register with this module's import (autodiscovery imports it).
from . import durable_jobs  # noqa: E402, F401

# Handlers with time limits: registered only in worker processes started with
# PGQUEUE_TEST_TIME_LIMITS set (a hard limit puts every worker under a supervisor).
if os.environ.get("PGQUEUE_TEST_TIME_LIMITS"):
    from . import limited_jobs  # noqa: F401
