"""Leases: the ones this worker holds, the heartbeat that renews them, the sweep of
expired ones, and handing unstarted jobs back."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence

import psycopg

from ..context import Lease
from ..exceptions import DatabaseUnavailable
from ..store.worker import Backoff, Store, wait_for
from .config import WorkerConfig

logger = logging.getLogger(__name__)

SWEEP_BATCH = 1000


class LeaseBook:
    """The leases this worker holds, by job id; shared by the dispatcher and the heartbeat."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._leases: dict[int, Lease] = {}
        self._lock = threading.Lock()

    def hold(self, leases: Iterable[Lease]) -> None:
        with self._lock:
            for lease in leases:
                self._leases[lease.job_id] = lease

    def forget(self, lease: Lease) -> None:
        """Stop renewing `lease`, once its job's outcome is written (or known)."""
        with self._lock:
            # Only this claim's lease: dropping a newer claim's lease of the same job
            # would stop its renewals, and the sweep would take the job from under it.
            if self._leases.get(lease.job_id) is lease:
                del self._leases[lease.job_id]

    def held(self) -> list[Lease]:
        """The leases to renew: held and not known to be lost."""
        with self._lock:
            return [lease for lease in self._leases.values() if not lease.lost]

    def renew(self, store: Store, held: list[Lease], sent: float) -> int:
        """Renew `held` through `store`; extend what was kept, mark the rest lost.

        Returns how many leases this renewal found lost.
        """
        kept = store.renew([(lease.job_id, lease.lease_version) for lease in held], self.seconds)
        lost = 0
        for lease in held:
            if lease.job_id in kept:
                lease.expires = sent + self.seconds
            elif not lease.lost and not lease.finishing:
                lease.lost = True
                lost += 1
                logger.warning(
                    "lease lost: job %d (lease_version %d) is no longer this worker's",
                    lease.job_id,
                    lease.lease_version,
                )
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
        )
    return queues


class Heartbeat:
    """The heartbeat thread: renews every held lease in one statement per interval.

    It has its own connection, so a busy dispatcher or handler cannot starve it.
    """

    def __init__(
        self, config: WorkerConfig, leases: LeaseBook, stop: threading.Event, stats: Counter[str]
    ) -> None:
        self.config = config
        self.leases = leases
        self.stop = stop
        self.stats = stats
        self.gaps: list[float] = []  # seconds between renewals that worked

    def run(self) -> None:
        cfg = self.config
        store = Store(cfg.database, f"pgqueue heartbeat {cfg.worker_id}")
        backoff = Backoff(cfg.reconnect_max_delay)
        last = time.monotonic()
        try:
            while not self.stop.wait(cfg.heartbeat_interval):
                held = self.leases.held()
                if not held:
                    last = time.monotonic()
                    continue
                if not store.connected and not wait_for(store, self.stop, backoff, "heartbeat"):
                    return
                sent = time.monotonic()
                try:
                    lost = self.leases.renew(store, held, sent)
                except DatabaseUnavailable as exc:
                    logger.warning("heartbeat: %s", exc)
                    continue
                except Exception:  # a statement error must not end the renewals
                    logger.exception("heartbeat: renewing %d lease(s) failed", len(held))
                    continue
                if lost:
                    self.stats["leases_lost"] += lost
                self.gaps.append(sent - last)
                last = sent
        finally:
            store.close()
