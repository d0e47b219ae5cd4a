"""The event loop: async handlers as tasks on one loop thread the worker owns.

An ``async def`` handler (or an async ``django.tasks`` Task) runs as an asyncio task on
this pool's loop, at most ASYNC_CONCURRENCY at once (the others handed over wait,
unstarted, until a task ends), apart from the handler threads. The loop never touches
the queue's tables: each job's outcome goes on a queue the dispatcher collects, once,
when the job's task has really ended (`_report`): the hold of `claimed.ClaimedJob`.

- A timeout decides the job's outcome (a JobTimeout failure) and cancels the task; the
  outcome is reported once the task ended.
- An operator's cancel request and a lost lease (seen at a renewal) cancel it too.
- A handler that swallows the CancelledError is detected: it ended without raising it,
  or it still runs CANCEL_GRACE after the cancel. Either way it is logged with its job
  type and counted; its job keeps its slot until the task ends.
- The watchdog thread (`loopwatch.py`) measures the loop's lag from a probe the loop
  runs every LAG_PROBE seconds, names the job whose sync call holds the loop, and
  while the loop is held decides the timeouts that fall due (the loop's timers cannot).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import queue as queue_module
import threading
import time
from collections import deque
from typing import Any

from asgiref.sync import SyncToAsync, ThreadSensitiveContext, sync_to_async
from django.db import connections

from .. import executor
from ..claimed import ClaimedJob
from ..exceptions import SoftTimeLimitExceeded
from ..outcomes import Interrupted, Outcome, Retry
from .loopwatch import LAG_PROBE, Watchdog
from .observing import AsyncRun, athrough
from .pool import drain, give_up

logger = logging.getLogger(__name__)

SCAN = 0.1  # seconds between two looks at cancel requests and lost leases
CANCEL_GRACE = 1.0  # seconds a cancelled handler has to end before it is let go

# Why this pool cancelled a job's task.
TIMEOUT, CANCEL, LOST, SHUTDOWN = "timeout", "cancel requested", "lease lost", "shutdown"
SOFT_LIMIT = "soft time limit"


class AsyncPool:
    """Runs async handlers on one event loop thread, `concurrency` executing at most."""

    def __init__(
        self,
        concurrency: int,
        wake: threading.Event,
        worker_id: str,
        arun: AsyncRun | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.worker_id = worker_id
        self.arun = arun or athrough(())  # an attempt's run through the middleware
        self._wake = wake
        self._outcomes: queue_module.SimpleQueue[tuple[ClaimedJob, Outcome]] = (
            queue_module.SimpleQueue()
        )
        # Decides who reports a job, and its verdict against its outcome: exactly once.
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._stop = threading.Event()
        self._waiting: deque[ClaimedJob] = deque()  # handed over, not started (loop thread)
        self._tasks: dict[ClaimedJob, asyncio.Task[None]] = {}  # the loop thread's only
        self._why: dict[ClaimedJob, str] = {}  # why a task was cancelled (loop thread)
        self._live: set[ClaimedJob] = set()  # started, not reported (under _lock)
        self._warned: set[ClaimedJob] = set()  # logged as ignoring its cancel (loop thread)
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
        # The tasks' context: not the dispatcher's (whose thread may be one of
        # asgiref's, when the worker was started from async code through
        # sync_to_async: a task's thread-sensitive sync_to_async call would then be sent
        # to that thread, which runs the worker, and wait for ever), but one whose
        # thread-sensitive calls all go to one executor thread of the loop's own.
        self._sync_context = ThreadSensitiveContext()
        self._context = contextvars.Context()
        self._context.run(SyncToAsync.thread_sensitive_context.set, self._sync_context)

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

    def submit(self, items: list[ClaimedJob]) -> None:
        """Hand `items` to the loop, in order: each starts once a task slot is free."""
        if not items:
            return
        if self._loop is None:  # a worker with no async handler runs no loop
            self.start()
        assert self._loop is not None
        for item in items:
            item.thread = self._thread  # its code runs on the loop thread (see ended)
        self.in_flight += len(items)
        with self._lock:
            self._handed += len(items)
        self._loop.call_soon_threadsafe(self._admit, items)

    def finished(self) -> list[tuple[ClaimedJob, Outcome]]:
        """(job, outcome) of the jobs whose tasks ended since the last call."""
        self._signalled = False  # before the drain: an outcome put meanwhile wakes again
        out = drain(self._outcomes)
        self.in_flight -= len(out)
        return out

    def give_up(self, items: list[ClaimedJob]) -> list[ClaimedJob]:
        """As `HandlerPool.give_up`, under `_lock` (`_report`'s): a loop that a blocking
        handler holds outlives `stop`, and its tasks may still report."""
        return give_up(items, self._lock)

    def arm(self, *, until_last: bool) -> None:
        """How the next outcomes wake the dispatcher: the first one (it starts the flush
        clock), or with `until_last` (outcomes already wait) only the last in flight."""
        self._wake_first = not until_last

    @property
    def started(self) -> bool:
        return self._loop is not None

    def stop_taking(self) -> list[ClaimedJob]:
        """Start no more jobs; return those handed over and not started (handed back by
        the worker's shutdown)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return []
        unstarted: list[ClaimedJob] = []
        done = threading.Event()

        def take() -> None:
            self._stop.set()
            unstarted.extend(self._waiting)
            self._waiting.clear()
            done.set()

        loop.call_soon_threadsafe(take)
        # The loop thread may be held by a blocking handler: then nothing more starts
        # there before the worker's shutdown ends, and nothing is handed back.
        if not done.wait(CANCEL_GRACE):
            return []
        self.in_flight -= len(unstarted)
        with self._lock:
            self._handed -= len(unstarted)
        return unstarted

    def stop(self) -> None:
        """Cancel what still runs, give it CANCEL_GRACE to end, and end the loop thread
        (the worker's shutdown gave the handlers their grace before). A task still
        running then is never resumed: the loop stops under it."""
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
                closing = self._in_own_context(sync_to_async(connections.close_all)())
                loop.run_until_complete(closing)
            except Exception:
                logger.exception("closing the event loop's Django connections failed")
            finally:
                executor = SyncToAsync.context_to_thread_executor.pop(self._sync_context, None)
                if executor is not None:
                    executor.shutdown(wait=False)
            loop.close()

    def _in_own_context(self, coro: Any, name: str | None = None) -> asyncio.Task[Any]:
        """A task of `coro` in the loop's own context (see `_context`)."""
        assert self._loop is not None
        return self._context.run(self._loop.create_task, coro, name=name)

    def _admit(self, items: list[ClaimedJob]) -> None:
        if self._stop.is_set():  # stopping: stop_taking hands them back
            self._waiting.extend(items)
            return
        self._waiting.extend(items)
        self._start_waiting()

    def _start_waiting(self) -> None:
        """Start waiting jobs while fewer than `concurrency` tasks run."""
        loop = self._loop
        assert loop is not None
        while self._waiting and len(self._tasks) < self.concurrency and not self._stop.is_set():
            item = self._waiting.popleft()
            item.started = time.monotonic()
            with self._lock:
                self._live.add(item)
            task = self._in_own_context(self._run(item), f"pgqueue job {item.ctx.job_id}")
            self._tasks[item] = task
            timers = [
                loop.call_at(item.started + after, self._cancel, item, why)
                for after, why in ((item.timeout, TIMEOUT), (item.soft_time_limit, SOFT_LIMIT))
                if after is not None
            ]
            if item.time_limit is not None:  # the dispatcher ends the process then
                timers.append(loop.call_at(item.started + item.time_limit, self._wake.set))
            task.add_done_callback(
                lambda done, item=item, timers=timers: self._ended(item, done, timers)
            )

    def _ended(
        self, item: ClaimedJob, task: asyncio.Task[None], timers: list[asyncio.TimerHandle]
    ) -> None:
        """`item`'s task is done: its slot is free for the next waiting job.

        A task cancelled before its first step never ran `_run` (a coroutine cancelled
        before it starts runs none of its code): its job is reported here, with the
        cancellation's outcome, or it would be held while the process lives.
        """
        self._tasks.pop(item, None)
        self._warned.discard(item)
        for timer in timers:
            timer.cancel()  # no timer outlives its job
        if not item.reported:
            item.returned = True
            why = self._why.pop(item, SHUTDOWN)
            failed = None if task.cancelled() else task.exception()
            if failed is None:
                self._report(item, cancelled_outcome(item, why))
            else:
                self._report(item, executor.fallback_failure(failed))
        self._start_waiting()

    async def _run(self, item: ClaimedJob) -> None:
        try:
            item.ctx.payload = json.loads(item.payload_text)
        except BaseException as exc:  # ValueError; RecursionError when nested deep
            self._report(item, executor.decode_failure(exc))
            return
        swallowed = False
        try:
            outcome = await self.arun(item, executor.arun)
            swallowed = item in self._why  # cancelled, yet it returned
        except asyncio.CancelledError:
            outcome = None
        except BaseException as exc:  # a middleware that raised: still an outcome
            outcome = executor.fallback_failure(exc)
        item.returned = True
        why = self._why.pop(item, None)
        if why is None:
            assert outcome is not None
            self._report(item, outcome)
            return
        if swallowed and item not in self._warned:
            _ignored(item, why, "it swallowed the CancelledError and returned")
            self.ignored_cancel += 1  # after the warning: who reads the count finds it
        # Cancelled by an operator or its soft limit, a handler that returned has its outcome.
        handled = why in (CANCEL, SOFT_LIMIT) and outcome
        self._report(item, outcome if handled else cancelled_outcome(item, why))

    def _cancel(self, item: ClaimedJob, why: str) -> None:
        """Cancel `item`'s task for `why`, unless it ended or was cancelled already."""
        task = self._tasks.get(item)
        if task is None or item.reported or item in self._why:
            return
        self._why[item] = why
        if why == SOFT_LIMIT:
            item.soft_limited = True
            logger.warning(
                "job %d (%s) ran past its soft time limit of %gs; its task is cancelled",
                item.ctx.job_id,
                item.ctx.type,
                item.soft_time_limit,
                extra=item.facts(),
            )
        if why == TIMEOUT and self._decide_timeout(item):
            logger.error(
                "job %d (%s) exceeded its timeout of %gs; its task is cancelled, and the "
                "job failed once it ended (its row and slots held until then)",
                item.ctx.job_id,
                item.ctx.type,
                item.timeout,
                extra=item.facts(),
            )
        task.cancel(f"pgqueue: {why}")
        assert self._loop is not None
        self._loop.call_later(CANCEL_GRACE, self._overdue, item, why)

    def _decide_timeout(self, item: ClaimedJob) -> bool:
        """Decide `item`'s timeout (from the loop, or the watchdog while the loop is
        held), unless its outcome is reported or decided already; True if decided."""
        assert item.timeout is not None
        with self._lock:
            if item.reported or item.timed_out:
                return False
            item.decide(executor.timed_out(item.ctx, item.timeout, item.policy), time.monotonic())
            return True

    def _overdue(self, item: ClaimedJob, why: str) -> None:
        """A cancelled task still runs after CANCEL_GRACE: say so (its job keeps its slot
        until it ends), and cancel it once more in case it listens the second time."""
        task = self._tasks.get(item)
        if task is None or task.done() or item.reported:
            return
        if item not in self._warned:
            self._warned.add(item)
            _ignored(item, why, f"it still runs {CANCEL_GRACE:g}s after its cancellation")
            self.ignored_cancel += 1
        task.cancel(f"pgqueue: {why}")

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

    def _report(self, item: ClaimedJob, outcome: Outcome) -> None:
        """Hand `item`'s outcome (its verdict, if one was decided) to the dispatcher,
        once: its task has ended."""
        now = time.monotonic()
        with self._lock:
            if item.reported:
                return
            item.reported = True
            self._live.discard(item)
            self._reported += 1
            last = self._reported == self._handed
            if item.started is not None:
                item.runtime = now - item.started
            # Queued under the lock, against the shutdown's `give_up`: reported means queued.
            self._outcomes.put((item, item.verdict or outcome))
        if last or (self._wake_first and not self._signalled):
            self._signalled = True
            self._wake.set()

    def live(self) -> list[ClaimedJob]:
        """The jobs whose tasks started and have not ended (for the watchdog)."""
        with self._lock:
            return list(self._live)

    def cancel_timed_out_soon(self, item: ClaimedJob) -> None:
        """Cancel the task of `item`, past its timeout, once the loop runs again (the
        watchdog's call, from its own thread)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._cancel, item, TIMEOUT)


async def _stop_after(loop: asyncio.AbstractEventLoop, waiting: asyncio.Future[Any]) -> None:
    """Stop `loop` once `waiting` is done, or CANCEL_GRACE passed."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(waiting), CANCEL_GRACE)
    loop.stop()


def cancelled_outcome(item: ClaimedJob, why: str) -> Outcome:
    """The outcome of a job whose task was cancelled for `why`."""
    if why == TIMEOUT:
        assert item.timeout is not None
        return executor.timed_out(item.ctx, item.timeout, item.policy)
    if why == SHUTDOWN:
        return Interrupted("django_pgqueue.WorkerShutdown", "the worker stopped")
    if why == SOFT_LIMIT:
        exc = SoftTimeLimitExceeded(
            f"the handler ran past its soft time limit of {item.soft_time_limit:g}s; "
            "its task was cancelled"
        )
        return executor.classify(exc, item.ctx, item.policy)
    if why == CANCEL:  # the writer ends it cancelled, whatever failure it is
        return Retry("asyncio.CancelledError", "an operator cancelled the running job")
    return Retry("asyncio.CancelledError", "the lease was lost; the task was cancelled")


def _ignored(item: ClaimedJob, why: str, what: str) -> None:
    logger.warning(
        "job %d (%s) was cancelled (%s) and %s: a handler must let CancelledError "
        "propagate; its job keeps its row and slots until the task ends",
        item.ctx.job_id,
        item.ctx.type,
        why,
        what,
        extra=item.facts(),
    )
