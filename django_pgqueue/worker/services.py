"""The worker's periodic services (`extensions.PeriodicService`): the threads that run
them, each on a session of its own.

The services that do short work (fire the schedules' ticks, report to the worker
registry, write PGQUEUE["QUEUES"] at start) share one thread and one session, in turn:
each is run when its `next_due` has come. A service that runs long (an index rebuild)
has a thread and a session of its own, so that it holds none of the others up. A lost
connection is reconnected with backoff; anything else a service raises is logged, and
the service is run again at its next due time (never sooner than ERROR_PAUSE).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence

import psycopg

from ..exceptions import DatabaseUnavailable
from ..extensions import PeriodicService
from ..store import errors
from ..store.connection import Backoff, wait_for
from ..store.session import Session
from ..worker_config import WorkerConfig

logger = logging.getLogger(__name__)

# After a service raised, the soonest it runs again.
ERROR_PAUSE = 5.0
# The longest a services thread sleeps between two looks at what is due.
LONGEST_WAIT = 1.0


class ServiceThread:
    """Runs `services` on one thread and one session, each when it is due."""

    def __init__(
        self,
        config: WorkerConfig,
        services: Sequence[PeriodicService],
        stop: threading.Event,
        name: str,
    ) -> None:
        self.config = config
        self.services = tuple(services)
        self.stop = stop
        self.session = Session(
            config.database, f"pgqueue {name} {config.worker_id}", prepared=False
        )
        self._backoff = Backoff(config.reconnect_max_delay)
        self._not_before: dict[PeriodicService, float] = {}
        self._started: set[PeriodicService] = set()
        self.thread = threading.Thread(target=self.run, name=f"pgqueue-{name}", daemon=True)

    def begin(self) -> None:
        """Start the services now, on the caller's thread (the worker's, before its first
        claim: PGQUEUE["QUEUES"] is written before a claim could pass its limits). One
        the database could not be reached for is started by the thread once it is."""
        for service in self.services:
            if service.runs_long:
                continue  # on its own thread, as it would hold the worker's start up
            try:
                if not self.session.connected:
                    self.session.connect()
            except DatabaseUnavailable as exc:
                logger.warning("%s: %s; started once the database answers", service.name, exc)
                return
            self._started.add(service)
            self._call(service, "start")

    def start(self) -> None:
        self.thread.start()

    def run(self) -> None:
        started = self._started
        try:
            while not self.stop.is_set():
                if not self.session.connected and not wait_for(
                    self.session, self.stop, self._backoff, self.thread.name
                ):
                    return
                for service in self.services:
                    if service not in started:
                        started.add(service)
                        self._call(service, "start")
                    now = time.monotonic()
                    if now >= max(service.next_due(), self._not_before.get(service, 0.0)):
                        self._call(service, "run", now)
                self.stop.wait(self._wait())
        finally:
            for service in self.services:
                if service in started:
                    self._call(service, "stop")
            self.session.close()

    def _wait(self) -> float:
        due = min(
            (max(s.next_due(), self._not_before.get(s, 0.0)) for s in self.services),
            default=math.inf,
        )
        return min(LONGEST_WAIT, max(0.0, due - time.monotonic()))

    def _call(self, service: PeriodicService, what: str, *args: float) -> None:
        """Call `service.what(session, *args)`; what it raises is logged, never raised."""
        try:
            getattr(service, what)(self.session, *args)
        except DatabaseUnavailable as exc:
            logger.warning("%s (%s): %s; reconnecting", service.name, what, exc)
            self.session.close()
        except Exception as exc:
            self._not_before[service] = time.monotonic() + ERROR_PAUSE
            logger.error(
                "%s (%s) failed (again in %gs at the soonest): %s",
                service.name,
                what,
                ERROR_PAUSE,
                errors.describe(exc) if isinstance(exc, psycopg.Error) else exc,
                exc_info=not isinstance(exc, psycopg.Error),
            )


def service_threads(
    config: WorkerConfig, services: Sequence[PeriodicService], stop: threading.Event
) -> list[ServiceThread]:
    """The threads of `services`: one for the short ones, one each for the long ones."""
    short = [service for service in services if not service.runs_long]
    threads = [ServiceThread(config, short, stop, "services")] if short else []
    threads += [
        ServiceThread(config, [service], stop, service.name.replace(" ", "-"))
        for service in services
        if service.runs_long
    ]
    return threads
