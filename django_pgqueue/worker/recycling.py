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

from ..worker_config import WorkerConfig
from .report import RECYCLE, SupervisorReport
from .signals import StopSwitch

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

    def __init__(self, config: WorkerConfig, report: SupervisorReport | None = None) -> None:
        self.max_jobs = config.max_jobs_per_process
        self.max_memory = config.max_memory_per_process
        self.worker_id = config.worker_id
        self.report = report  # told when the process leaves (None: no supervisor)
        self.taken = 0  # jobs claimed
        self.reason: str | None = None  # set once the process takes no new job
        self.left = False  # it ran its share, and is on its way out

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

    def done(self, switch: StopSwitch, *, busy: bool) -> bool:
        """Handlers ended (others still run if `busy`): look at the memory they left.
        Once the process has done its share and nothing runs, stop it through `switch`
        (its shutdown writes what is left; its supervisor is told); True then."""
        if self.max_memory is not None and self.reason is None:
            used = resident_mib()
            if used > self.max_memory:
                self._drain(
                    f"its resident memory is {used:.0f} MiB "
                    f"(--max-memory-per-process {self.max_memory})"
                )
        if self.reason is None or busy or self.left:
            return False
        self.left = True
        logger.info("worker %s: recycled (%s); exiting", self.worker_id, self.reason)
        if self.report is not None:
            self.report.send(RECYCLE, reason=self.reason)
        switch.request_graceful()
        return True

    def _drain(self, why: str) -> None:
        self.reason = why
        logger.info(
            "worker %s: recycling: %s; it takes no new job and exits once its handlers ended",
            self.worker_id,
            why,
            extra={"worker_id": self.worker_id},
        )
