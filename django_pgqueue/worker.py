"""The worker: claim, run with bounded concurrency, renew leases, finish with fencing.

Threads of one worker process, each with its own database connection:

- the dispatcher (the thread that calls `Worker.run`): claims batches, one queue per
  statement, sized to the free handler slots; writes outcomes in batches; sweeps
  expired leases; takes back unstarted jobs on shutdown;
- `concurrency` executor threads: run handlers, outside any transaction;
- the heartbeat: renews every held lease in one statement every HEARTBEAT_INTERVAL,
  so a busy handler cannot starve it;
- the listener: LISTENs for enqueue notifications; polling covers for it when it is
  down;
- the signal thread (when the worker installs signal handlers): acts on SIGTERM/SIGINT,
  which the handler itself only queues.

Every write about a claimed job is fenced by its lease version, so whatever this
process believes, it can never overwrite the state of a newer owner.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import queue as queue_module
import secrets
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import psycopg
from django.db import connections

from . import executor, validation
from .conf import get_settings
from .context import JobContext, Lease
from .control.store import ControlledStore, sync_queue_controls
from .exceptions import ConfigurationError, DatabaseUnavailable, EnqueueError
from .executor import Failure, Outcome, Success
from .registry import Handler, Registry
from .registry import registry as default_registry
from .retry import RetryPolicy, default_policy
from .store import Backoff, ClaimedRow, ClaimKey, Store, wait_for

logger = logging.getLogger(__name__)

SWEEP_BATCH = 1000
# How long a finished job's outcome may wait so that it is written together with
# others (and with the next claim). Short against any job worth queueing.
FLUSH_DELAY = 0.005
# How long the listener blocks waiting for a NOTIFY before it checks for shutdown.
LISTEN_TIMEOUT = 0.25
# How long a claim may resume after the last key this worker claimed from a queue
# before it walks the queue's claim-index entries from the start again. Every claimed
# job leaves a dead entry at the start until VACUUM, and walking them all on every
# claim slows a long drain several-fold; resuming skips them. A job that sorts before
# that key (a higher priority, or an earlier run_at: a requeued job) is seen at the
# next full walk: at most this long after it is due, or at once when the resumed
# claim comes back short.
RESUME_TTL = 0.5


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs to run; `build` fills gaps from PGQUEUE and validates."""

    queues: tuple[str, ...]
    concurrency: int
    batch_size: int
    lease: float
    heartbeat_interval: float
    poll_interval: float
    sweep_interval: float
    shutdown_grace: float
    job_timeout: float | None
    reconnect_max_delay: float
    database: str
    worker_id: str
    burst: bool = False
    weights: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        queues: Iterable[str],
        *,
        concurrency: int | None = None,
        batch_size: int | None = None,
        lease: float | None = None,
        heartbeat_interval: float | None = None,
        poll_interval: float | None = None,
        sweep_interval: float | None = None,
        shutdown_grace: float | None = None,
        job_timeout: float | None = None,
        weights: Mapping[str, int] | None = None,
        burst: bool = False,
        worker_id: str | None = None,
        database: str | None = None,
    ) -> WorkerConfig:
        conf = get_settings()
        names = tuple(queues)
        if not names:
            raise ConfigurationError("A worker needs at least one queue.")
        try:
            for name in names:
                validation.queue_name(name, "queue")
        except EnqueueError as exc:
            raise ConfigurationError(str(exc)) from None
        if len(set(names)) != len(names):
            raise ConfigurationError(f"Queue names repeat in {list(names)}.")
        weights = dict(weights or {})
        for name, weight in weights.items():
            if name not in names:
                raise ConfigurationError(
                    f"Weight given for {name!r}, which is not one of the worker's queues "
                    f"({', '.join(names)})."
                )
            if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 1000:
                raise ConfigurationError(f"Weight of {name!r} must be 1..1000, got {weight!r}.")

        def positive(name: str, value: float | None, default: float) -> float:
            value = default if value is None else value
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigurationError(f"{name} must be a number > 0, got {value!r}.")
            return float(value)

        def count(name: str, value: int | None, default: int) -> int:
            value = default if value is None else value
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be an integer >= 1, got {value!r}.")
            return value

        lease_s = positive("lease", lease, conf.LEASE)
        if heartbeat_interval is None:
            # The configured interval, unless this worker's lease is shorter than the
            # settings' lease: renew at a third of whatever lease is in force.
            heartbeat_interval = min(conf.HEARTBEAT_INTERVAL, lease_s / 3)
        heartbeat = positive("heartbeat_interval", heartbeat_interval, lease_s / 3)
        if heartbeat > lease_s / 2:
            raise ConfigurationError(
                f"heartbeat_interval ({heartbeat:g}s) must be at most half the lease "
                f"({lease_s:g}s), so a lease is renewed well before it ends."
            )
        grace = conf.SHUTDOWN_GRACE if shutdown_grace is None else shutdown_grace
        if isinstance(grace, bool) or not isinstance(grace, int | float) or grace < 0:
            raise ConfigurationError(f"shutdown_grace must be >= 0 seconds, got {grace!r}.")
        timeout = conf.JOB_TIMEOUT if job_timeout is None else job_timeout
        if timeout is not None:
            timeout = positive("job_timeout", timeout, 1.0)
        ident = worker_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        if not isinstance(ident, str) or len(ident) > 200 or "\x00" in ident:
            raise ConfigurationError(
                f"worker_id must be a string of at most 200 characters: {ident!r}"
            )
        return cls(
            queues=names,
            concurrency=count("concurrency", concurrency, conf.CONCURRENCY),
            batch_size=count("batch_size", batch_size, conf.BATCH_SIZE),
            lease=lease_s,
            heartbeat_interval=heartbeat,
            poll_interval=positive("poll_interval", poll_interval, conf.POLL_INTERVAL),
            sweep_interval=positive("sweep_interval", sweep_interval, conf.SWEEP_INTERVAL),
            shutdown_grace=float(grace),
            job_timeout=timeout,
            reconnect_max_delay=conf.RECONNECT_MAX_DELAY,
            database=database or conf.DATABASE,
            worker_id=ident,
            burst=burst,
            weights=weights,
        )


class QueueScheduler:
    """Smooth weighted round robin: with weights payments=3, email=1, payments gets three
    claim turns for every one of email, interleaved. Unweighted queues weigh 1."""

    def __init__(self, queues: tuple[str, ...], weights: Mapping[str, int]) -> None:
        self.queues = queues
        self.weights = {name: weights.get(name, 1) for name in queues}
        self.total = sum(self.weights.values())
        self.current = dict.fromkeys(queues, 0)

    def order(self) -> list[str]:
        """All queues, the one whose turn it is first, then the others in rotation."""
        for name in self.queues:
            self.current[name] += self.weights[name]
        first = max(self.queues, key=lambda name: self.current[name])
        self.current[first] -= self.total
        start = self.queues.index(first)
        return [*self.queues[start:], *self.queues[:start]]


class InFlight:
    """A claimed job from dispatch until its outcome is written."""

    __slots__ = (
        "attempt_id",
        "ctx",
        "handler",
        "lease",
        "payload_text",
        "policy",
        "resolved",
        "started",
        "thread",
        "timed_out",
        "timeout",
    )

    def __init__(
        self,
        ctx: JobContext,
        lease: Lease,
        attempt_id: int,
        handler: Handler | None,
        payload_text: str,
        policy: RetryPolicy,
        timeout: float | None,
    ) -> None:
        self.ctx = ctx
        self.attempt_id = attempt_id
        self.lease = lease
        self.handler = handler
        self.payload_text = payload_text
        self.policy = policy
        self.timeout = timeout
        self.started: float | None = None
        self.thread: threading.Thread | None = None
        self.timed_out = False
        self.resolved = False


class Worker:
    """Runs jobs from one or more queues until stopped (or, in burst mode, until idle)."""

    def __init__(
        self,
        queues: Iterable[str],
        *,
        registry: Registry | None = None,
        install_signal_handlers: bool = True,
        **options: Any,
    ) -> None:
        self.config = WorkerConfig.build(queues, **options)
        self.registry = registry or default_registry
        self.install_signal_handlers = install_signal_handlers
        self.stats: Counter[str] = Counter()
        self.heartbeat_gaps: list[float] = []
        self._scheduler = QueueScheduler(self.config.queues, self.config.weights)
        # issue 14: ControlledStore routes controlled queues' claims, snoozes, cancel marks.
        self._store = ControlledStore(
            self.config.database,
            f"pgqueue worker {self.config.worker_id}",
            self.config.poll_interval,
        )
        self._work: queue_module.SimpleQueue[InFlight | None] = queue_module.SimpleQueue()
        self._outcomes: queue_module.SimpleQueue[tuple[InFlight, Outcome]] = (
            queue_module.SimpleQueue()
        )
        self._leases: dict[int, Lease] = {}
        self._leases_lock = threading.Lock()
        self._inflight: dict[int, InFlight] = {}
        self._unwritten: list[tuple[InFlight, Outcome]] = []
        self._unwritten_since = 0.0
        self._uncertain: list[tuple[InFlight, Outcome]] = []
        self._unstorable: set[int] = set()
        self._timed: dict[int, InFlight] = {}  # in flight with a timeout
        self._retry_due = 0.0  # when the latest imminent retry written by this worker is due
        # Jobs handed to executors and finished by them, and the finished count at
        # which an executor wakes the dispatcher (see _sleep).
        self._count_lock = threading.Lock()
        self._handed = 0
        self._finished_n = 0
        self._wake_at = 1
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._force = threading.Event()
        self._service_stop = threading.Event()
        self._empty_until: dict[str, float] = {}
        # Per queue: the key of the last job claimed, and until when to resume after it.
        self._resume: dict[str, tuple[ClaimKey, float]] = {}
        self._notified: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._signals: queue_module.SimpleQueue[int | None] = queue_module.SimpleQueue()
        self._executors: list[threading.Thread] = []
        self._stuck = 0
        self._policy = default_policy()
        self._backoff = Backoff(self.config.reconnect_max_delay)
        # Grows each time the dispatcher gets its connection back after losing it: the
        # database restarted or cut this process off, so the handler threads' own
        # Django connections are likely dead too (see _executor_loop).
        self._db_epoch = 0
        self.exit_code = 0

    # -- public ---------------------------------------------------------------------

    @property
    def worker_id(self) -> str:
        return self.config.worker_id

    def stop(self, *, force: bool = False) -> None:
        """Stop claiming and shut down; force skips the grace period for running handlers."""
        if force or self._stopping.is_set():
            self._force.set()
        self._stopping.set()
        self._wake.set()

    def run(self) -> int:
        """Run until stopped; return the process exit code (0 after a graceful stop)."""
        cfg = self.config
        self.registry.autodiscover()
        sync_queue_controls(cfg.database)  # issue 14: PGQUEUE["QUEUES"] into queue_controls
        restore = self._install_signals() if self.install_signal_handlers else None
        if restore:
            self._start_service(self._signal_loop, "signals")
        logger.info(
            "worker %s starting: queues=%s concurrency=%d batch=%d lease=%gs heartbeat=%gs",
            cfg.worker_id,
            ",".join(cfg.queues),
            cfg.concurrency,
            cfg.batch_size,
            cfg.lease,
            cfg.heartbeat_interval,
        )
        for _ in range(cfg.concurrency):
            self._spawn_executor()
        self._start_service(self._heartbeat_loop, "heartbeat")
        self._start_service(self._listen_loop, "listener")
        try:
            self._dispatch_loop()
        finally:
            try:
                self._shutdown()
            finally:
                if restore:
                    restore()
        logger.info("worker %s stopped: %s", cfg.worker_id, dict(self.stats))
        return self.exit_code

    # -- signals ----------------------------------------------------------------------

    def _install_signals(self) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return None
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            # A handler runs in the main thread between any two of its bytecodes, even
            # inside `self._wake.wait()` while it holds that Event's lock, which stop()
            # would take again: a deadlock. So it takes no lock (SimpleQueue.put is
            # reentrant) and the signal thread does the rest.
            self._signals.put(signum)

        for sig in previous:
            signal.signal(sig, on_signal)

        def restore() -> None:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore

    def _signal_loop(self) -> None:
        """Act on the SIGTERM/SIGINT that on_signal queued: stop, or stop now if stopping."""
        while (signum := self._signals.get()) is not None:
            name = signal.Signals(signum).name
            if self._stopping.is_set():
                logger.warning("second %s: stopping now", name)
                self.stop(force=True)
            else:
                logger.warning(
                    "%s: no more claims; running handlers get %gs to finish",
                    name,
                    self.config.shutdown_grace,
                )
                self.stop()

    # -- dispatcher -------------------------------------------------------------------

    def _dispatch_loop(self) -> None:
        cfg = self.config
        next_sweep = 0.0
        while not self._stopping.is_set():
            try:
                if not self._store.connected:
                    self._reconnect()
                    continue
                self._wake.clear()
                self._collect_outcomes()
                self._check_timeouts()
                if self._stopping.is_set():
                    break
                now = time.monotonic()
                if now >= next_sweep:
                    self._sweep()
                    next_sweep = now + cfg.sweep_interval
                if self._cycle(now):
                    continue
                if cfg.burst and self._idle():
                    logger.info("worker %s: queues empty, burst done", cfg.worker_id)
                    return
                self._sleep(self._idle_timeout(next_sweep))
            except DatabaseUnavailable as exc:
                logger.warning("worker %s: %s", cfg.worker_id, exc)
                self._store.close()
            except psycopg.Error as exc:
                # A statement error (a timeout, a refused value): the session is still
                # usable; the fenced statements make a retry of the cycle safe.
                logger.exception("worker %s: database error: %s", cfg.worker_id, exc)
                self._stopping.wait(0.5)

    def _reconnect(self) -> None:
        if not wait_for(self._store, self._force, self._backoff, f"worker {self.worker_id}"):
            return
        self._db_epoch += 1
        self._empty_until.clear()  # anything may have arrived while we were away
        self._resume.clear()
        self._resolve_uncertain()
        # The leases this worker holds may have run out while it was cut off. Before
        # its next sweep (the first thing the loop does) could requeue them, write
        # what finished meanwhile and renew what still runs. Another worker's sweep
        # may have been first: the fenced writes tell, and the job runs again.
        self._collect_outcomes()
        self._write_outcomes()
        self._renew_held()

    def _renew_held(self) -> None:
        held = self._held_leases()
        if held:
            self._renew(self._store, held, time.monotonic())

    def _held_leases(self) -> list[Lease]:
        with self._leases_lock:
            return [lease for lease in self._leases.values() if not lease.lost]

    def _renew(self, store: Store, held: list[Lease], sent: float) -> None:
        """Renew `held` through `store`; extend what was kept, mark the rest lost."""
        kept = store.renew(
            [(lease.job_id, lease.lease_version) for lease in held], self.config.lease
        )
        cancelled = getattr(store, "cancel_requested", ())  # issue 14
        for lease in held:
            if lease.job_id in kept:
                lease.expires = sent + self.config.lease
                lease.cancel_requested = lease.job_id in cancelled
            elif not lease.lost and not lease.finishing:
                lease.lost = True
                self.stats["leases_lost"] += 1
                logger.warning(
                    "lease lost: job %d (lease_version %d) is no longer this worker's",
                    lease.job_id,
                    lease.lease_version,
                )

    def _idle(self) -> bool:
        """Burst mode's exit test: nothing running, nothing due, no retry about to be."""
        return (
            not self._inflight
            and not self._unwritten
            and not self._uncertain
            and time.monotonic() >= self._retry_due
            and all(name in self._empty_until for name in self.config.queues)
        )

    def _idle_timeout(self, next_sweep: float) -> float:
        now = time.monotonic()
        deadline = min(next_sweep, now + self.config.poll_interval)
        if self._unwritten:
            deadline = min(deadline, self._unwritten_since + FLUSH_DELAY)
        if self._empty_until:
            deadline = min(deadline, min(self._empty_until.values()))
        for item in self._timed.values():
            if item.timeout is not None and item.started is not None and not item.timed_out:
                deadline = min(deadline, item.started + item.timeout)
        return max(0.0, deadline - now)

    def _sleep(self, timeout: float) -> None:
        """Wait for a reason to act: an outcome worth collecting, a NOTIFY, a signal.

        Executors wake the dispatcher only when the count of finished jobs reaches
        `_wake_at`: the first outcome after a flush (it starts the FLUSH_DELAY clock),
        or the last job in flight. Waking on every outcome would cost a thread switch
        per job.
        """
        with self._count_lock:
            if self._unwritten and self._inflight:
                self._wake_at = self._handed
            else:
                self._wake_at = self._finished_n + 1
        # An executor that finished before the line above put its outcome first.
        if self._outcomes.empty():
            self._wake.wait(timeout)

    def _refresh_empty_marks(self, now: float) -> bool:
        """Forget 'empty' marks that expired or were contradicted by a NOTIFY; any left to try?"""
        if self._notified:
            notified, self._notified = self._notified, set()
            for name in notified:
                self._empty_until.pop(name, None)
        for name, until in list(self._empty_until.items()):
            if until <= now:
                del self._empty_until[name]
        return len(self._empty_until) < len(self.config.queues)

    def _cycle(self, now: float) -> bool:
        """Write finished outcomes and claim more, batching both; False if nothing to do.

        Outcomes wait up to FLUSH_DELAY (or until the batch is done) so that one
        transaction completes many jobs and claims the next batch in the same round
        trip; a claim waits for pending outcomes for the same reason.
        """
        cfg = self.config
        free = cfg.concurrency - len(self._inflight)
        # issue 14: a finished job of a controlled queue holds a slot until its outcome is
        # written: write it now (no batching delay) and claim the slot back in the same
        # transaction.
        frees_slot = False
        for item, _ in self._unwritten:
            if self._store.frees_slots(item.ctx.queue):
                frees_slot = True
                self._empty_until.pop(item.ctx.queue, None)
        flush_due = bool(self._unwritten) and (
            frees_slot
            or not self._inflight
            or len(self._unwritten) >= cfg.batch_size
            or now - self._unwritten_since >= FLUSH_DELAY
        )
        claim_ok = (
            free > 0
            and not self._stopping.is_set()
            and (flush_due or not self._unwritten)
            and self._refresh_empty_marks(now)
        )
        if not (flush_due or claim_ok):
            return False
        order = (
            [name for name in self._scheduler.order() if name not in self._empty_until]
            if claim_ok
            else []
        )
        limit = min(cfg.batch_size, free)
        after = self._resume_after(order[0], now) if order else None
        claim = (order[0], limit, cfg.worker_id, cfg.lease, after) if order else None
        sent = time.monotonic()
        rows = self._write(self._take_unwritten() if flush_due else [], claim)
        if claim is not None:
            self._take(order[0], limit, after, rows, sent)
            for name in order[1:]:
                free = cfg.concurrency - len(self._inflight)
                if free <= 0 or self._stopping.is_set():
                    break
                limit = min(cfg.batch_size, free)
                sent = time.monotonic()
                after = self._resume_after(name, sent)
                rows = self._store.claim(name, limit, cfg.worker_id, cfg.lease, after)
                self._take(name, limit, after, rows, sent)
        return True

    def _resume_after(self, queue: str, now: float) -> ClaimKey | None:
        """The key a claim from `queue` may resume after, if one is still fresh."""
        resume = self._resume.get(queue)
        return resume[0] if resume is not None and now < resume[1] else None

    def _take(
        self, queue: str, limit: int, after: ClaimKey | None, rows: list[ClaimedRow], sent: float
    ) -> None:
        """Accept a claim's rows; a resumed claim that came back short claims the rest
        with a walk from the start, which may find jobs that sort before its key."""
        if after is not None:
            self.stats["claims_resumed"] += 1
        self._accept_claim(queue, limit, rows, sent, resumed=after is not None)
        self._remember(queue, limit, after, rows, sent)
        if after is None or len(rows) >= limit or self._stopping.is_set():
            return
        rest = limit - len(rows)
        sent = time.monotonic()
        more = self._claim_or_log(queue, rest)
        self._accept_claim(queue, rest, more, sent)
        self._remember(queue, rest, None, more, sent)

    def _remember(
        self, queue: str, limit: int, after: ClaimKey | None, rows: list[ClaimedRow], sent: float
    ) -> None:
        """Note where the next claim from `queue` may resume (see RESUME_TTL)."""
        if len(rows) < limit:
            if after is None:
                self._resume.pop(queue, None)  # a full walk found the queue drained
            return  # a short resumed claim: the walk from the start that follows decides
        last = max(rows, key=ClaimedRow.order)
        fresh = self._resume.get(queue)
        until = sent + RESUME_TTL if after is None or fresh is None else fresh[1]
        self._resume[queue] = ((last.priority, last.run_at, last.job_id), until)

    def _accept_claim(
        self, queue: str, limit: int, rows: list[ClaimedRow], sent: float, *, resumed: bool = False
    ) -> int:
        if len(rows) < limit and not resumed:
            # issue 14: a claim cut by a limit is tried again as soon as it could succeed.
            self._empty_until[queue] = sent + self._store.recheck_after(
                queue, self.config.poll_interval
            )
        if rows and self._stopping.is_set():
            # The signal came while this claim was on the wire: these jobs have not
            # started, so they go back now rather than run after the signal.
            self.stats["claimed"] += len(rows)
            self._release([(row.job_id, row.lease_version, row.attempt_id) for row in rows])
            return 0
        if rows:
            logger.info("claimed %d job(s) from %s", len(rows), queue)
            self._dispatch(rows, sent + self.config.lease)
        return len(rows)

    def _dispatch(self, rows: list[ClaimedRow], expires: float) -> None:
        cfg = self.config
        self.stats["claimed"] += len(rows)
        if len(rows) > 1:
            rows.sort(key=ClaimedRow.order)
        items = []
        for row in rows:
            lease = Lease(row.job_id, row.lease_version, expires)
            handler = self.registry.find(row.type)
            ctx = JobContext(
                job_id=row.job_id,
                queue=row.queue,
                type=row.type,
                payload=None,
                attempt=row.attempt,
                max_attempts=row.max_attempts,
                lease_version=row.lease_version,
                priority=row.priority,
                worker_id=cfg.worker_id,
                created_at=row.created_at,
                user_key=row.idempotency_key,
                lease=lease,
            )
            if handler is None:
                policy, timeout = self._policy, cfg.job_timeout
            else:
                policy = handler.retry or self._policy
                timeout = handler.timeout or cfg.job_timeout
            item = InFlight(ctx, lease, row.attempt_id, handler, row.payload, policy, timeout)
            self._inflight[row.job_id] = item
            if timeout is not None:
                self._timed[row.job_id] = item
            items.append(item)
        with self._leases_lock:
            for item in items:
                self._leases[item.lease.job_id] = item.lease
        with self._count_lock:
            self._handed += len(items)
        for item in items:
            self._work.put(item)

    # -- outcomes ---------------------------------------------------------------------

    def _collect_outcomes(self) -> None:
        while True:
            try:
                item, outcome = self._outcomes.get_nowait()
            except queue_module.Empty:
                return
            if item.resolved:
                continue  # a timed-out handler came back after its failure was recorded
            item.resolved = True
            self._drop_inflight(item)
            self._add_unwritten(item, outcome)

    def _add_unwritten(self, item: InFlight, outcome: Outcome) -> None:
        if not self._unwritten:
            self._unwritten_since = time.monotonic()
        self._unwritten.append((item, outcome))

    def _take_unwritten(self) -> list[tuple[InFlight, Outcome]]:
        batch, self._unwritten = self._unwritten, []
        return batch

    def _write(
        self,
        batch: list[tuple[InFlight, Outcome]],
        claim: tuple[str, int, str, float, ClaimKey | None] | None,
    ) -> list[ClaimedRow]:
        """Write a batch of outcomes (all completions in one statement), then claim."""
        successes = [(item, out) for item, out in batch if isinstance(out, Success)]
        failures = [(item, out) for item, out in batch if isinstance(out, Failure)]
        for item, _ in batch:
            item.lease.finishing = True  # a renewal racing this write must not cry "lost"
        done = [(i.ctx.job_id, i.ctx.lease_version, i.attempt_id, o.result) for i, o in successes]
        remaining: list[tuple[InFlight, Outcome]] = list(batch)  # not known to be written
        self._unstorable.clear()
        if done and not failures and claim is not None:
            # The common case: completions and the next claim in one round trip and
            # one commit. Any refusal undoes both; they are then written one by one.
            try:
                completed, claimed = self._store.complete_and_claim(done, *claim)
            except DatabaseUnavailable:
                self._uncertain.extend(remaining)
                raise
            except psycopg.Error as exc:
                logger.warning("completing and claiming together failed (%s); apart now", exc)
            else:
                self._account_completions(successes, completed)
                return claimed
        try:
            try:
                completed = self._store.complete(done)
            except psycopg.Error as exc:  # a value PostgreSQL refused, not a lost connection
                logger.error(
                    "completing %d job(s) failed (%s); writing them one by one", len(done), exc
                )
                completed = self._complete_one_by_one(successes)
            remaining = list(failures)
            self._account_completions(successes, completed)
            while remaining:
                item, outcome = remaining[0]
                assert isinstance(outcome, Failure)
                self._log_failure(item, outcome, self._fail(item, outcome))
                self._forget(item)
                remaining.pop(0)
        except DatabaseUnavailable:
            # The COMMIT of what was being written may or may not have happened.
            self._uncertain.extend(remaining)
            raise
        return [] if claim is None else self._claim_or_log(claim[0], claim[1], claim[4])

    def _claim_or_log(
        self, queue: str, limit: int, after: ClaimKey | None = None
    ) -> list[ClaimedRow]:
        """Claim; a statement error (not a lost connection) is logged and claims nothing."""
        try:
            return self._store.claim(queue, limit, self.config.worker_id, self.config.lease, after)
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
                raise
            logger.error("claim from %s failed: %s", queue, exc)
            return []

    def _account_completions(
        self, successes: list[tuple[InFlight, Outcome]], completed: set[int]
    ) -> None:
        for item, _ in successes:
            if item.ctx.job_id in completed:
                self.stats["completed"] += 1
            elif item.ctx.job_id not in self._unstorable:
                self._stale(item, "complete")
            self._forget(item)

    def _fail(self, item: InFlight, outcome: Failure) -> tuple[str, Any] | None:
        """Write one failure; if PostgreSQL refuses its text, write a plainer one."""
        ctx = item.ctx
        try:
            return self._store.fail(ctx.job_id, ctx.lease_version, item.attempt_id, outcome)
        except DatabaseUnavailable:
            raise
        except psycopg.Error as exc:
            logger.error("recording the failure of job %d was refused: %s", ctx.job_id, exc)
            plain = Failure(
                executor.storable(outcome.error_class, 255),
                executor.storable(repr(outcome.message), executor.MESSAGE_LIMIT),
                "",
                permanent=outcome.permanent,
                delay=outcome.delay,
            )
            return self._store.fail(ctx.job_id, ctx.lease_version, item.attempt_id, plain)

    def _complete_one_by_one(self, successes: list[tuple[InFlight, Outcome]]) -> set[int]:
        completed: set[int] = set()
        for item, outcome in successes:
            ctx = item.ctx
            assert isinstance(outcome, Success)
            try:
                completed |= self._store.complete(
                    [(ctx.job_id, ctx.lease_version, item.attempt_id, outcome.result)]
                )
            except DatabaseUnavailable:
                raise
            except psycopg.Error as exc:
                # The job ran; its result cannot be stored: dead, so it is not re-run.
                self._unstorable.add(ctx.job_id)
                failure = executor.unstorable_result(outcome.result, exc)
                self._log_failure(item, failure, self._fail(item, failure))
        return completed

    def _write_outcomes(self) -> None:
        if self._unwritten:
            self._write(self._take_unwritten(), None)

    def _log_failure(
        self, item: InFlight, outcome: Failure, result: tuple[str, Any] | None
    ) -> None:
        ctx = item.ctx
        if result is None:
            self._stale(item, "fail")
            return
        status, _run_at = result
        if outcome.snoozed or status == "cancelled":  # issue 14
            self.stats["snoozed" if status == "pending" else "cancelled"] += 1
            logger.info("job %d (%s) %s: %s", ctx.job_id, ctx.type, status, outcome.message)
            return
        if status == "dead":
            self.stats["dead"] += 1
            logger.error(
                "job %d (%s) dead after attempt %d/%d: %s",
                ctx.job_id,
                ctx.type,
                ctx.attempt,
                ctx.max_attempts,
                outcome.last_error,
            )
        else:
            self.stats["retried"] += 1
            logger.warning(
                "job %d (%s) failed attempt %d/%d, retry in %.2fs: %s",
                ctx.job_id,
                ctx.type,
                ctx.attempt,
                ctx.max_attempts,
                outcome.delay,
                outcome.last_error,
            )
            if outcome.delay <= self.config.poll_interval:
                # No NOTIFY announces a retry: look at the queue again when it is due,
                # and let a burst worker wait for it rather than exit.
                due = time.monotonic() + outcome.delay
                self._empty_until[ctx.queue] = min(self._empty_until.get(ctx.queue, due), due)
                self._retry_due = max(self._retry_due, due)

    def _stale(self, item: InFlight, what: str) -> None:
        self.stats["stale_writes"] += 1
        logger.warning(
            "stale write rejected: %s of job %d with lease_version %d changed nothing; "
            "another worker owns it now",
            what,
            item.ctx.job_id,
            item.ctx.lease_version,
        )

    def _drop_inflight(self, item: InFlight) -> None:
        # Only this claim's entry: after losing its lease, this worker may have claimed
        # the same job again while the old handler still ran.
        if self._inflight.get(item.ctx.job_id) is item:
            del self._inflight[item.ctx.job_id]

    def _forget(self, item: InFlight) -> None:
        with self._leases_lock:
            # Only this claim's lease: dropping a newer claim's lease of the same job
            # would stop its renewals, and the sweep would take the job from under it.
            if self._leases.get(item.ctx.job_id) is item.lease:
                del self._leases[item.ctx.job_id]

    def _resolve_uncertain(self) -> None:
        """After a lost connection: read back whether the writes in doubt landed."""
        if not self._uncertain:
            return
        pending, self._uncertain = self._uncertain, []
        try:
            statuses = self._store.attempt_statuses([item.attempt_id for item, _ in pending])
        except DatabaseUnavailable:
            self._uncertain = pending + self._uncertain
            raise
        for item, outcome in pending:
            status = statuses.get(item.attempt_id)
            # Warnings, like the lost connection that put the write in doubt.
            if status == "running":
                item.lease.finishing = False  # it did not land: renew it and write again
                self._add_unwritten(item, outcome)
                logger.warning(
                    "job %d: the write in doubt had not landed; writing it again",
                    item.ctx.job_id,
                )
            elif status in ("succeeded", "failed"):
                self.stats["completed" if status == "succeeded" else "failed_written"] += 1
                self._forget(item)
                logger.warning(
                    "job %d: the write in doubt had landed (%s)", item.ctx.job_id, status
                )
            else:
                self._forget(item)
                self._stale(item, "write after reconnect")

    # -- timeouts ---------------------------------------------------------------------

    def _check_timeouts(self) -> None:
        if not self._timed:
            return
        now = time.monotonic()
        for item in list(self._timed.values()):
            if item.resolved:
                del self._timed[item.ctx.job_id]
                continue
            if item.started is None or item.timed_out or now - item.started < item.timeout:
                continue
            item.timed_out = True
            item.resolved = True
            del self._timed[item.ctx.job_id]
            self._drop_inflight(item)
            logger.error(
                "job %d (%s) exceeded its timeout of %gs; failing it and replacing its thread",
                item.ctx.job_id,
                item.ctx.type,
                item.timeout,
            )
            self.stats["timed_out"] += 1
            self._add_unwritten(item, executor.timed_out(item.ctx, item.timeout, item.policy))
            thread = item.thread
            if thread is not None and thread.ident is not None:
                # Best effort: raises JobTimeout in the handler at its next bytecode. A
                # handler blocked in C code only notices when that call returns.
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(thread.ident), ctypes.py_object(executor.JobTimeout)
                )
            self._stuck += 1
            if self._stuck > self.config.concurrency:
                logger.critical(
                    "worker %s: %d handlers are stuck past their timeout; exiting so a "
                    "supervisor can restart the process",
                    self.worker_id,
                    self._stuck,
                )
                self.exit_code = 1
                self.stop()
            else:
                self._spawn_executor()

    # -- sweep ------------------------------------------------------------------------

    def _sweep(self) -> None:
        for job_id, queue, lost_version, status in self._store.sweep(SWEEP_BATCH):
            self.stats["swept"] += 1
            self._resume.pop(queue, None)  # a requeued job keeps its place: walk from the start
            logger.warning(
                "lease of job %d (queue %s, lease_version %d) expired; %s",
                job_id,
                queue,
                lost_version,
                "requeued" if status == "pending" else "attempts spent, job is dead",
            )

    # -- executors --------------------------------------------------------------------

    def _spawn_executor(self) -> None:
        thread = threading.Thread(
            target=self._executor_loop,
            name=f"pgqueue-executor-{len(self._executors)}",
            daemon=True,
        )
        self._executors.append(thread)
        thread.start()

    def _executor_loop(self) -> None:
        epoch = self._db_epoch
        try:
            while True:
                item = self._work.get()
                if item is None:
                    return
                if epoch != self._db_epoch:
                    # The dispatcher lost its connection since this thread's last job: a
                    # Django connection that died with it would fail the next job for
                    # nothing (and kill one with a single attempt). Replace it first.
                    epoch = self._db_epoch
                    _close_unusable_django_connections()
                item.thread = threading.current_thread()
                item.started = time.monotonic()
                outcome = self._execute(item)
                self._outcomes.put((item, outcome))
                with self._count_lock:
                    self._finished_n += 1
                    finished = self._finished_n
                if finished >= self._wake_at:
                    self._wake.set()
                if item.timed_out:
                    return  # a replacement thread took this one's place
        except BaseException:
            if not (item is not None and item.timed_out):
                logger.exception("executor thread crashed")
        finally:
            connections.close_all()

    def _execute(self, item: InFlight) -> Outcome:
        ctx = item.ctx
        try:
            ctx.payload = json.loads(item.payload_text)
        except ValueError as exc:
            return Failure(*executor.describe(exc), permanent=True)
        try:
            return executor.run(ctx, item.handler, item.policy)
        finally:
            _reset_django_connections()

    # -- heartbeat --------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        cfg = self.config
        store = ControlledStore(cfg.database, f"pgqueue heartbeat {cfg.worker_id}")  # issue 14
        backoff = Backoff(cfg.reconnect_max_delay)
        last = time.monotonic()
        try:
            while not self._service_stop.wait(cfg.heartbeat_interval):
                held = self._held_leases()
                if not held:
                    last = time.monotonic()
                    continue
                if not store.connected and not wait_for(
                    store, self._service_stop, backoff, "heartbeat"
                ):
                    return
                sent = time.monotonic()
                try:
                    self._renew(store, held, sent)
                except DatabaseUnavailable as exc:
                    logger.warning("heartbeat: %s", exc)
                    continue
                except Exception:  # a statement error must not end the renewals
                    logger.exception("heartbeat: renewing %d lease(s) failed", len(held))
                    continue
                self.heartbeat_gaps.append(sent - last)
                last = sent
        finally:
            store.close()

    # -- listener ---------------------------------------------------------------------

    def _listen_loop(self) -> None:
        cfg = self.config
        store = Store(cfg.database, f"pgqueue listener {cfg.worker_id}")
        backoff = Backoff(cfg.reconnect_max_delay)
        wanted = set(cfg.queues)
        try:
            while not self._service_stop.is_set():
                if not store.connected:
                    if not wait_for(store, self._service_stop, backoff, "listener"):
                        return
                    try:
                        store.listen()
                    except DatabaseUnavailable as exc:
                        logger.warning("listener: %s", exc)
                        continue
                    # Notifications sent while we were not listening are gone: look.
                    self._notified.update(wanted)
                    self._wake.set()
                try:
                    for name in store.notifications(timeout=LISTEN_TIMEOUT):
                        if name in wanted:
                            self._notified.add(name)
                            self._wake.set()
                except DatabaseUnavailable as exc:
                    logger.warning("listener: %s", exc)
                except Exception:  # polling covers while the listener recovers
                    logger.exception("listener failed; reconnecting")
                    store.close()
                    self._service_stop.wait(backoff.next_delay())
        finally:
            store.close()

    def _start_service(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=f"pgqueue-{name}", daemon=True)
        self._threads.append(thread)
        thread.start()

    # -- shutdown ---------------------------------------------------------------------

    def _shutdown(self) -> None:
        cfg = self.config
        unstarted: list[InFlight] = []
        while True:
            try:
                item = self._work.get_nowait()
            except queue_module.Empty:
                break
            if item is not None:
                unstarted.append(item)
        for _ in self._executors:
            self._work.put(None)
        for item in unstarted:
            item.resolved = True
            self._drop_inflight(item)
        if unstarted:
            self._release(
                [(item.ctx.job_id, item.ctx.lease_version, item.attempt_id) for item in unstarted]
            )

        deadline = time.monotonic() + cfg.shutdown_grace
        while self._inflight or self._unwritten or self._uncertain:
            if self._force.is_set() or time.monotonic() >= deadline:
                break
            self._wake.wait(0.05)
            self._wake.clear()
            self._collect_outcomes()
            self._check_timeouts()
            try:
                if not self._store.connected:
                    self._reconnect()
                self._write_outcomes()
            except DatabaseUnavailable as exc:
                logger.warning("shutdown: %s", exc)
                self._store.close()
                self._force.wait(min(0.5, max(0.0, deadline - time.monotonic())))

        interrupted = [item for item in self._inflight.values() if not item.resolved]
        for item in interrupted:
            item.resolved = True
            self._add_unwritten(
                item,
                Failure(
                    "django_pgqueue.WorkerShutdown",
                    f"worker {cfg.worker_id} stopped before the handler finished",
                    "",
                    permanent=False,
                    delay=0.0,
                ),
            )
        self._inflight.clear()
        if interrupted:
            logger.warning(
                "shutdown: %d handler(s) still running; their jobs are retried", len(interrupted)
            )
        try:
            if not self._store.connected:
                self._store.connect()
            self._resolve_uncertain()
            self._write_outcomes()
        except DatabaseUnavailable as exc:
            logger.warning(
                "shutdown: could not write %d outcome(s) (%s); their leases will expire and "
                "the sweep will requeue them",
                len(self._unwritten) + len(self._uncertain),
                exc,
            )
        self._service_stop.set()
        self._signals.put(None)
        for thread in self._threads:
            thread.join(timeout=5)
        self._store.close()

    def _release(self, held: list[tuple[int, int, int]]) -> None:
        """Hand back claimed, never-started (job_id, lease_version, attempt_id)."""
        try:
            if not self._store.connected:
                self._store.connect()
            released = self._store.release(held)
        except DatabaseUnavailable as exc:
            logger.warning(
                "shutdown: could not hand back %d unstarted job(s) (%s); the sweep will",
                len(held),
                exc,
            )
            return
        with self._leases_lock:
            for job_id, _, _ in held:
                self._leases.pop(job_id, None)
        self.stats["released"] += len(released)
        logger.info("shutdown: handed back %d unstarted job(s)", len(released))


def _close_unusable_django_connections() -> None:
    """Close this thread's Django connections that no longer answer a query."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is not None and not conn.is_usable():
            conn.close()


def _reset_django_connections() -> None:
    """Keep a handler thread's Django connections across jobs, unless one is broken.

    Django closes connections per request according to CONN_MAX_AGE; a worker has no
    requests, and reconnecting per job costs more than most jobs. A connection is
    dropped only when it saw an error and no longer answers, or when the handler left a
    transaction open.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        if conn.in_atomic_block or not conn.get_autocommit():
            conn.close()  # a transaction left open by a handler: roll it back
        elif conn.errors_occurred:
            if conn.is_usable():
                conn.errors_occurred = False
            else:
                conn.close()
