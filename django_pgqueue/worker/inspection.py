"""What a worker process says of itself (`report`): its account at one moment, the
jobs it runs (since how long, which attempt), those it claimed and has not started,
its queues and their weights, the handlers it registered, its counters since start,
its memory and its code. The registry service writes it with the process's beat (one
statement), so whoever reads it (``inspect_queue_workers``, the admin's Workers page)
sees one reading, never a count from one moment beside a list from another.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from ..claimed import ClaimedJob
from ..registry import Registry
from ..version import __version__
from ..worker_config import WorkerConfig
from .controls import Controls

# The most jobs of each list (running, claimed) a report carries.
REPORT_JOBS = 50


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
