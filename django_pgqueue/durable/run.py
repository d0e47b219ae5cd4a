"""One run of a durable handler: its checkpoints, read once, and its steps, sleeps and
event waits, each written under the job's lease on the job's database."""

from __future__ import annotations

import datetime as dt
import inspect
import json
import time
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections, transaction

from .. import validators
from ..conf import get_settings
from ..context import JobContext
from ..exceptions import AwaitEvent, EventTimeout, Snooze, StepNotRecorded
from ..outcomes import Committed
from ..store import durable as store
from ..validation import payload as encode

NAME_LIMIT = validators.MAX_DURABLE_NAME
# The shortest snooze of a sleep not yet due (Snooze refuses 0).
_SHORTEST_SNOOZE = 0.001


class StepMismatch(ValueError):
    """A resumed run met a checkpoint of another kind under a step's name: the handler's
    code changed under a run it started."""


class DurableRun:
    """The steps of one run of a handler (one attempt of its job).

    The job's checkpoints are read on the first call, in one statement, with the
    database's clock; each name is used once a run (a step met twice is a bug in the
    handler, not a replay).
    """

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.alias = ctx.database or get_settings().DATABASE
        self._steps: dict[str, tuple[str, Any]] | None = None
        self._db_now: dt.datetime | None = None
        self._loaded_at = 0.0  # time.monotonic() when the checkpoints were read
        self._used: set[str] = set()
        # The checkpoints of earlier runs this run has met again (replayed).
        self._replayed: set[str] = set()

    # -- checkpoints --------------------------------------------------------------

    def _checkpoint(self, name: Any, kind: str) -> tuple[str, Any] | None:
        """The stored checkpoint of step `name` (None: it has none), after checking the
        name and that it is used once in this run with one kind."""
        name = _bounded_name(name, "a step's name")
        if name in self._used:
            raise ValueError(
                f"the step {name!r} ran twice in one run of job #{self.ctx.job_id}: each step "
                "of a handler needs a name of its own (add the loop's index to it)"
            )
        self._used.add(name)
        if self._steps is None:
            self._db_now, self._steps = store.load_steps(self.alias, self.ctx.job_id)
            self._loaded_at = time.monotonic()
        stored = self._steps.get(name)
        if stored is not None:
            self._replayed.add(name)
        if stored is not None and stored[0] != kind and {stored[0], kind} != {"step", "atomic"}:
            raise StepMismatch(
                f"job #{self.ctx.job_id}: its step {name!r} was recorded as a {stored[0]} "
                f"step, and the handler now runs it as a {kind} step: the code changed under "
                "a run it started"
            )
        return stored

    def _record(self, name: str, kind: str, text: str, runtime: float | None) -> None:
        ctx = self.ctx
        if not store.record_step(
            self.alias, ctx.job_id, ctx.lease_version, name, kind, text, runtime
        ):
            raise StepNotRecorded(
                f"job #{ctx.job_id}: the checkpoint of step {name!r} was not recorded: the "
                f"job's lease (version {ctx.lease_version}) was lost"
            )

    def _keep(self, name: str, kind: str, value: Any, started: float) -> Any:
        """Record `value` as step `name`'s checkpoint (its function ran from `started`,
        monotonic); return it as the JSON a later run gets back."""
        runtime = time.monotonic() - started
        text = encode(value, None, f"the result of step {name!r}")
        self._record(name, kind, text, runtime)
        return json.loads(text)

    # -- steps --------------------------------------------------------------------

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        stored = self._checkpoint(name, "step")
        if stored is not None:
            return stored[1]
        started = time.monotonic()
        return self._keep(name, "step", fn(*args, **kwargs), started)

    async def astep(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """`step` for an async handler; `fn` may be a coroutine function (awaited here)
        or a plain one (run in a thread). The database is read and written on Django's
        thread for sync calls."""
        if not inspect.iscoroutinefunction(fn):
            return await sync_to_async(self.step)(name, fn, *args, **kwargs)
        stored = await sync_to_async(self._checkpoint)(name, "step")
        if stored is not None:
            return stored[1]
        started = time.monotonic()
        value = await fn(*args, **kwargs)
        return await sync_to_async(self._keep)(name, "step", value, started)

    def atomic_step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        stored = self._checkpoint(name, "atomic")
        if stored is not None:
            return stored[1]
        with transaction.atomic(using=self.alias):
            started = time.monotonic()
            # The checkpoint last in the transaction: the state row's lock (FOR SHARE)
            # is held only from there to the commit.
            return self._keep(name, "atomic", fn(*args, **kwargs), started)

    # -- versioning ---------------------------------------------------------------

    def patched(self, name: str) -> bool:
        stored = self._checkpoint(f"patch:{name}", "step")
        if stored is not None:
            return bool(stored[1])
        # A run that has earlier runs' checkpoints still ahead of it replays a history
        # written by code that passed here without this patch: the old path. A run at
        # the end of its history (or a new one) takes the new path. Recorded either
        # way, so every later run of the job decides the same.
        assert self._steps is not None
        new = set(self._steps) <= self._replayed
        self._record(f"patch:{name}", "step", "true" if new else "false", None)
        return new

    # -- the job's own completion ---------------------------------------------------

    def complete_atomically(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        ctx = self.ctx
        if ctx.attempt_id is None:
            raise RuntimeError("complete_atomically needs a job claimed by a worker")
        if connections[self.alias].in_atomic_block:
            # The completion would commit with an outer transaction the handler may
            # still roll back, after the worker took the job for completed.
            raise RuntimeError(
                "complete_atomically opens the job's transaction itself: call it outside "
                "transaction.atomic()"
            )
        with transaction.atomic(using=self.alias):
            value = fn(*args, **kwargs)
            text = None if value is None else encode(value, None, "the job's result")
            completed = store.complete_job(
                self.alias, ctx.job_id, ctx.lease_version, ctx.attempt_id, text
            )
            if not completed:
                raise StepNotRecorded(
                    f"job #{ctx.job_id} was not completed: its lease (version "
                    f"{ctx.lease_version}) was lost; its writes were rolled back"
                )
        ctx.committed = Committed(text)
        return None if text is None else json.loads(text)

    # -- sleeps -------------------------------------------------------------------

    def sleep(self, name: str, duration: dt.timedelta | float) -> None:
        if isinstance(duration, dt.timedelta):
            duration = duration.total_seconds()
        seconds = validators.seconds(duration, f"the duration of sleep {name!r}")
        self._sleep(name, seconds=seconds)

    def sleep_until(self, name: str, when: dt.datetime) -> None:
        if not isinstance(when, dt.datetime) or when.utcoffset() is None:
            raise ValueError(f"sleep_until needs an aware datetime, got {when!r}")
        self._sleep(name, until=when)

    def _sleep(
        self, name: str, *, seconds: float | None = None, until: dt.datetime | None = None
    ) -> None:
        stored = self._checkpoint(name, "sleep")
        ctx = self.ctx
        if stored is None:
            recorded = store.record_sleep(
                self.alias, ctx.job_id, ctx.lease_version, name, seconds=seconds, until=until
            )
            if recorded is None:
                raise StepNotRecorded(
                    f"job #{ctx.job_id}: the sleep {name!r} was not recorded: the job's lease "
                    f"(version {ctx.lease_version}) was lost"
                )
            wake_at, left = recorded
        else:
            assert self._db_now is not None
            wake_at = stored[1]["wake_at"]
            # By the database's clock when the checkpoints were read, less the time
            # this run took since (so never less than what is left).
            woke = dt.datetime.fromisoformat(wake_at)
            left = (woke - self._db_now).total_seconds() - (time.monotonic() - self._loaded_at)
        if left > 0:
            # The job is given back due at now() + left by the database's clock when
            # written, which is later than this: never before the wake-up.
            shown = dt.datetime.fromisoformat(wake_at).astimezone(dt.UTC)
            raise Snooze(
                max(left, _SHORTEST_SNOOZE),
                f"sleeping until {shown:%Y-%m-%d %H:%M:%S} UTC ({name!r})",
            )

    # -- events -------------------------------------------------------------------

    def wait_for_event(
        self, key: str, *, timeout: dt.timedelta | float | None = None, name: str | None = None
    ) -> Any:
        event_key(key)
        if isinstance(timeout, dt.timedelta):
            timeout = timeout.total_seconds()
        if timeout is not None:
            timeout = validators.seconds(timeout, f"the timeout of the wait for {key!r}")
        name = f"event:{key}" if name is None else name
        stored = self._checkpoint(name, "event")
        result = stored[1] if stored is not None else None
        if result is None:
            ctx = self.ctx
            result = store.take_event(self.alias, ctx.job_id, ctx.lease_version, name, key)
            if result is None:
                raise AwaitEvent(key, name, timeout)
        if result.get("timed_out"):
            raise EventTimeout(key, name)
        return result["payload"]


def event_key(key: Any) -> str:
    """`key` if it is a valid event key (1 to NAME_LIMIT characters, no NUL), else ValueError."""
    return _bounded_name(key, "an event key")


def _bounded_name(value: Any, what: str) -> str:
    """`value` if it is a string of 1 to NAME_LIMIT characters (the step and event tables'
    CHECKs) without NUL (which text cannot hold), else ValueError naming `what` it is."""
    if not isinstance(value, str) or not 0 < len(value) <= NAME_LIMIT or "\x00" in value:
        raise ValueError(
            f"{what} must be a string of 1 to {NAME_LIMIT} characters without NUL, got {value!r}"
        )
    return value
