"""Which queue a worker claims from next, and where in it the claim starts.

Queue order follows the weights (smooth weighted round robin); a queue found empty is
skipped until it is due again (POLL_INTERVAL, a NOTIFY, or a retry this worker wrote);
a claim resumes after the last key it took from a queue (see RESUME_TTL).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..store.claims import QueueClaims
from ..store.worker import ClaimedRow, ClaimKey

# How long a claim may resume after the last key this worker claimed from a queue
# before it walks the queue's claim-index entries from the start again. Every claimed
# job leaves a dead entry at the start until VACUUM, and walking them all on every
# claim slows a long drain several-fold; resuming skips them. A job that sorts before
# that key (a higher priority, or an earlier run_at: a requeued job) is seen at the
# next full walk: at most this long after it is due, or at once when the resumed
# claim comes back short.
RESUME_TTL = 0.5


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


class ClaimScheduler:
    """The dispatcher's claim plan: queue turns, empty marks and resume keys.

    Only the dispatcher thread calls it, except `notify` (the listener thread). The
    store's claims (`claims`, see `store.claims`) say which queues are worth claiming
    at once, whose walk must not resume, when a short claim is worth trying again, and
    whether a burst worker's queues are really empty.
    """

    def __init__(
        self,
        queues: tuple[str, ...],
        weights: Mapping[str, int],
        poll_interval: float,
        claims: QueueClaims | None = None,
    ) -> None:
        self.queues = queues
        self.poll_interval = poll_interval
        self.claims = claims
        self._rotation = QueueScheduler(queues, weights)
        # Per queue: until when it counts as empty (skipped by claims).
        self._empty_until: dict[str, float] = {}
        # Per queue: the key of the last job claimed, and until when to resume after it.
        self._resume: dict[str, tuple[ClaimKey, float]] = {}
        self._notified: set[str] = set()
        self._retry_due = 0.0  # when the latest imminent retry written by this worker is due
        self._retries: dict[str, list[float]] = {}  # per queue: when those retries are due
        # Queues whose empty mark was lengthened while idle (see sleep_until).
        self._sleeping: set[str] = set()
        # Set by the listener thread while it is LISTENing: NOTIFYs arrive.
        self.listening = False
        self._looked_again = False  # burst mode: the last look was made (see idle)

    def notify(self, names: Iterable[str]) -> None:
        """Note queues a NOTIFY (or a reconnected listener) says may hold due jobs."""
        self._notified.update(names)

    def refresh(self, now: float) -> bool:
        """Forget 'empty' marks that expired or were contradicted by a NOTIFY (or by the
        claims: a slot of a controlled queue freed); any left to try?"""
        if self.claims is not None:
            self.notify(self.claims.ready())
        if self._notified:
            notified, self._notified = self._notified, set()
            for name in notified:
                self._empty_until.pop(name, None)
                self._sleeping.discard(name)
        for name, until in list(self._empty_until.items()):
            if until <= now:
                del self._empty_until[name]
                self._sleeping.discard(name)
        return len(self._empty_until) < len(self.queues)

    def order(self) -> list[str]:
        """The queues to claim from this turn, in order, skipping those marked empty."""
        return [name for name in self._rotation.order() if name not in self._empty_until]

    def resume_after(self, queue: str, now: float) -> ClaimKey | None:
        """The key a claim from `queue` may resume after, if one is still fresh (and its
        claim lets it resume)."""
        if self.claims is not None and not self.claims.resumable(queue):
            return None
        resume = self._resume.get(queue)
        return resume[0] if resume is not None and now < resume[1] else None

    def claimed(
        self, queue: str, limit: int, after: ClaimKey | None, rows: list[ClaimedRow], sent: float
    ) -> None:
        """Learn from a claim sent at `sent`, its `rows` in claim order: mark the queue
        empty after a short full walk, and note where the next claim from it may resume
        (after the last row; see RESUME_TTL)."""
        if rows:
            self._looked_again = False  # see idle
        if len(rows) < limit:
            if after is None:
                self.mark_empty(queue, sent, sent + self.poll_interval)
                self._resume.pop(queue, None)  # a full walk found the queue drained
                wait = (
                    None
                    if self.claims is None
                    else self.claims.retry_short(queue, self.poll_interval)
                )
                if wait is not None:  # its claim knows when it could succeed
                    self.mark_empty(queue, sent, sent + wait)
            return  # a short resumed claim: the walk from the start that follows decides
        last = rows[-1]
        fresh = self._resume.get(queue)
        until = sent + RESUME_TTL if after is None or fresh is None else fresh[1]
        self._resume[queue] = ((last.priority, last.run_at, last.job_id), until)

    def mark_empty(self, queue: str, sent: float, until: float) -> None:
        """A full walk of `queue` sent at `sent` came back short: skip it until `until`,
        or until the first retry this worker wrote to it after `sent` is due."""
        dues = [due for due in self._retries.get(queue, ()) if due > sent]
        if dues:
            self._retries[queue] = dues
            until = min(until, *dues)
        else:
            self._retries.pop(queue, None)
        self._empty_until[queue] = until
        self._sleeping.discard(queue)

    def retry_scheduled(self, queue: str, due: float) -> None:
        """A retry this worker wrote is due at `due`: look at its queue again then.

        No NOTIFY announces a retry; and a burst worker waits for it rather than exit.
        """
        self._empty_until[queue] = min(self._empty_until.get(queue, due), due)
        self._retries.setdefault(queue, []).append(due)
        self._retry_due = max(self._retry_due, due)
        self._sleeping.discard(queue)

    def requeued(self, queue: str) -> None:
        """A job of `queue` was requeued and kept its place: walk from the start."""
        self._resume.pop(queue, None)

    def reconnected(self) -> None:
        """Anything may have arrived while the worker was cut off: forget what it knew."""
        self._empty_until.clear()
        self._sleeping.clear()
        self._resume.clear()

    def long_sleep(self, now: float) -> list[str]:
        """The queues marked empty for POLL_INTERVAL that an idle worker whose listener
        is connected may look at much later (see `sleep_until`)."""
        if not self.listening:
            return []
        return [
            name
            for name, until in self._empty_until.items()
            if name not in self._sleeping and until > now
        ]

    def sleep_until(self, queue: str, until: float) -> None:
        """Keep `queue` marked empty until `until`: nothing in it is due before then, and a
        NOTIFY (which clears the mark) announces anything new."""
        if queue in self._empty_until:
            self._empty_until[queue] = max(self._empty_until[queue], until)
            self._sleeping.add(queue)

    def idle(self, now: float) -> bool:
        """Every queue found empty by a claim whose mark still holds, and no retry this
        worker wrote is about to be due (one that is due waits for the next claim), and
        the claims agree (see `QueueClaims.settled`)."""
        empty = (
            now >= self._retry_due
            and all(self._empty_until.get(name, now) > now for name in self.queues)
            and (self.claims is None or self.claims.settled(self.queues))
        )
        if not empty or self._looked_again:
            return empty
        # The empty marks came from claims made before this worker's last writes, which
        # may have made jobs due (a workflow's next steps, a batch's callback) whose
        # NOTIFY has not come yet: one more look at every queue first.
        self._looked_again = True
        self.notify(self.queues)
        return False

    def next_look(self, now: float) -> float | None:
        """When the earliest empty mark runs out, or the view of which queues are
        controlled is read ahead of its due time (see `QueueClaims.refresh_ahead`), if
        either comes after `now`. A read of the view that was refused is left to the
        claim that needs it."""
        dues = list(self._empty_until.values())
        if self.claims is not None and self.claims.view_ahead() > now:
            dues.append(self.claims.view_ahead())
        return min(dues) if dues else None
