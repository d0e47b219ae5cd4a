"""What a worker process says of itself, and the operators' requests it acts on.

`report` is this process's account at one moment: the jobs it runs (since how long,
which attempt), those it claimed and has not started, its queues and their weights,
the handlers it registered, its counters since start, its memory and its code. The
registry service writes it with the process's beat (one statement), so whoever reads
it (``inspect_queue_workers``, the admin's Workers page) sees one reading, never a
count from one moment beside a list from another.

`Controls` turns an operator's request (stop, drain, resume, concurrency) into what
the dispatcher does: a drained worker claims nothing and keeps running what it holds;
a new concurrency sizes the next claims (a thread is started for each slot above the
threads running; none is ended: a smaller limit leaves threads idle).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from .. import validators
from ..claimed import ClaimedJob
from ..registry import Registry
from ..version import __version__
from ..worker_config import WorkerConfig
from .capacity import Capacity
from .pool import HandlerPool

logger = logging.getLogger(__name__)

# The most jobs of each list (running, claimed) a report carries.
REPORT_JOBS = 50
# What an operator may ask of a worker.
ACTIONS = ("stop", "drain", "resume", "concurrency")


class Controls:
    """The operators' requests a dispatcher obeys: drain, and a new concurrency.

    Set from the services' thread, read by the dispatcher's: a flag and a number, each
    written whole."""

    def __init__(self, concurrency: int, wake: threading.Event) -> None:
        self.draining = False
        self.concurrency = concurrency  # the limit claims are sized to
        self.asked_concurrency: int | None = None  # waiting for the dispatcher
        self.stop_asked = False  # an operator asked this process to stop
        self._wake = wake

    def drain(self) -> None:
        self.draining = True
        self._wake.set()

    def resize(self, concurrency: int) -> None:
        self.asked_concurrency = concurrency
        self._wake.set()

    def apply_resize(self, capacity: Capacity, pool: HandlerPool) -> None:
        """On the dispatcher's thread: apply the concurrency asked for, if any (claims
        sized to it from now; a thread started for each slot above those running)."""
        asked, self.asked_concurrency = self.asked_concurrency, None
        if asked is not None:
            self.concurrency = asked
            capacity.limits["sync"] = asked
            pool.grow(asked)
            logger.info("concurrency now %d, as an operator asked", asked)

    def obey(self, action: str, concurrency: int | None, stop: Callable[[], None]) -> str:
        """Do what an operator asked (`stop` stops the worker gracefully); what was
        done, in words. ValueError for an action or a concurrency it cannot take."""
        check_request(action, concurrency)
        if action == "stop":
            self.stop_asked = True
            stop()
            return "stopping: no more claims; running handlers get the shutdown grace"
        if action == "drain":
            self.drain()
            return "draining: no more claims; running handlers go on"
        if action == "resume":
            was, self.draining = self.draining, False
            self._wake.set()
            return "claiming again" if was else "was not draining: claiming as before"
        assert concurrency is not None
        self.resize(concurrency)
        return f"concurrency {concurrency} from the next claim"


def check_request(action: str, concurrency: int | None) -> None:
    """Refuse an action a worker does not know, or a concurrency out of range (ValueError)."""
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}: one of {', '.join(ACTIONS)}")
    if action == "concurrency":
        if concurrency is None:
            raise ValueError("concurrency: give the number of handler threads")
        validators.count(
            concurrency, "concurrency", 1, validators.MAX_CONCURRENCY, error=ValueError
        )
    elif concurrency is not None:
        raise ValueError(f"{action} takes no concurrency")


def report(
    config: WorkerConfig,
    registry: Registry,
    controls: Controls,
    in_flight: Iterable[ClaimedJob],
    stats: Counter[str],
    stopping: bool,
) -> dict[str, Any]:
    """This process's account now (plain JSON data); see the module's docstring."""
    now = time.monotonic()
    running, claimed = [], []
    for item in sorted(in_flight, key=lambda item: item.ctx.job_id):
        ctx = item.ctx
        job = {
            "job_id": ctx.job_id,
            "queue": ctx.queue,
            "type": ctx.type,
            "attempt": ctx.attempt,
            "max_attempts": ctx.max_attempts,
        }
        if item.started is None:
            claimed.append(job)
        else:
            running.append({**job, "running_seconds": round(now - item.started, 3)})
    # A copy first: the dispatcher adds to the counter meanwhile.
    counters = {key: value for key, value in dict(stats).items() if value}
    return {
        "concurrency": controls.concurrency,
        "async_concurrency": config.async_concurrency,
        "draining": controls.draining,
        "stopping": stopping,
        "queues": [{"name": q, "weight": config.weights.get(q, 1)} for q in config.queues],
        "handlers": registry.types(),
        "counters": counters,
        "processed": sum(counters.get(k, 0) for k in ("completed", "retried", "dead")),
        "failed": sum(counters.get(k, 0) for k in ("retried", "dead")),
        "running_count": len(running),
        "claimed_count": len(claimed),
        "running": running[:REPORT_JOBS],
        "claimed": claimed[:REPORT_JOBS],
        "rss_bytes": resident_memory(),
        "version": __version__,
        "code": code_fingerprint(registry),
        "python": sys.version.split()[0],
    }


def resident_memory() -> int | None:
    """This process's resident memory in bytes now (Linux), else its peak; None if unknown."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource  # Local: POSIX only.

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError):
        return None
    return peak if sys.platform == "darwin" else peak * 1024


_fingerprints: dict[tuple[str, ...], str] = {}


def code_fingerprint(registry: Registry) -> str:
    """A short hash of the handlers' code: their types and their modules' source files.

    Two processes with the same fingerprint run the same handler code; a deploy that
    changed a handler's module changes it. Computed once per set of handlers."""
    types = tuple(registry.types())
    if types not in _fingerprints:
        digest = hashlib.sha256()
        files = set()
        for type_ in types:
            digest.update(type_.encode())
            handler = registry.find(type_)
            name = getattr(handler.func, "__module__", None) if handler is not None else None
            path = getattr(sys.modules.get(name or ""), "__file__", None)
            if path:
                files.add(path)
        for path in sorted(files):
            try:
                with open(path, "rb") as source:
                    digest.update(source.read())
            except OSError:
                digest.update(path.encode())
        _fingerprints[types] = digest.hexdigest()[:12]
    return _fingerprints[types]
