"""In-flight bookkeeping: the claimed jobs of this worker whose outcome is not known yet."""

from __future__ import annotations

from collections.abc import Iterator

from ..claimed import InFlight


class InFlightJobs:
    """The jobs handed to handler threads and not yet resolved, by job id (dispatcher only)."""

    def __init__(self) -> None:
        self._items: dict[int, InFlight] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[InFlight]:
        return iter(self._items.values())

    def add_all(self, items: list[InFlight]) -> None:
        for item in items:
            self._items[item.ctx.job_id] = item

    def drop(self, item: InFlight) -> None:
        """Forget `item`, and only it.

        After losing its lease, this worker may have claimed the same job again while
        the old handler still ran: that newer claim's entry stays.
        """
        self.drop_all([item])

    def drop_all(self, items: list[InFlight]) -> None:
        """`drop` each of `items`."""
        entries = self._items
        for item in items:
            if entries.get(item.ctx.job_id) is item:
                del entries[item.ctx.job_id]

    def clear(self) -> None:
        self._items.clear()
