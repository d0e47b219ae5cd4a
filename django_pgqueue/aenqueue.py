"""Enqueue from async code: `aenqueue`, `aenqueue_many`, and `aatomic`, the transaction
they join.

Django's connections belong to threads, and async code reaches them through
``sync_to_async(thread_sensitive=True)``: every such call of one request (or of one
``async_to_sync`` caller) runs on one thread, which holds that request's connection.
`aenqueue` runs `enqueue` there, so it writes on the same connection as the async ORM
(``acreate``, ``aupdate``) and joins the transaction open on it.

Django 6.1 has no async ``transaction.atomic()``; `aatomic` is Django's own, entered and
left on that thread: inside ``async with aatomic():`` the ORM's awaited writes and the
jobs `aenqueue` writes commit together, or roll back together. A call that would run on
another thread than the block it is inside (a task that escaped its request's thread)
is refused before anything is written, rather than written outside the transaction.
So is a block in a worker's async handler, whose thread (and connection) all the
worker's async handlers share.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import AsyncIterable, Callable, Iterable
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

from asgiref.sync import sync_to_async
from django.db import transaction
from django.db.transaction import TransactionManagementError

from .context import async_handler_job
from .enqueue import EnqueuedJob, JobSpec, enqueue, enqueue_many
from .exceptions import EnqueueError
from .unique import Unique

R = TypeVar("R")

# The thread that holds the aatomic() block open in this context, if any.
_block_thread: ContextVar[int | None] = ContextVar("pgqueue_aatomic_thread", default=None)


async def call_sync(func: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """Await ``func(*args, **kwargs)`` run on the thread of Django's thread-sensitive
    calls (the caller's connection); EnqueueError, before `func` runs, when that is not
    the thread of the `aatomic` block open in this context."""
    held_by = _block_thread.get()

    def run() -> R:
        if held_by is not None and threading.get_ident() != held_by:
            raise EnqueueError(
                "this call runs on another thread than the aatomic() block it is inside, "
                "so it would not be part of that transaction; nothing was written. Await "
                "it in the block's own task, not in a task the block's code started."
            )
        return func(*args, **kwargs)

    return await sync_to_async(run, thread_sensitive=True)()


class AsyncAtomic:
    """Django's ``transaction.atomic()`` entered and left on the thread of the caller's
    connection; use it as ``async with aatomic():``."""

    def __init__(self, using: str | None, savepoint: bool, durable: bool) -> None:
        self._atomic = transaction.atomic(using=using, savepoint=savepoint, durable=durable)
        self._thread: int | None = None
        self._token: Any = None

    async def __aenter__(self) -> AsyncAtomic:
        if self._thread is not None:
            raise TransactionManagementError("an aatomic() block is entered once; make a new one.")
        job_id = async_handler_job.get()
        if job_id is not None:
            raise TransactionManagementError(
                f"aatomic() in the async handler of job {job_id}: the worker's async "
                "handlers share one thread for Django's database calls, and its "
                "connection, so a transaction held open across awaits would take in the "
                "writes of the other jobs running meanwhile. Put the transaction in one "
                "sync function (transaction.atomic(), enqueue()) and await it through "
                "sync_to_async."
            )
        self._thread = await call_sync(self._enter)
        self._token = _block_thread.set(self._thread)
        return self

    def _enter(self) -> int:
        self._atomic.__enter__()
        return threading.get_ident()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        _block_thread.reset(self._token)
        await sync_to_async(self._exit, thread_sensitive=True)(exc_type, exc, traceback)

    def _exit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if threading.get_ident() != self._thread:
            # Its connection is another thread's: nothing here can end that transaction.
            raise TransactionManagementError(
                "an aatomic() block is left on another thread than it was entered on, "
                "so its transaction is still open there: enter and leave it in one task."
            )
        self._atomic.__exit__(exc_type, exc, traceback)


def aatomic(using: str | None = None, savepoint: bool = True, durable: bool = False) -> AsyncAtomic:
    """``transaction.atomic()`` for async code: ``async with aatomic(): ...``.

    The awaited ORM calls (``acreate``, ``asave``, ``aupdate``) and `aenqueue` inside
    the block run in its transaction: they commit when the block ends, and roll back
    when it raises. The arguments are ``transaction.atomic()``'s.
    """
    return AsyncAtomic(using, savepoint, durable)


@overload
async def aenqueue(
    type: str,
    payload: Any = None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    max_attempts: int | None = None,
    idempotency_key: str | None = None,
    concurrency_key: str | None = None,
    unique: Unique | None = None,
    fairness_key: str | None = None,
    using: str | None = None,
    on_commit: Literal[False] = False,
) -> EnqueuedJob: ...


@overload
async def aenqueue(
    type: str,
    payload: Any = None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    max_attempts: int | None = None,
    idempotency_key: str | None = None,
    concurrency_key: str | None = None,
    unique: Unique | None = None,
    fairness_key: str | None = None,
    using: str | None = None,
    on_commit: bool,
) -> EnqueuedJob | None: ...


async def aenqueue(
    type: str,
    payload: Any = None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    max_attempts: int | None = None,
    idempotency_key: str | None = None,
    concurrency_key: str | None = None,
    unique: Unique | None = None,
    fairness_key: str | None = None,
    using: str | None = None,
    on_commit: bool = False,
) -> EnqueuedJob | None:
    """`enqueue` from async code, in the caller's transaction (`aatomic`).

    The same arguments, validation and result as `enqueue`; it runs on the thread of
    the caller's connection, so inside ``async with aatomic():`` the job exists only if
    that block commits.
    """
    return await call_sync(
        enqueue,
        type,
        payload,
        queue=queue,
        priority=priority,
        run_at=run_at,
        delay=delay,
        max_attempts=max_attempts,
        idempotency_key=idempotency_key,
        concurrency_key=concurrency_key,
        unique=unique,
        fairness_key=fairness_key,
        using=using,
        on_commit=on_commit,
    )


@overload
async def aenqueue_many(
    jobs: Iterable[JobSpec | tuple[str, Any]] | AsyncIterable[JobSpec | tuple[str, Any]],
    *,
    using: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    max_attempts: int | None = None,
    on_commit: Literal[False] = False,
) -> list[EnqueuedJob]: ...


@overload
async def aenqueue_many(
    jobs: Iterable[JobSpec | tuple[str, Any]] | AsyncIterable[JobSpec | tuple[str, Any]],
    *,
    using: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    max_attempts: int | None = None,
    on_commit: bool,
) -> list[EnqueuedJob] | None: ...


async def aenqueue_many(
    jobs: Iterable[JobSpec | tuple[str, Any]] | AsyncIterable[JobSpec | tuple[str, Any]],
    *,
    using: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    max_attempts: int | None = None,
    on_commit: bool = False,
) -> list[EnqueuedJob] | None:
    """`enqueue_many` from async code, in the caller's transaction (`aatomic`).

    `jobs` may be an async iterable too: it is read to its end first, then every job
    is validated and written as `enqueue_many` does (all or nothing).
    """
    if isinstance(jobs, AsyncIterable):
        jobs = [item async for item in jobs]
    return await call_sync(
        enqueue_many,
        jobs,
        using=using,
        queue=queue,
        priority=priority,
        run_at=run_at,
        delay=delay,
        max_attempts=max_attempts,
        on_commit=on_commit,
    )
