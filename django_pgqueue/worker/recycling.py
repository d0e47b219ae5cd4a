"""Recycling: a worker process that ran --max-jobs-per-process jobs, or whose resident
memory passed --max-memory-per-process, takes no new job, lets what it runs end, and
exits for its supervisor to start a fresh one (Celery's --max-tasks-per-child and
--max-memory-per-child).

Claims are sized so that the process never claims more jobs than it has left: none
is handed back or run twice for it. Used by the dispatcher thread only.
"""

from __future__ import annotations

import logging
import os
import resource

logger = logging.getLogger(__name__)

MIB = 1024 * 1024


def resident_mib() -> float:
    """This process's resident memory now, in MiB (its peak where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / MIB
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


class Recycling:
    """When this process has done its share: `max_jobs` claimed, or `max_memory` MiB."""

    def __init__(self, max_jobs: int | None, max_memory: int | None, worker_id: str) -> None:
        self.max_jobs = max_jobs
        self.max_memory = max_memory
        self.worker_id = worker_id
        self.taken = 0  # jobs claimed
        self.reason: str | None = None  # set once the process takes no new job

    @property
    def draining(self) -> bool:
        return self.reason is not None

    def room(self, wanted: int) -> int:
        """How many of `wanted` jobs a claim may take before the process has its share."""
        if self.reason is not None:
            return 0
        if self.max_jobs is None:
            return wanted
        return min(wanted, self.max_jobs - self.taken)

    def claimed(self, count: int) -> None:
        """`count` jobs were claimed."""
        self.taken += count
        if self.max_jobs is not None and self.taken >= self.max_jobs and self.reason is None:
            self._drain(f"it ran {self.taken} jobs (--max-jobs-per-process {self.max_jobs})")

    def jobs_ended(self) -> None:
        """Handlers ended: look at the memory they left."""
        if self.max_memory is None or self.reason is not None:
            return
        used = resident_mib()
        if used > self.max_memory:
            self._drain(
                f"its resident memory is {used:.0f} MiB "
                f"(--max-memory-per-process {self.max_memory})"
            )

    def _drain(self, why: str) -> None:
        self.reason = why
        logger.info(
            "worker %s: recycling: %s; it takes no new job and exits once its handlers ended",
            self.worker_id,
            why,
            extra={"worker_id": self.worker_id},
        )
