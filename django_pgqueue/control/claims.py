"""Queue control in the worker: the controlled claim, and when to claim a queue again.

`ControlledClaims` is the feature's `WorkerHooks`. It keeps a view of which queues have
a queue_controls row, refreshed every half poll interval: a pause or a new limit on a
queue this worker claims without controls then holds within one interval, the claim
sent just before a refresh included. A claim of a controlled queue goes through
``queue_control_lock`` + ``job_claim_controlled`` + ``queue_control_state`` (one
pipeline, one transaction, one round trip, with the completions whose slots it may
reuse); other queues claim with the plain claim, which leaves keyed jobs to this one.

A claim cut by a limit or a rate is retried as soon as it could succeed, not after
POLL_INTERVAL; a controlled queue's walk always starts from the beginning (under the
queue's lock); a finished job of a controlled queue is written at once (its slot is
held until its outcome is written), and this worker claims that queue again at once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..claimed import InFlight
from ..extensions import Claimed, WorkerHooks
from ..outcomes import Outcome
from ..store import control as control_store
from ..store.worker import ClaimRequest, Completion, Store
from ..worker_config import WorkerConfig
from .store import sync_queue_controls

# How soon a worker tries again a queue whose claim was cut by its concurrency limit:
# a slot frees when another worker's job ends, which no NOTIFY announces. The wait
# doubles while the queue stays full (long jobs), up to the poll interval, so full
# queues are not polled hundreds of times a second; a worker that frees a slot itself
# claims again at once (see `frees_slots`).
FULL_RECHECK = 0.005
FULL_BACKOFF_STEPS = 8
# How many pending jobs a controlled claim may walk past, per job asked for, looking
# for keys under their limit.
SCAN_FACTOR = 8
MAX_SCAN = 1000
# How many pending jobs a controlled claim may read in all, passing over those of keys
# at their limit: beyond this many jobs of saturated keys, the others wait their turn.
MAX_READ = 10_000
# How long a controlled claim's transaction may wait on its own client (see
# transaction_guard): the longest a frozen worker can stall a queue's claims.
LOCK_IDLE_MS = 1000


@dataclass(frozen=True)
class ControlState:
    """Why a controlled claim may have come back short."""

    paused: bool
    full: bool
    rate_wait: float | None
    # The queue has keyed jobs: a short claim may have passed over keys at their limit,
    # whose slots free when another worker's job of that key ends (no NOTIFY says so).
    keyed: bool = False
    took: int = 0  # how many jobs the claim took

    def recheck_after(self, poll_interval: float, full_streak: int = 0) -> float:
        """Seconds until a claim of this queue could take a job again."""
        if self.paused:
            return poll_interval
        waits = [poll_interval]
        if self.rate_wait is not None:
            waits.append(self.rate_wait)
        if self.full or self.keyed:
            waits.append(FULL_RECHECK * 2 ** min(full_streak, FULL_BACKOFF_STEPS))
        return max(0.0, min(waits))


def scan_size(limit: int) -> int:
    """Pending jobs a controlled claim of `limit` jobs may walk."""
    return min(MAX_SCAN, max(limit, limit * SCAN_FACTOR))


class ControlledClaims(WorkerHooks):
    """The claims of one worker's store under queue control, and their bookkeeping."""

    def __init__(self, store: Store, poll_interval: float, queues: Sequence[str] = ()) -> None:
        self.store = store
        self.poll_interval = poll_interval
        self.queues = tuple(queues)
        self._controlled: frozenset[str] = frozenset()
        self._controls_due = 0.0
        self.states: dict[str, ControlState] = {}
        self._full_streak: dict[str, int] = {}
        # Controlled queues where this worker finished a job since the scheduler looked.
        self._freed: set[str] = set()

    @classmethod
    def for_worker(cls, config: WorkerConfig, store: Store) -> ControlledClaims:
        return cls(store, config.poll_interval, config.queues)

    # -- the per-poll view ----------------------------------------------------------

    def controlled(self, queue: str) -> bool:
        """Whether claims of `queue` go through the controlled claim (view per poll)."""
        now = time.monotonic()
        if now >= self._controls_due:
            self.refresh_view(now)
        return queue in self._controlled

    def refresh_view(self, now: float) -> frozenset[str]:
        """Read which queues are controlled now; return those that were not before.

        A queue that became controlled counts as one where a slot freed (see `ready`):
        the plain claim took nothing from it if it became keyed, so the scheduler tries
        it again at once, with the controlled claim.
        """
        fresh = control_store.controlled_queues(self.store)
        became = fresh - self._controlled
        self._controlled = fresh
        self._controls_due = now + self.poll_interval / 2
        self._freed |= became
        return became

    def recheck_after(self, queue: str, poll_interval: float) -> float:
        """Seconds before a short claim of `queue` is worth retrying (poll_interval if unknown)."""
        state = self.states.pop(queue, None)
        if state is None:
            return poll_interval
        streak = self._full_streak.get(queue, 0)
        # The wait grows while the queue stays full, or while a keyed queue's claims take
        # nothing; a keyed claim that took jobs starts it again from the shortest.
        grows = state.full or (state.keyed and not state.took)
        streak = streak if grows else 0
        self._full_streak[queue] = streak + 1 if grows else 0
        return state.recheck_after(poll_interval, streak)

    def frees_slots(self, queue: str) -> bool:
        """Whether finishing a job of `queue` frees a slot worth claiming again at once."""
        return queue in self._controlled

    # -- hooks: the worker's start --------------------------------------------------

    def starting(self) -> None:
        """Write PGQUEUE["QUEUES"] into queue_controls (a database error is logged)."""
        sync_queue_controls(self.store.alias)

    # -- hooks: the claim of a queue ------------------------------------------------

    def claim(
        self, store: Store, done: Sequence[Completion] | None, request: ClaimRequest
    ) -> Claimed | None:
        """The controlled claim for a controlled queue; None (the plain claim) otherwise."""
        queue, limit, worker_id, lease, _ = request
        if not self.controlled(queue):
            return None
        claim = {
            "queue": queue,
            "limit": limit,
            "scan": scan_size(limit),
            "read": MAX_READ,
            "worker_id": worker_id,
            "lease": lease,
        }
        completed, rows, state = control_store.claim_controlled(store, done, claim, LOCK_IDLE_MS)
        if state is not None:
            self.states[queue] = ControlState(
                bool(state[0]), bool(state[1]), state[2], bool(state[3]), len(rows)
            )
        return completed, rows

    def resumable(self, queue: str) -> bool:
        """A controlled queue's claim always walks from the start, under its lock."""
        return not self.frees_slots(queue)

    def ready(self) -> set[str]:
        """The controlled queues where a slot freed since the last call."""
        freed, self._freed = self._freed, set()
        return freed

    def short_claim(self, queue: str, poll_interval: float) -> float | None:
        """A short controlled claim is retried when it could succeed."""
        if not self.frees_slots(queue):
            return None
        return self.recheck_after(queue, poll_interval)

    def settled(self) -> bool:
        """One more look at which queues are controlled: a queue that just became keyed
        held jobs the plain claim had to leave."""
        became = self.refresh_view(time.monotonic())
        return not any(queue in became for queue in self.queues)

    # -- hooks: outcomes ------------------------------------------------------------

    def outcomes_added(self, written: Sequence[tuple[InFlight, Outcome]]) -> None:
        """A finished job of a controlled queue frees its slot: claim that queue again."""
        if self._controlled:
            for item, _ in written:
                if item.ctx.queue in self._controlled:
                    self._freed.add(item.ctx.queue)

    def write_now(self, queue: str) -> bool:
        """An outcome of a controlled queue holds a slot: write it without batching delay."""
        return queue in self._controlled
