"""The worker registry and the per-minute rollup, kept by a periodic service of each
worker (`WorkerRegistry`).

Every BEAT_EVERY seconds (or half a lease, if shorter), on the services' connection:
this worker's row says it is alive, how many jobs it holds and what it says of itself
(`WorkerView.inspect`: its jobs, counters, memory, code), the requests operators made
to it are taken and obeyed (stop, drain, resume, concurrency), the attempts noted since
(`observer.RollupObserver`) are added to the rollup, once a minute the backlog of its
queues is sampled into it, and now and then the workers not seen for three of their
beats (two leases, if shorter) are marked gone and old rows pruned. As the worker
stops: the rollup flushed, its row marked gone. Observation only: a job belongs to
whoever holds its lease, whatever this table says.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from ..extensions import PeriodicService, WorkerView
from ..store.session import Session
from ..version import __version__
from . import workers
from .rollup import RollupBuffer, sample_backlog

logger = logging.getLogger(__name__)

# Seconds between two registry reports (and rollup flushes) of a worker, at most.
BEAT_EVERY = 5.0
# Reports between two passes that mark silent workers gone and prune old rows.
HOUSEKEEPING_EVERY = 6


class WorkerRegistry(PeriodicService):
    """This worker's row in the registry, and the rollup's flushes."""

    name = "worker registry"

    def __init__(self, view: WorkerView, rollup: RollupBuffer) -> None:
        config = view.config
        self.view = view
        self.rollup = rollup
        self.identity = workers.Identity(
            id=config.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=tuple(config.queues),
            concurrency=config.concurrency,
            lease=config.lease,
            version=__version__,
            supervisor=view.supervisor,
        )
        self.every = min(BEAT_EVERY, config.lease / 2)
        self._beats = 0
        self._sampled_minute: int | None = None  # the wall-clock minute last sampled
        self._due = 0.0  # the first report at once: the registry hears of it at start

    def next_due(self) -> float:
        return self._due

    def run(self, session: Session, now: float) -> None:
        """Report this worker alive and flush the rollup; now and then, tidy the registry."""
        self._due = now + self.every
        requests = workers.record_beat(session, self.identity, self.view.running(), self.report())
        for request in requests:
            self.obey(session, request)
        self.rollup.flush(session)
        minute = int(time.time() // 60)
        if minute != self._sampled_minute:  # the backlog, once a minute per worker
            sample_backlog(session, self.identity.queues)
            self._sampled_minute = minute
        if self._beats % HOUSEKEEPING_EVERY == 0:
            gone = workers.mark_gone(session)
            if gone:
                logger.warning("workers not seen for three beats, marked gone: %s", gone)
            workers.prune(session)
        self._beats += 1

    def report(self) -> dict[str, Any] | None:
        """What the worker says of itself now; None if it could not say (the beat that
        keeps it alive is written regardless)."""
        try:
            return {**self.view.inspect(), "beat_seconds": self.every}
        except Exception:
            logger.exception(
                "worker %s: its report failed; the beat goes without", self.identity.id
            )
            return None

    def obey(self, session: Session, request: workers.Request) -> None:
        """Do what an operator asked, log it and record the answer."""
        try:
            answer = self.view.obey(request.action, request.concurrency)
        except ValueError as exc:
            answer = f"refused: {exc}"
        except Exception as exc:  # the others of this beat are still answered
            logger.exception("worker %s: request %d failed", self.identity.id, request.id)
            answer = f"failed: {type(exc).__name__}: {exc}"
        logger.warning(
            "worker %s: %s asked to %s%s: %s",
            self.identity.id,
            request.requested_by,
            request.action,
            "" if request.concurrency is None else f" {request.concurrency}",
            answer,
        )
        workers.answer(session, request, answer)
        if request.action != "stop":
            self._due = 0.0  # the next report at once: it shows what changed

    def stop(self, session: Session) -> None:
        """Flush the rollup and mark this worker gone, as it stops."""
        if not session.connected:
            return  # the database is away: the row goes gone by worker_mark_gone instead
        self.rollup.flush(session)
        # The requests that came after the last beat are obeyed still: a drain, a
        # resume or a concurrency changes what its supervisor starts next in its place.
        for request in workers.record_stop(session, self.identity.id):
            self.obey(session, request)
