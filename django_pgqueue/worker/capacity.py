"""The in-flight jobs: the one count of the handlers this process runs, and the room
it leaves for claims.

A claimed job counts from the moment its claim brought it in until its handler's code
really ended (see `claimed.ClaimedJob`): a handler past its timeout, on a blocked event
loop, or cancelled and still running keeps its slot. Counted by kind: "sync" handlers
run on the `concurrency` handler threads, "async" ones as tasks on the event loop, up
to `async_concurrency`. Every claim is sized here (`claim_size`), and the two pools
never start more than their limit whatever a claim brought, so the limits are hard.

Which kinds a queue's jobs are is learned from its claims. A queue not claimed from
yet is sized as a sync one when no async handler is registered, else to what both
pools have free (and, once the event loop is in use, one job when only one pool has
room). A queue that brought one kind claims one job more, to find out
whether it has the other kind too, while the other pool has room and its own holds no
job waiting. A claim whose jobs turn out to be of a kind whose pool is full leaves
them waiting, unstarted, in that pool: at most one such job per queue.

Used by the dispatcher thread only.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..claimed import ClaimedJob

KINDS = ("sync", "async")


class Capacity:
    """The claimed jobs whose handlers have not ended, counted by kind.

    A job claimed again while an older handler of it still runs (its lease was lost)
    counts twice: both handlers execute."""

    def __init__(self, threads: int, tasks: int, *, async_handlers: bool = True) -> None:
        self.limits = {"sync": threads, "async": tasks}
        self._items: dict[ClaimedJob, None] = {}
        self._counts = dict.fromkeys(KINDS, 0)
        # Which kinds each queue's claims have brought.
        self._kinds: dict[str, set[str]] = {}
        # Whether a job of unknown kind may be async: any async handler registered (or
        # a type resolved on demand, like a Django task, that might be one).
        self.async_handlers = async_handlers

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[ClaimedJob]:
        return iter(list(self._items))

    def running(self, kind: str) -> int:
        """Handlers of `kind` handed over and not ended (started or waiting to start)."""
        return self._counts[kind]

    def free(self, kind: str) -> int:
        """Slots of `kind` not taken (negative while a claim brought more than free)."""
        return self.limits[kind] - self._counts[kind]

    def room(self) -> bool:
        """Whether any claim could take a job now: a free thread, or a free task slot
        once the event loop is in use."""
        return self.free("sync") > 0 or (self._looped() and self.free("async") > 0)

    def claim_size(self, queue: str, batch: int) -> int:
        """How many jobs a claim from `queue` may take now, at most `batch`."""
        kinds = self._kinds.get(queue)
        sync, tasks = max(0, self.free("sync")), max(0, self.free("async"))
        if kinds is None:
            if not self.async_handlers:
                return min(batch, sync)
            # Unknown kinds: what both pools have free; once the event loop is in use,
            # one job to find out which kind the queue has when one pool alone has room.
            room = min(sync, tasks)
            if not room and self._looped():
                room = int(sync > 0 or tasks > 0)
            return min(batch, room)
        room = sum(max(0, self.free(kind)) for kind in kinds)
        # One job more to find out whether the queue has the other kind too: async
        # handlers once the event loop is in use, while it has room and no sync job
        # waits; sync ones while a thread is free and no async job waits.
        if kinds == {"sync"}:
            room += self._looped() and self.free("async") > 0 and self.free("sync") >= 0
        elif kinds == {"async"}:
            room += self.free("sync") > 0 and self.free("async") >= 0
        return min(batch, room)

    def _looped(self) -> bool:
        """Some queue's claims brought an async handler: the event loop is in use."""
        return any("async" in kinds for kinds in self._kinds.values())

    def add_all(self, items: list[ClaimedJob]) -> None:
        """`items` were claimed and go to their pools."""
        for item in items:
            self._items[item] = None
            self._counts[item.kind] += 1
            self._kinds.setdefault(item.ctx.queue, set()).add(item.kind)

    def drop(self, item: ClaimedJob) -> None:
        """Forget `item`: its handler ended (or it never started)."""
        self.drop_all([item])

    def drop_all(self, items: list[ClaimedJob]) -> None:
        """`drop` each of `items` (one not in the table is passed over)."""
        entries = self._items
        for item in items:
            if entries.pop(item, 0) is None:
                self._counts[item.kind] -= 1

    def clear(self) -> None:
        self._items.clear()
        self._counts = dict.fromkeys(KINDS, 0)
