"""Keep the hot indexes small: rebuild one once it is mostly empty pages.

Every job enters and leaves the claim index (and the running index, and the key
indexes when it has keys). VACUUM removes the dead entries but never gives a page
back, so after a backlog drains the index keeps the size of the backlog: claims still
walk it in order and stay fast, but the planner costs the at-a-glance counts by its
pages and turns them into scans of the whole table. `keep_indexes_small` finds an index
whose pages its live entries could fill less than a BLOAT_FACTOR-th of, and rebuilds it
with REINDEX INDEX CONCURRENTLY, which never blocks inserts, claims or completions.
Every worker runs it every PGQUEUE["INDEX_UPKEEP_INTERVAL"] seconds, a periodic service
of the core's (`IndexUpkeep`); an operator may call it once (`python manage.py shell`, a
cron job).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass

from .extensions import PeriodicService
from .store import indexes
from .store.session import Session

logger = logging.getLogger(__name__)

# The fewest entries a freshly built hot index holds per page: the claim index of
# queues with names of 63 characters (the longest allowed); short names fit ~2.5 times
# as many.
DENSE_ENTRIES_PER_PAGE = 64
# Rebuilt when its live entries would fill less than this share of its pages, dense.
BLOAT_FACTOR = 4
# Smaller indexes are never rebuilt: 1 MiB is read in well under a millisecond.
FLOOR_PAGES = 128


@dataclass(frozen=True)
class Rebuilt:
    """One index rebuilt (or, with dropped, one leftover copy dropped)."""

    name: str
    pages_before: int
    pages_after: int
    live_entries: int
    seconds: float
    dropped: bool = False


def keep_indexes_small(session: Session) -> list[Rebuilt]:
    """Drop leftover copies and rebuild bloated hot indexes; what was done.

    Does nothing while any index of the table is being built (another worker's rebuild,
    or an operator's): two rebuilds at once would only wait for each other.
    """
    found = indexes.sizes(session)
    if any(index.building for index in found):
        return []
    done = [_drop(session, index) for index in found if index.leftover and not index.valid]
    pages = {index.name: index.pages for index in found if not index.leftover}
    caps = {name: n * DENSE_ENTRIES_PER_PAGE // BLOAT_FACTOR for name, n in pages.items()}
    large = {name: cap for name, cap in caps.items() if pages[name] > FLOOR_PAGES}
    if not large:
        return done
    live = indexes.live_entries(session, large)
    for name, cap in large.items():
        if live[name] < cap:
            done.append(_rebuild(session, name, pages[name], live[name]))
    return done


def _rebuild(session: Session, name: str, pages: int, live: int) -> Rebuilt:
    started = time.monotonic()
    indexes.rebuild(session, name)
    after = {index.name: index.pages for index in indexes.sizes(session)}.get(name, 0)
    rebuilt = Rebuilt(name, pages, after, live, time.monotonic() - started)
    logger.info(
        "rebuilt index %s: %d pages for %d live entries, now %d pages (%.1fs)",
        name,
        pages,
        live,
        after,
        rebuilt.seconds,
    )
    return rebuilt


def _drop(session: Session, index: indexes.IndexSize) -> Rebuilt:
    started = time.monotonic()
    indexes.drop_leftover(session, index.name)
    logger.warning(
        "dropped index %s, an invalid copy an interrupted rebuild left (%d pages)",
        index.name,
        index.pages,
    )
    return Rebuilt(index.name, index.pages, 0, 0, time.monotonic() - started, dropped=True)


# The first look comes this soon after the start (a worker restarted after a big drain
# finds the bloat at once), jittered so that workers started together look apart.
FIRST_LOOK = 60.0


class IndexUpkeep(PeriodicService):
    """Every `interval` seconds (jittered), rebuild the hot indexes that bloated.

    On a thread and a session of its own (`runs_long`): a rebuild takes as long as the
    index is large, and REINDEX CONCURRENTLY cannot share a connection that runs
    statements meanwhile. Every worker runs one; a rebuild in progress anywhere makes
    the others pass.
    """

    name = "index upkeep"
    runs_long = True

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._due = time.monotonic() + random.uniform(0.5, 1.5) * min(interval, FIRST_LOOK)

    def next_due(self) -> float:
        return self._due

    def run(self, session: Session, now: float) -> None:
        self._due = now + random.uniform(0.8, 1.2) * self.interval
        keep_indexes_small(session)
