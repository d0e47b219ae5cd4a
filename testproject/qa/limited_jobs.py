"""Handlers with time limits, and one that leaks memory, for the worker processes of
tests/acceptance/test_time_limits.py and test_recycling.py.

Imported by `qa.jobs` only when PGQUEUE_TEST_TIME_LIMITS is set: a handler with a hard
time limit puts every run_queue_worker under a supervisor.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from asgiref.sync import sync_to_async

import django_pgqueue
from django_pgqueue import JobContext, SoftTimeLimitExceeded
from django_pgqueue.retry import FixedDelay

from .ledger import ledger_end, ledger_start

MIB = 1024 * 1024
# What qa.leak allocated, kept for the life of the process.
LEAKED: list[bytes] = []


@django_pgqueue.handler("qa.limit_sleep", time_limit=2, max_attempts=2, retry=FixedDelay(0.05))
def limit_sleep(ctx: JobContext) -> None:
    """Blocked in one C call for a minute: only the end of its process stops it."""
    ledger_start(ctx)
    time.sleep(60)


@django_pgqueue.handler("qa.limit_sleep_long", time_limit=10, max_attempts=2)
def limit_sleep_long(ctx: JobContext) -> None:
    """Like qa.limit_sleep, with room before its limit for an operator's stop to arrive."""
    ledger_start(ctx)
    time.sleep(60)


@django_pgqueue.handler("qa.limit_spin", time_limit=2, max_attempts=2, retry=FixedDelay(0.05))
def limit_spin(ctx: JobContext) -> None:
    """An endless loop in Python."""
    ledger_start(ctx)
    while True:
        sum(range(1000))


@django_pgqueue.handler("qa.soft_limit", soft_time_limit=0.5, time_limit=60)
def soft_limit(ctx: JobContext) -> dict[str, Any]:
    """Runs until its soft time limit is raised in it; its except block cleans up."""
    entry = ledger_start(ctx)
    try:
        while True:
            time.sleep(0.02)
    except SoftTimeLimitExceeded as exc:
        return {"cleaned_up": type(exc).__name__}
    finally:
        ledger_end(entry)


@django_pgqueue.handler("qa.leak")
def leak(ctx: JobContext) -> None:
    """Allocate payload['mib'] MiB (each page written, so resident) and keep it."""
    entry = ledger_start(ctx)
    LEAKED.append(b"\x01" * (int(ctx.payload["mib"]) * MIB))
    ledger_end(entry)


@django_pgqueue.handler(
    "qa.limit_asleep", soft_time_limit=0.5, time_limit=2, max_attempts=2, retry=FixedDelay(0.05)
)
async def limit_asleep(ctx: JobContext) -> None:
    """An async handler that swallows its cancellation: only its hard limit stops it."""
    await sync_to_async(ledger_start)(ctx)
    while True:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            continue


@django_pgqueue.handler("qa.soft_limit_async", soft_time_limit=0.5, time_limit=60)
async def soft_limit_async(ctx: JobContext) -> dict[str, Any]:
    """Cancelled at its soft limit; it cleans up and returns."""
    entry = await sync_to_async(ledger_start)(ctx)
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        return {"cleaned_up": "CancelledError"}
    finally:
        await sync_to_async(ledger_end)(entry)
    return {}
