"""The handler pool: threads that run handlers, and their timeouts (what a handler
thread does with its Django connections between jobs is `handler_connections`).

Handler threads take jobs from a shared list and put (job, outcome) on a queue; none of
them touches the queue's tables. A batch handed over wakes one idle thread (the one
that went idle last, whose Django connection is the warmest), and each thread that
takes a job wakes the next while jobs wait (see `_take`): a thread switch per job
started, not per job handed, so short jobs run back to back on the threads already
awake. The dispatcher is woken only when the count of finished jobs reaches a
mark it set (see `wait`), not once per job.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import logging
import queue as queue_module
import threading
import time
from collections import deque

from django.db import connections

from .. import executor
from ..claimed import ClaimedJob
from ..exceptions import SoftTimeLimitExceeded
from ..outcomes import Failure, Outcome, Retry
from .handler_connections import (
    close_unusable_django_connections,
    health_check_on_first_use,
    reset_django_connections,
)
from .observing import Run, through
from .time_limits import first_deadline as first_limit
from .time_limits import raise_soft_limit, soft_limit_due
from .timeouts import all_stuck, first_deadline, stuck, time_out
from .wake_mark import WakeMark

logger = logging.getLogger(__name__)

# A job and the outcome its handler returned.
Returned = tuple[ClaimedJob, Outcome]

# Seconds between two looks at whether every handler thread is alive, while none is
# known to have crashed.
THREAD_SCAN = 1.0


class HandlerPool:
    """`concurrency` handler threads: at most that many handlers execute at once.

    A handler past its timeout keeps its thread (and so its slot) until its code
    returns: its job's outcome is then its timeout (see `timeouts`). A thread that
    crashed is replaced; none is replaced while it may still run a handler.
    """

    def __init__(
        self,
        concurrency: int,
        wake: threading.Event,
        worker_id: str,
        run: Run | None = None,
    ) -> None:
        self.concurrency = concurrency
        self.worker_id = worker_id
        self.run = run or through(())  # an attempt's run through the worker's middleware
        self._wake = wake
        # The jobs handed over and not taken yet; the idle threads, each parked on a lock
        # of its own, the latest to park last (it is woken first: its Django connection
        # and its backend are the warmest); idle threads woken and not running yet.
        self._work: deque[ClaimedJob] = deque()
        self._idle: list[threading.Lock] = []
        self._take_lock = threading.Lock()
        self._waking = 0
        self._outcomes: queue_module.SimpleQueue[Returned] = queue_module.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._current: dict[threading.Thread, ClaimedJob] = {}  # the job each thread runs
        self._stopping = False
        self._names = itertools.count()
        # Handed out with a timeout, until their handlers ended.
        self._timed: dict[ClaimedJob, None] = {}
        # Under it, a handler thread sets `returned` (if its job has a timeout) and
        # `time_out` decides the timeout only if not returned: exactly one decides.
        self._handoff = threading.Lock()
        # Jobs handed to handler threads and returned by them (see wait).
        self.wake_mark = WakeMark(wake)
        self._crash_lock = threading.Lock()
        # Handler threads that crashed and were not replaced yet; the next look at all
        # of them (see check_threads).
        self._crashes = 0
        self._next_scan = 0.0
        # Grows each time the dispatcher gets its connection back after losing it: the
        # database restarted or cut this process off, so the handler threads' own
        # Django connections are likely dead too (see _run).
        self._db_epoch = 0

    # -- the dispatcher's side ----------------------------------------------------

    def start(self) -> None:
        for _ in range(self.concurrency):
            self._spawn()

    def grow(self, concurrency: int) -> None:
        """Have at least `concurrency` handler threads (an operator raised the limit)."""
        while self.concurrency < concurrency:
            self.concurrency += 1
            self._spawn()

    def submit(self, items: list[ClaimedJob]) -> None:
        """Hand jobs to the handler threads, in order."""
        for item in items:
            if item.timeout is not None or item.soft_time_limit or item.time_limit:
                self._timed[item] = None
        self.wake_mark.handed(len(items))
        self._work.extend(items)
        self._kick()

    def _kick(self) -> None:
        """Wake an idle thread for the waiting jobs, unless a wake-up is on its way."""
        with self._take_lock:
            if self._waking or not self._work or not self._idle:
                return
            self._waking += 1
            parked = self._idle.pop()
        parked.release()

    def finished(self) -> list[tuple[ClaimedJob, Outcome]]:
        """The outcomes of the handlers that ended since the last call, each job's once
        (not one the worker's shutdown recorded already)."""
        returned = drain(self._outcomes)
        fresh = [(item, outcome) for item, outcome in returned if not item.resolved]
        for item, _ in fresh:
            item.resolved = True
        return fresh

    def give_up(self, items: list[ClaimedJob]) -> list[ClaimedJob]:
        """The worker's shutdown records those of `items` whose handlers have not handed
        their outcomes over: returned, resolved (an outcome of theirs that comes later is
        dropped). The others' outcomes are queued: `finished` has them.

        Decided under `_handoff`, which the hand-over takes too: each job ends either
        with its handler's outcome or as the shutdown recorded it, never both or neither.
        """
        return give_up(items, self._handoff)

    def wait(self, timeout: float, *, until_last: bool) -> None:
        """Wait up to `timeout` for a reason to act (an outcome worth collecting, a NOTIFY,
        a signal).

        Handler threads wake the dispatcher only when the count of returned jobs
        reaches a mark (see `WakeMark`): the last job in flight (`until_last`: outcomes
        already wait and more jobs run), else the first outcome after a flush (it
        starts the FLUSH_DELAY clock).
        """
        self.wake_mark.arm(until_last=until_last)
        # A handler that finished before the line above put its outcome first.
        if self._outcomes.empty():
            self._wake.wait(timeout)

    def reconnected(self) -> None:
        """The dispatcher lost its connection and has it back: check Django's too."""
        self._db_epoch += 1

    def next_timeout(self) -> float | None:
        """When the first running handler reaches its timeout or a time limit."""
        dues = [due for due in (first_deadline(self._timed), first_limit(self._timed)) if due]
        return min(dues) if dues else None

    def check_timeouts(self) -> bool:
        """Decide the timeouts of the handlers past theirs (see `timeouts`); True when
        every handler thread is stuck and the worker should exit.

        The handoff is decided under `_handoff`: a handler that has returned is never
        timed out (its outcome is on its way).
        """
        if not self._timed:
            return False
        now = time.monotonic()
        for item in list(self._timed):
            if item.reported:
                del self._timed[item]
                continue
            if item.started is None:
                continue
            if soft_limit_due(item, now):
                raise_soft_limit(item, self._handoff)
            if item.timeout is None or item.timed_out or now - item.started < item.timeout:
                continue
            if not time_out(item, self._handoff, now):
                continue
            logger.error(
                "job %d (%s) exceeded its timeout of %gs; failing it once its handler "
                "returns (its row and slots held until then)",
                item.ctx.job_id,
                item.ctx.type,
                item.timeout,
                extra=item.facts(),
            )
        return all_stuck(stuck(self._timed, now), self.concurrency, self.worker_id)

    def check_threads(self) -> list[tuple[ClaimedJob, Outcome]]:
        """Replace handler threads that died; the outcome of the job each left without one
        (its verdict, or the thread's death).

        The threads are looked at while one that crashed is not replaced yet, else at
        most every THREAD_SCAN seconds (not at every cycle: the pool may be large).
        """
        now = time.monotonic()
        if not self._crashes and now < self._next_scan:
            return []
        self._next_scan = now + THREAD_SCAN
        ended = []
        for thread in [t for t in self._threads if not t.is_alive()]:
            if self._stopping:
                break
            with self._crash_lock:
                self._crashes = max(0, self._crashes - 1)
            self._threads.remove(thread)
            item = self._current.pop(thread, None)
            logger.error("handler thread %s died; starting a replacement", thread.name)
            if item is not None and not item.resolved and not item.reported:
                item.resolved = True
                self._timed.pop(item, None)
                ended.append((item, item.verdict or _thread_died()))
            self._spawn()
        return ended

    def stop(self) -> list[ClaimedJob]:
        """Stop the handler threads once their current job ends; return the jobs that
        never started."""
        with self._take_lock:
            self._stopping = True
            unstarted = list(self._work)
            self._work.clear()
            parked, self._idle = self._idle, []
            self._waking += len(parked)
        for lock in parked:
            lock.release()
        return unstarted

    # -- the handler threads --------------------------------------------------------

    def _spawn(self) -> None:
        thread = threading.Thread(
            target=self._run, name=f"pgqueue-executor-{next(self._names)}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _take(self, park: threading.Lock) -> ClaimedJob | None:
        """The next waiting job, and another idle thread woken if more jobs wait; None
        if none waits (this thread is then parked on `park`, to be released by a wake-up).

        Jobs wait only while every awake thread runs one: a thread that finishes takes
        the next itself, without a thread switch.
        """
        wake = None
        with self._take_lock:
            if not self._work:
                if not self._stopping:
                    self._idle.append(park)
                return None
            item = self._work.popleft()
            if self._work and not self._waking and self._idle:
                self._waking += 1
                wake = self._idle.pop()
        if wake is not None:
            wake.release()
        return item

    def _run(self) -> None:
        epoch = self._db_epoch
        me = threading.current_thread()
        item: ClaimedJob | None = None
        park = threading.Lock()
        park.acquire()
        idled = False
        try:
            while not self._stopping:
                if (item := self._take(park)) is None:
                    if self._stopping:
                        return
                    park.acquire()  # idle until a wake-up releases it
                    with self._take_lock:
                        self._waking -= 1
                    idled = True
                    continue
                self._current[me] = item
                if idled:  # the server may have dropped a kept connection meanwhile
                    health_check_on_first_use()
                    idled = False
                if epoch != self._db_epoch:
                    # The dispatcher lost its connection since this thread's last job:
                    # a Django connection that died with it would fail the next job for
                    # nothing (and kill one with a single attempt). Replace it first.
                    epoch = self._db_epoch
                    close_unusable_django_connections()
                self._run_one(me, item)
                item = None
        except BaseException:
            if item is not None and not item.reported:  # it ended without an outcome
                self.wake_mark.returned()
            logger.exception("executor thread crashed")
            with self._crash_lock:
                self._crashes += 1
            self._wake.set()  # check_threads reports its job and replaces it
        finally:
            connections.close_all()

    def _run_one(self, me: threading.Thread, item: ClaimedJob) -> None:
        """Run one job and hand its outcome over once the handler's code returned."""
        item.thread = me
        outcome: Outcome | None = None
        try:
            item.started = time.monotonic()
            outcome = _execute(item, self.run)
            _returned(me, item, self._handoff)
        except executor.JobTimeout:
            # The timeout was decided as the handler returned, and its exception landed
            # here, in the worker's own code: the verdict stands.
            _returned(me, item, self._handoff)
        except SoftTimeLimitExceeded as exc:
            # Raised as the handler returned, in the worker's own code: the handler's
            # outcome stands, if it was had.
            _returned(me, item, self._handoff)
            outcome = outcome or executor.classify(exc, item.ctx, item.policy)
        item.runtime = time.monotonic() - item.started  # counted by `finished`
        _reset_connections(item)
        # Reported before it is put: a thread that dies now leaves its outcome
        # queued, and check_threads must not report the job a second time. Both under
        # `_handoff`, against the shutdown's `give_up`: reported means queued.
        with self._handoff:
            item.reported = True
            self._outcomes.put((item, item.verdict or outcome or _thread_died()))
        self._current.pop(me, None)
        self.wake_mark.returned()


def drain(outcomes: queue_module.SimpleQueue[Returned]) -> list[Returned]:
    """Everything on an outcomes queue now (the handler threads' or the event loop's)."""
    returned = []
    with contextlib.suppress(queue_module.Empty):
        while True:
            returned.append(outcomes.get_nowait())
    return returned


def give_up(items: list[ClaimedJob], handoff: threading.Lock) -> list[ClaimedJob]:
    """Of `items`, those whose handlers have not handed their outcomes over, resolved:
    a pool's `give_up`, under `handoff`, the lock its hand-over (`reported`, then the
    outcome queued) takes."""
    with handoff:
        running = [item for item in items if not item.reported]
        for item in running:
            item.resolved = True
    return running


def _returned(me: threading.Thread, item: ClaimedJob, handoff: threading.Lock) -> None:
    """The handler's code returned (or a timeout or soft limit landed in the worker's
    code as it did): marked under the pool's `handoff`, so the dispatcher raises nothing
    more in it; an exception raised before that and not landed yet is dropped, else it
    would land in the hand-over or the next job."""
    with handoff:
        item.returned = True
        raised = item.timed_out or item.soft_limited
    if raised:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(me.ident), None)


def _execute(item: ClaimedJob, run: Run) -> Outcome:
    """Run one job; whatever happens, return its outcome (never raise for the job)."""
    ctx = item.ctx
    try:
        ctx.payload = json.loads(item.payload_text)
    except BaseException as exc:  # ValueError; RecursionError when nested deep
        return executor.decode_failure(exc)
    # Through the middleware (job_started, an OpenTelemetry span) around the executor.
    try:
        return run(item, executor.run)
    except executor.JobTimeout:
        raise  # the pool's own (see _run_one)
    except BaseException as exc:  # a middleware that raised: still an outcome
        return executor.fallback_failure(exc)


def _reset_connections(item: ClaimedJob) -> None:
    """Ready the thread's Django connections for its next job (see `handler_connections`)."""
    try:
        reset_django_connections()
    except Exception:
        logger.exception(
            "job %d: resetting the Django connections failed",
            item.ctx.job_id,
            extra=item.facts(),
        )


def _thread_died() -> Failure:
    """The failure of a job whose handler thread ended without reporting an outcome."""
    return Retry(
        "django_pgqueue.HandlerThreadDied",
        "the handler thread ended without reporting the job's outcome; see the worker's log",
    )
