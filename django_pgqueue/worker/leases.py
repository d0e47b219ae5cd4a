"""Leases: the ones this worker holds, the heartbeat that renews them, the sweep of
expired ones, and handing unstarted jobs back."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import psycopg

from ..context import Lease
from ..exceptions import DatabaseUnavailable
from ..store import errors
from ..store.connection import Backoff, wait_for
from ..store.worker import Store
from ..worker_config import WorkerConfig

logger = logging.getLogger(__name__)

SWEEP_BATCH = 1000
# A renewal PostgreSQL refused is tried again after RENEW_RETRY, 2x, 4x ... (at most
# HEARTBEAT_INTERVAL); a lost connection is reconnected at once.
RENEW_RETRY = 0.05
GAPS_KEPT = 10_000


class LeaseBook:
    """The leases this worker holds, by job id; shared by the dispatcher and the heartbeat."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._leases: dict[int, Lease] = {}
        self._lock = threading.Lock()
        self._lost: list[Lease] = []  # found lost by renewals, not taken yet

    def hold(self, leases: Iterable[Lease]) -> None:
        with self._lock:
            for lease in leases:
                self._leases[lease.job_id] = lease

    def forget(self, lease: Lease) -> None:
        """Stop renewing `lease`, once its job's outcome is written (or known)."""
        self.forget_all([lease])

    def forget_all(self, leases: list[Lease]) -> None:
        """`forget` each of `leases`."""
        with self._lock:
            book = self._leases
            for lease in leases:
                # Only this claim's lease: dropping a newer claim's lease of the same
                # job would stop its renewals, and the sweep would take the job from
                # under it.
                if book.get(lease.job_id) is lease:
                    del book[lease.job_id]

    def known(self) -> set[tuple[int, int]]:
        """(job_id, lease_version) of every lease in the book, lost ones included."""
        with self._lock:
            return {(lease.job_id, lease.lease_version) for lease in self._leases.values()}

    def held(self) -> list[Lease]:
        """The leases to renew: held and not known to be lost."""
        with self._lock:
            return [lease for lease in self._leases.values() if not lease.lost]

    def renew(self, store: Store, held: list[Lease], sent: float) -> int:
        """Renew `held` through `store`; extend what was kept, mark the rest lost.

        Returns how many leases this renewal found lost.
        """
        kept = store.renew([(lease.job_id, lease.lease_version) for lease in held], self.seconds)
        cancelled = store.cancel_requested
        lost = 0
        for lease in held:
            if lease.job_id in kept:
                lease.expires = sent + self.seconds
                lease.cancel_requested = lease.job_id in cancelled
            elif not lease.lost and not lease.finishing:
                lease.lost = True
                lost += 1
                with self._lock:
                    self._lost.append(lease)
                logger.warning(
                    "lease lost: job %d (lease_version %d) is no longer this worker's",
                    lease.job_id,
                    lease.lease_version,
                    extra={"job_id": lease.job_id, "lease_version": lease.lease_version},
                )
        return lost

    def take_lost(self) -> list[Lease]:
        """The leases renewals found lost since the last call (for the observers)."""
        with self._lock:
            lost, self._lost = self._lost, []
        return lost

    def hand_back(self, store: Store, held: Sequence[tuple[int, int, int]]) -> set[int] | None:
        """Hand back claimed, never-started (job_id, lease_version, attempt_id).

        Returns the job ids handed back, or None if the database could not be reached
        (the sweep then requeues them when their leases run out).
        """
        try:
            if not store.connected:
                store.connect()
            released = store.release(held)
        except (DatabaseUnavailable, psycopg.Error) as exc:
            logger.warning(
                "shutdown: could not hand back %d unstarted job(s) (%s); the sweep will",
                len(held),
                exc,
            )
            return None
        with self._lock:
            for job_id, _, _ in held:
                self._leases.pop(job_id, None)
        logger.info("shutdown: handed back %d unstarted job(s)", len(released))
        return released


class UnknownClaims:
    """Jobs the database says this worker holds and it does not know of, until handed back.

    A claim whose COMMIT landed but whose answer was lost (the connection died) leaves
    them. Their leases are held (renewed) until the hand-back lands, so the sweep does
    not take them first and spend an attempt: they never started. Dispatcher only.
    """

    def __init__(self, leases: LeaseBook) -> None:
        self.leases = leases
        self._claims: list[tuple[Lease, int]] = []  # and the attempt id

    def __bool__(self) -> bool:
        return bool(self._claims)

    def find(self, store: Store, worker_id: str) -> bool:
        """After a reconnect: look for such jobs; True if there are some to hand back."""
        try:
            rows = store.locked_by(worker_id)
        except psycopg.Error as exc:
            logger.warning("listing the jobs this worker holds failed: %s", errors.describe(exc))
            return bool(self._claims)
        known = self.leases.known()
        unknown = [row for row in rows if (row[0], row[1]) not in known]
        if unknown:
            logger.warning(
                "worker %s: %d job(s) were claimed by a claim whose answer was lost; "
                "handing them back",
                worker_id,
                len(unknown),
            )
            expires = time.monotonic() + self.leases.seconds
            found = [(Lease(job, version, expires), attempt) for job, version, attempt in unknown]
            self.leases.hold(lease for lease, _ in found)
            self._claims.extend(found)
        return bool(self._claims)

    def release(self, store: Store) -> int:
        """Hand them back (fenced; the attempt is given back); how many were released.

        A refusal keeps them for the next call; a lost connection raises.
        """
        claims, self._claims = self._claims, []
        try:
            released = store.release(
                [(lease.job_id, lease.lease_version, attempt) for lease, attempt in claims]
            )
        except (DatabaseUnavailable, psycopg.Error) as exc:
            self._claims = claims + self._claims
            if isinstance(exc, DatabaseUnavailable):
                raise
            logger.warning("handing back unknown claims refused (%s)", errors.describe(exc))
            return 0
        # Jobs not released were swept or finished meanwhile: nothing left to do.
        for lease, _ in claims:
            self.leases.forget(lease)
        return len(released)


def sweep_expired(store: Store) -> list[str]:
    """Requeue (or kill) jobs whose lease ran out, any worker's; return their queues."""
    queues = []
    for job_id, queue, lost_version, status in store.sweep(SWEEP_BATCH):
        queues.append(queue)
        logger.warning(
            "lease of job %d (queue %s, lease_version %d) expired; %s",
            job_id,
            queue,
            lost_version,
            "requeued" if status == "pending" else "attempts spent, job is dead",
            extra={"job_id": job_id, "queue": queue, "lease_version": lost_version},
        )
    return queues


@dataclass(eq=False)
class Heartbeat:
    """The heartbeat thread: renews every held lease in one statement per interval.

    It has its own connection, so a busy dispatcher or handler cannot starve it.
    Leases it finds lost are marked (`Lease.lost`) and left for the dispatcher to
    announce (`LeaseBook.take_lost`).
    """

    config: WorkerConfig
    leases: LeaseBook
    stop: threading.Event
    stats: Counter[str]
    wake: threading.Event | None = None  # the dispatcher's: told of leases found lost
    # Seconds between renewals that worked: the latest GAPS_KEPT of them.
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=GAPS_KEPT), init=False)

    def run(self) -> None:
        cfg = self.config
        store = Store(
            cfg.database, f"pgqueue heartbeat {cfg.worker_id}", prepared=cfg.prepared_statements
        )
        backoff = Backoff(cfg.reconnect_max_delay)
        last = time.monotonic()
        # The first cycle runs at once (the worker registry hears of this worker
        # at start), and cycles start every heartbeat_interval whatever the registry's
        # writes after a renewal cost: they never push the next renewal back.
        wait = 0.0
        failures = 0
        try:
            while not self.stop.wait(wait):
                started = time.monotonic()
                wait = cfg.heartbeat_interval
                held = self.leases.held()
                if not store.connected and not wait_for(store, self.stop, backoff, "heartbeat"):
                    return
                if not held:
                    last = time.monotonic()
                else:
                    sent = time.monotonic()
                    try:
                        lost = self.leases.renew(store, held, sent)
                    except DatabaseUnavailable as exc:
                        logger.warning("heartbeat: %s; reconnecting now", exc)
                        wait = 0.0  # wait_for above reconnects with its own backoff
                        continue
                    except Exception as exc:  # a statement error must not end the renewals
                        failures += 1
                        # Again soon, not a whole interval later: the leases run out meanwhile.
                        wait = min(cfg.heartbeat_interval, RENEW_RETRY * 2 ** min(failures, 10))
                        logger.warning(
                            "heartbeat: renewing %d lease(s) failed (%s); again in %.2fs",
                            len(held),
                            errors.describe(exc),
                            wait,
                        )
                        continue
                    failures = 0
                    if lost:
                        self.stats["leases_lost"] += lost
                        if self.wake is not None:
                            self.wake.set()  # the dispatcher tells the observers
                    self.gaps.append(sent - last)
                    last = sent
                _refresh_plans(store)
                wait = max(0.0, started + cfg.heartbeat_interval - time.monotonic())
        finally:
            store.close()


def _refresh_plans(store: Store) -> None:
    """The heartbeat's plans (the renewal's) are made again as the tables grow.

    Nothing it raises may end the heartbeat: a lost connection is reconnected by the
    next cycle (the store dropped it), a refused probe leaves the plans as they are.
    """
    try:
        store.refresh_plans(time.monotonic())
    except DatabaseUnavailable as exc:
        logger.warning("heartbeat: %s; reconnecting", exc)
    except psycopg.Error as exc:
        logger.warning("heartbeat: looking at the tables' size failed: %s", errors.describe(exc))
