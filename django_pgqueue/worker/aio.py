"""The event loop: async handlers as tasks on one loop thread the worker owns.

An ``async def`` handler (or an async ``django.tasks`` Task) runs as an asyncio task on
this pool's loop, up to ASYNC_CONCURRENCY at once, apart from the handler threads. The
loop never touches the queue's tables: it puts (job, outcome) on a queue the dispatcher
collects, once per job (`_report`, under `_lock`), whoever comes first: the task ending,
its timeout, or the watchdog.

- A timeout cancels the task at the timeout (a timer on the loop) and records one
  JobTimeout failure once the task has ended.
- An operator's cancel request and a lost lease (seen at a renewal) cancel it too.
- A handler that swallows the CancelledError is detected: it ended without raising it,
  or it still runs CANCEL_GRACE after the cancel. Either way it is logged with its job
  type and counted, and its outcome is recorded without waiting for it.
- The watchdog thread (`loopwatch.py`) measures the loop's lag from a probe the loop
  runs every LAG_PROBE seconds, names the job whose sync call holds the loop, and
  while the loop is held records the timeouts that fall due (the loop cannot).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue as queue_module
import threading
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections

from .. import executor
from ..claimed import InFlight
from ..extensions import Hooks, WorkerHooks
from ..outcomes import Failure, Outcome
from .loopwatch import LAG_PROBE, Watchdog

logger = logging.getLogger(__name__)

SCAN = 0.1  # seconds between two looks at cancel requests and lost leases
CANCEL_GRACE = 1.0  # seconds a cancelled handler has to end before it is let go

# Why this pool cancelled a job's task.
TIMEOUT, CANCEL, LOST, SHUTDOWN = "timeout", "cancel requested", "lease lost", "shutdown"


class AsyncPool:
    """Runs async handlers on one event loop thread, `concurrency` in flight at most."""

    def __init__(
        self, concurrency: int, wake: threading.Event, worker_id: str, hooks: Hooks | WorkerHooks
    ) -> None:
        self.concurrency = concurrency
        self.worker_id = worker_id
        self.hooks = hooks
        self._wake = wake
        self._outcomes: queue_module.SimpleQueue[tuple[InFlight, Outcome, bool]] = (
            queue_module.SimpleQueue()
        )
        # Decides who reports a job (its task, its timer, the watchdog): exactly one.
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._stop = threading.Event()
        self._tasks: dict[InFlight, asyncio.Task[None]] = {}  # the loop thread's only
        self._why: dict[InFlight, str] = {}  # why a task was cancelled (loop thread)
        self._live: set[InFlight] = set()  # started, not reported (under _lock)
        # The dispatcher's count: jobs handed over and not collected yet.
        self.in_flight = 0
        self._handed = 0  # under _lock, with _reported
        self._reported = 0
        self._wake_first = True  # wake the dispatcher at the first outcome (see arm)
        self._signalled = False
        # The loop's lag: the last probe's, the largest seen, how often it was blocked.
        self.lag = 0.0
        self.lag_max = 0.0
        self.blocked = 0
        self.ignored_cancel = 0  # handlers that swallowed their CancelledError
        self._probe_seen = time.monotonic()
        self._blocked_now = False

    # -- the dispatcher's side ----------------------------------------------------

    def start(self) -> None:
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._serve, args=(ready,), name="pgqueue-event-loop", daemon=True
        )
        self._thread.start()
        ready.wait()
        self._watchdog = threading.Thread(
            target=Watchdog(self, AsyncPool._run.__code__).run,
            name="pgqueue-loop-watchdog",
            daemon=True,
        )
        self._watchdog.start()

    @property
    def free(self) -> int:
        """How many more jobs the loop takes now."""
        return self.concurrency - self.in_flight

    def submit(self, items: list[InFlight]) -> None:
        """Start `items` as tasks on the loop, in order."""
        if not items:
            return
        if self._loop is None:  # a worker with no async handler runs no loop
            self.start()
        assert self._loop is not None
        self.in_flight += len(items)
        with self._lock:
            self._handed += len(items)
        self._loop.call_soon_threadsafe(self._start_all, items)

    def finished(self) -> list[tuple[InFlight, Outcome, bool]]:
        """(job, outcome, timed out) of the jobs reported since the last call."""
        self._signalled = False  # before the drain: an outcome put meanwhile wakes again
        out = []
        while True:
            try:
                out.append(self._outcomes.get_nowait())
            except queue_module.Empty:
                break
        self.in_flight -= len(out)
        return out

    def arm(self, *, until_last: bool) -> None:
        """How the next outcomes wake the dispatcher: the first one (it starts the flush
        clock), or with `until_last` (outcomes already wait) only the last in flight."""
        self._wake_first = not until_last

    @property
    def started(self) -> bool:
        return self._loop is not None

    def stop(self) -> None:
        """Cancel what still runs, give it CANCEL_GRACE to end, and end the loop thread
        (the worker's shutdown gave the handlers their grace before)."""
        loop = self._loop
        self._stop.set()
        if loop is None or self._thread is None:
            return
        if not loop.is_closed():
            loop.call_soon_threadsafe(self._shutdown)
        self._thread.join(timeout=CANCEL_GRACE + 5)

    # -- the loop thread ----------------------------------------------------------

    def _serve(self, ready: threading.Event) -> None:
        self._loop = loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        loop.call_soon(self._probe, time.monotonic())
        loop.call_soon(self._scan)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        finally:
            try:
                # Django's async ORM and thread-sensitive sync_to_async calls ran on
                # one executor thread: close that thread's connections as the loop ends.
                loop.run_until_complete(sync_to_async(connections.close_all)())
            except Exception:
                logger.exception("closing the event loop's Django connections failed")
            loop.close()

    def _start_all(self, items: list[InFlight]) -> None:
        loop = self._loop
        assert loop is not None
        for item in items:
            item.started = time.monotonic()
            with self._lock:
                self._live.add(item)
            task = loop.create_task(self._run(item), name=f"pgqueue job {item.ctx.job_id}")
            self._tasks[item] = task
            if item.timeout is None:
                task.add_done_callback(lambda _t, item=item: self._tasks.pop(item, None))
                continue
            timer = loop.call_at(item.started + item.timeout, self._cancel, item, TIMEOUT)
            task.add_done_callback(lambda _t, item=item, timer=timer: self._ended(item, timer))

    def _ended(self, item: InFlight, timer: asyncio.TimerHandle) -> None:
        self._tasks.pop(item, None)
        timer.cancel()  # no timer outlives its job

    async def _run(self, item: InFlight) -> None:
        try:
            item.ctx.payload = json.loads(item.payload_text)
        except BaseException as exc:  # ValueError; RecursionError when nested deep
            self._report(item, executor.decode_failure(exc))
            return
        swallowed = False
        try:
            outcome = await self.hooks.arun_attempt(item, executor.arun)
            swallowed = item in self._why  # cancelled, yet it returned
        except asyncio.CancelledError:
            outcome = None
        except BaseException as exc:  # a hook that raised: still an outcome
            outcome = executor.fallback_failure(exc)
        item.returned = True
        why = self._why.pop(item, None)
        if why is None:
            assert outcome is not None
            self._report(item, outcome)
            return
        if swallowed:
            self.ignored_cancel += 1
            _ignored(item, why, "it swallowed the CancelledError and returned")
        self._report(item, outcome if why == CANCEL and outcome else cancelled_outcome(item, why))

    def _cancel(self, item: InFlight, why: str) -> None:
        """Cancel `item`'s task for `why`, unless it ended or was cancelled already."""
        task = self._tasks.get(item)
        if task is None or item.reported or item in self._why:
            return
        self._why[item] = why
        if why == TIMEOUT:
            item.timed_out = True
            # A handler that keeps running must see its lease as lost; the heartbeat
            # renews it until the failure is written.
            item.lease.timed_out = True
            logger.error(
                "job %d (%s) exceeded its timeout of %gs; its task is cancelled",
                item.ctx.job_id,
                item.ctx.type,
                item.timeout,
            )
        task.cancel(f"pgqueue: {why}")
        assert self._loop is not None
        self._loop.call_later(CANCEL_GRACE, self._overdue, item, why)

    def _overdue(self, item: InFlight, why: str) -> None:
        """A cancelled task still runs after CANCEL_GRACE: report it without it."""
        task = self._tasks.get(item)
        if task is None or task.done() or item.reported:
            return
        self.ignored_cancel += 1
        _ignored(item, why, f"it still runs {CANCEL_GRACE:g}s after its cancellation")
        self._report(item, cancelled_outcome(item, why))
        task.cancel(f"pgqueue: {why}")  # once more, in case it listens the second time

    def _scan(self) -> None:
        """Cancel the tasks whose job an operator cancelled or whose lease was lost."""
        for item in list(self._tasks):
            lease = item.lease
            if lease.cancel_requested:
                self._cancel(item, CANCEL)
            elif lease.lost:
                self._cancel(item, LOST)
        if not self._stop.is_set():
            assert self._loop is not None
            self._loop.call_later(SCAN, self._scan)

    def _probe(self, due: float) -> None:
        now = time.monotonic()
        self._probe_seen = now
        self.lag = lag = max(0.0, now - due)
        self.lag_max = max(self.lag_max, lag)
        self._blocked_now = False
        assert self._loop is not None
        self._loop.call_later(LAG_PROBE, self._probe, now + LAG_PROBE)

    def _shutdown(self) -> None:
        """Cancel every task; stop the loop once they ended (or CANCEL_GRACE passed)."""
        tasks = list(self._tasks.items())
        for item, _ in tasks:
            self._cancel(item, SHUTDOWN)
        assert self._loop is not None
        if not tasks:
            self._loop.stop()
            return
        waiting = asyncio.gather(*(task for _, task in tasks), return_exceptions=True)
        self._loop.create_task(_stop_after(self._loop, waiting))

    # -- both sides -------------------------------------------------------------------

    def _report(self, item: InFlight, outcome: Outcome, *, timed_out: bool | None = None) -> bool:
        """Hand `item`'s outcome to the dispatcher, once; False if it was already."""
        now = time.monotonic()
        with self._lock:
            if item.reported:
                return False
            item.reported = True
            self._live.discard(item)
            self._reported += 1
            last = self._reported == self._handed
        if item.started is not None:
            item.runtime = now - item.started
        self._outcomes.put((item, outcome, item.timed_out if timed_out is None else timed_out))
        if last or (self._wake_first and not self._signalled):
            self._signalled = True
            self._wake.set()
        return True

    def _cancel_reported(self, item: InFlight) -> None:
        task = self._tasks.get(item)
        if task is not None and item not in self._why:
            self._why[item] = TIMEOUT
            task.cancel(f"pgqueue: {TIMEOUT}")


async def _stop_after(loop: asyncio.AbstractEventLoop, waiting: asyncio.Future[Any]) -> None:
    """Stop `loop` once `waiting` is done, or CANCEL_GRACE passed."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(waiting), CANCEL_GRACE)
    loop.stop()


def cancelled_outcome(item: InFlight, why: str) -> Outcome:
    """The outcome of a job whose task was cancelled for `why`."""
    if why == TIMEOUT:
        assert item.timeout is not None
        return executor.timed_out(item.ctx, item.timeout, item.policy)
    if why == SHUTDOWN:
        return _failure("django_pgqueue.WorkerShutdown", "the worker stopped", interrupted=True)
    if why == CANCEL:  # the writer ends it cancelled, whatever failure it is
        return _failure("asyncio.CancelledError", "an operator cancelled the running job")
    return _failure("asyncio.CancelledError", "the lease was lost; the task was cancelled")


def _ignored(item: InFlight, why: str, what: str) -> None:
    logger.warning(
        "job %d (%s) was cancelled (%s) and %s: a handler must let CancelledError "
        "propagate; its outcome is recorded without waiting for it",
        item.ctx.job_id,
        item.ctx.type,
        why,
        what,
    )


def _failure(error_class: str, message: str, *, interrupted: bool = False) -> Failure:
    return Failure(error_class, message, "", permanent=False, delay=0.0, interrupted=interrupted)
