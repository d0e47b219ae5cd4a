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
from ..extensions import AsyncRunner, JobObserver, RunMiddleware, Runner
from ..outcomes import Outcome

logger = logging.getLogger(__name__)

# An attempt's run through the middleware: (item, the executor's run) -> outcome.
Run = Callable[[ClaimedJob, Runner], Outcome]
AsyncRun = Callable[[ClaimedJob, AsyncRunner], Awaitable[Outcome]]


def _told_of_some(method: str) -> Callable[[Observers, Sequence[Any]], None]:
    """The `Observers` method that tells every observer's `method` of a list of jobs (or
    job ends), unless the list is empty."""

    def tell(self: Observers, items: Sequence[Any]) -> None:
        if items:
            self._tell(method, items)

    tell.__name__ = method
    return tell


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

    # Each observer is told of a non-empty list only: nothing claimed, released,
    # executed or ended tells nobody.
    jobs_claimed = _told_of_some("jobs_claimed")
    jobs_released = _told_of_some("jobs_released")
    jobs_executed = _told_of_some("jobs_executed")
    jobs_ended = _told_of_some("jobs_ended")

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
