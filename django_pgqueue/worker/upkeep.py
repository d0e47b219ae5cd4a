"""The worker's upkeep thread: keeps the hot indexes small (`django_pgqueue.upkeep`).

It has a connection of its own, because a rebuild takes as long as the index is large
and REINDEX CONCURRENTLY cannot share a connection that runs statements meanwhile.
Every worker runs one; a rebuild in progress anywhere makes the others pass.
"""

from __future__ import annotations

import logging
import random
import threading

import psycopg

from ..exceptions import DatabaseUnavailable
from ..store.session import Session
from ..upkeep import keep_indexes_small

logger = logging.getLogger(__name__)

# The first look comes this soon after the start (a worker restarted after a big drain
# finds the bloat at once), jittered so that workers started together look apart.
FIRST_LOOK = 60.0


class IndexUpkeep:
    """Every `interval` seconds (jittered), rebuild the hot indexes that bloated."""

    def __init__(self, alias: str, worker_id: str, interval: float, stop: threading.Event):
        self.interval = interval
        self.stop = stop
        self.session = Session(alias, f"pgqueue upkeep {worker_id}", prepared=False)

    def run(self) -> None:
        wait = random.uniform(0.5, 1.5) * min(self.interval, FIRST_LOOK)
        try:
            while not self.stop.wait(wait):
                self.look()
                wait = random.uniform(0.8, 1.2) * self.interval
        finally:
            self.session.close()

    def look(self) -> None:
        """One pass; a database error is logged and the next pass tries again."""
        try:
            keep_indexes_small(self.session)
        except DatabaseUnavailable as exc:
            logger.debug("index upkeep: %s", exc)
        except psycopg.Error as exc:
            logger.warning("index upkeep failed (tried again later): %s", exc)
            self.session.close()
