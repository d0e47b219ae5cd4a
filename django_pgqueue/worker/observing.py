"""The worker's side of the job-event observers and the run middleware
(`extensions.JobObserver`, `extensions.RunMiddleware`).

`Observers` tells every observer in turn, on the dispatcher thread; one that raises is
logged and the others are told all the same: an observer never fails a job nor stops
the worker. `through` nests the middleware around the executor's run, the first listed
outermost.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from ..claimed import ClaimedJob
from ..extensions import AsyncRunner, JobEnd, JobObserver, RunMiddleware, Runner
from ..outcomes import Outcome

logger = logging.getLogger(__name__)

# An attempt's run through the middleware: (item, the executor's run) -> outcome.
Run = Callable[[ClaimedJob, Runner], Outcome]
AsyncRun = Callable[[ClaimedJob, AsyncRunner], Awaitable[Outcome]]


class Observers:
    """The worker's job-event observers, told in turn."""

    def __init__(self, observers: Sequence[JobObserver] = ()) -> None:
        self.observers: list[JobObserver] = list(observers)

    def add(self, observer: JobObserver) -> None:
        self.observers.append(observer)

    def _tell(self, method: str, *args: Any) -> None:
        for observer in self.observers:
            try:
                getattr(observer, method)(*args)
            except Exception:
                logger.exception("job observer %r failed in %s", observer, method)

    def jobs_claimed(self, items: Sequence[ClaimedJob]) -> None:
        if items:
            self._tell("jobs_claimed", items)

    def jobs_released(self, items: Sequence[ClaimedJob]) -> None:
        if items:
            self._tell("jobs_released", items)

    def jobs_executed(self, items: Sequence[ClaimedJob]) -> None:
        if items:
            self._tell("jobs_executed", items)

    def jobs_ended(self, ends: Sequence[JobEnd]) -> None:
        if ends:
            self._tell("jobs_ended", ends)

    def lease_lost(self, item: ClaimedJob, detected_by: str) -> None:
        """Told once per attempt, whoever finds it first (a renewal, a fenced write)."""
        if not item.lost_told:
            item.lost_told = True
            self._tell("lease_lost", item, detected_by)


def _run(item: ClaimedJob, run: Runner) -> Outcome:
    return run(item.ctx, item.handler, item.policy)


async def _arun(item: ClaimedJob, run: AsyncRunner) -> Outcome:
    return await run(item.ctx, item.handler, item.policy)


def through(middleware: Sequence[RunMiddleware]) -> Run:
    """One run of an attempt through `middleware` (the first listed outermost)."""
    run: Run = _run
    for outer in reversed(middleware):
        run = partial(_around, outer.run, run)
    return run


def athrough(middleware: Sequence[RunMiddleware]) -> AsyncRun:
    """`through` for async handlers, on the worker's event loop."""
    run: AsyncRun = _arun
    for outer in reversed(middleware):
        run = partial(_around, outer.arun, run)
    return run


def _around(
    outer: Callable[..., Any], inner: Callable[..., Any], item: ClaimedJob, runner: Any
) -> Any:
    """`outer(item, ...)` with the rest of the chain as the runner it calls once."""
    return outer(item, lambda ctx, handler, policy: inner(item, runner))
