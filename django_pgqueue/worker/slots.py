"""The handler slots of a worker over several databases, shared by their dispatchers.

A worker whose queues live on several databases runs one dispatcher per database
(`several.py`), each with its own connections, listener, heartbeat and sweep. The
`concurrency` handler slots are the process's, not each database's: at most that many
handlers run at once in all. A database with work takes the slots the others leave
free; when several want more than there is, each is kept its share, in proportion to
its queues' weights (unweighted queues weigh 1), whatever the others hold. The slots
are the handler threads'; async handlers run on each database's own event loop.

A dispatcher asks for slots before a claim (`Seat.grant`) and gives back what the claim
did not fill when its rows are in (`Seat.done`): the grant is counted from the ask to
the hand-over, so two dispatchers claiming at once never take the same free slot. A
running handler counts until its thread returns (a handler past its timeout included:
its slot is held until it really ends). A database that is down keeps only the slots of
the handlers it still runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping


class SharedSlots:
    """`total` handler slots shared by several dispatchers (`Seat`s), by weight."""

    def __init__(self, total: int, weights: Mapping[str, int]) -> None:
        self.total = total
        self._lock = threading.Lock()
        # Taken by a handler thread as its handler starts, given back as it returns: the
        # hard limit, whatever a claim brought (a queue thought to have async handlers
        # only may bring sync ones, claimed without shared slots).
        self.gate = threading.BoundedSemaphore(total)
        whole = sum(weights.values())
        # Each member's share when all of them want more than there is; rounded down,
        # so the shares never add up to more than there is (fewer slots than members:
        # some have none, and take what is free).
        self._shares = {name: total * weight // whole for name, weight in weights.items()}
        self._seats: dict[str, Seat] = {}

    def seat(self, name: str, busy: Callable[[], int], wake: threading.Event) -> Seat:
        """The seat of dispatcher `name`: `busy` counts its running handlers, `wake`
        wakes it when slots it was refused come free."""
        seat = Seat(self, name, self._shares[name], busy, wake)
        self._seats[name] = seat
        return seat

    def _free_for(self, me: Seat) -> int:
        """The slots `me` may take now (under the lock): what is free less the shares
        kept for the others that want more, but never less than what is left of its own
        share."""
        used = 0
        kept = 0
        mine = me.busy()
        for seat in self._seats.values():
            held = mine if seat is me else seat.busy() + seat.granted
            used += held
            if seat is not me and seat.wanting:
                kept += max(0, seat.share - held)  # its share, kept while it wants more
        free = self.total - used
        return max(0, free - kept, min(me.share - mine, free))

    def freed(self) -> None:
        """A handler returned: wake the dispatchers that were refused slots.

        Under the lock: a refusal counted the busy handlers under it, so it either saw
        this one gone or is seen here.
        """
        with self._lock:
            self._wake_refused()

    def _wake_refused(self, but: Seat | None = None) -> None:
        """Wake each refused dispatcher that could now get a slot (under the lock). It
        stays refused, its share kept, until it asks again."""
        for seat in self._seats.values():
            waiting = seat.refused and seat is not but and not seat.wake.is_set()
            if waiting and self._free_for(seat) > 0:
                seat.wake.set()


class Seat:
    """One dispatcher's view of the shared slots."""

    def __init__(
        self,
        slots: SharedSlots,
        name: str,
        share: int,
        busy: Callable[[], int],
        wake: threading.Event,
    ) -> None:
        self.slots = slots
        self.name = name
        self.share = share
        self.busy = busy
        self.wake = wake
        self.granted = 0  # asked for by a claim on its way
        # Its last grant was short: it is woken when slots free up, its share kept.
        self.refused = False
        self._wanting: set[str] = set()  # its queues whose last claim came back full

    @property
    def wanting(self) -> bool:
        return bool(self._wanting) or self.refused

    def free(self) -> int:
        """The slots a claim of this dispatcher could get now."""
        with self.slots._lock:
            return self.slots._free_for(self)

    def grant(self, queue: str, want: int) -> int:
        """Take up to `want` slots for a claim from `queue` (held until `done`); a short
        grant has this dispatcher woken when slots come free, and kept its share."""
        with self.slots._lock:
            got = min(want, self.slots._free_for(self))
            self.granted = got
            self.refused = got < want
            return got

    def claimed(self, queue: str, limit: int, rows: int) -> None:
        """A claim from `queue` of at most `limit` brought `rows`: a full one says the
        queue has more, a short one that it wanted no more than it got."""
        with self.slots._lock:
            if rows >= limit:
                self._wanting.add(queue)
                return
            wanted = self.wanting
            self._wanting.discard(queue)
            self.refused = False
            if wanted and not self.wanting:  # its share kept for it is free again
                self.slots._wake_refused(but=self)

    def away(self) -> None:
        """Its database is out of reach: it keeps no share until a claim wants one."""
        with self.slots._lock:
            self.refused = False
            self._wanting.clear()
            self.granted = 0
            self.slots._wake_refused(but=self)

    def done(self) -> None:
        """The claim's rows are with the handlers (or it failed): the grant ends, and
        the slots it did not fill go to the dispatchers refused meanwhile."""
        if self.granted:
            with self.slots._lock:
                self.granted = 0
                self.slots._wake_refused(but=self)
