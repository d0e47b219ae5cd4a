"""A workflow's step: a job type and payload, or a Django ``@task`` call, with its options.

Steps compose with ``|`` into chains, as Celery's signatures do (see `canvas`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import validators
from ..enqueue import check_options
from ..exceptions import EnqueueError

# What a step does when a job it waits for ends dead or cancelled: be cancelled too
# (the default, recorded why), run anyway once all have finished ("run"), or run only
# then ("error": a link_error step, skipped when nothing failed).
ON_FAILURE = ("cancel", "run", "error")

# Makes ``a | b`` a chain: set by the canvas module, which builds on this one.
chain_maker: Callable[..., Any] | None = None


def _chain(*items: Any) -> Any:
    if chain_maker is None:
        raise RuntimeError("a | b needs django_pgqueue.workflows.canvas (import it).")
    return chain_maker(*items)


@dataclass(frozen=True, slots=True)
class Step:
    """One job of a workflow. `name` defaults to one the canvas makes up (``<type>-<n>``).

    `collects`: the step takes its parents' results as one list, whatever their number
    (set by the canvas for a chord's callback and a step after a group). A `delay`
    counts from the end of the last step it waits for (from the enqueue for a step
    that waits for none).
    """

    type: str
    payload: Any = None
    name: str | None = None
    on_failure: str = "cancel"
    queue: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    run_at: dt.datetime | None = None
    delay: float | dt.timedelta | None = None
    collects: bool = False

    def __or__(self, other: Any) -> Any:
        """``a | b``: a chain of this step, then `other` (a step, a chain, a group...)."""
        return _chain(self, other)

    def __ror__(self, other: Any) -> Any:
        """``"type" | step``: `other` as a step, then this one."""
        return _chain(other, self)

    def __post_init__(self) -> None:
        if self.on_failure not in ON_FAILURE:
            raise EnqueueError(
                f"on_failure must be one of {', '.join(map(repr, ON_FAILURE))}, "
                f"got {self.on_failure!r}."
            )
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise EnqueueError(f"a step's name must be a non-empty string, got {self.name!r}.")

    def checked_options(self) -> Any:
        """The step's job options, validated as enqueue() validates them (EnqueueError)."""
        return check_options(
            self.type,
            queue=self.queue,
            priority=self.priority,
            run_at=self.run_at,
            delay=self.delay,
            max_attempts=self.max_attempts,
        )


def _is_task(target: Any) -> bool:
    """Whether `target` is a Django Tasks ``Task`` (duck-typed: django.tasks or the backport)."""
    return hasattr(target, "module_path") and hasattr(target, "func") and hasattr(target, "call")


def step(
    target: Any,
    payload: Any = None,
    *,
    args: tuple[Any, ...] | list[Any] = (),
    kwargs: dict[str, Any] | None = None,
    name: str | None = None,
    on_failure: str = "cancel",
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    takes_results: bool = False,
) -> Step:
    """A step from a job type and payload, or from a ``@task`` and its arguments.

    ``step("send_email", {"to": ...})`` runs the handler of ``send_email``;
    ``step(send_email_task, args=[...], kwargs={...})`` runs the task as
    ``send_email_task.enqueue(...)`` would (its queue and priority unless given).

    ``takes_results=True`` (a task step): the task receives the results of the steps
    it waits for as its first argument, before `args` (after its context when it takes
    one): one parent's result as it is, several as a list in parent order, a list
    always after a group (a chord's callback). A ``link_error`` step receives the
    failure (`StepFailure`: the failed job's id, error and traceback) instead. A
    handler opts in with ``@handler(..., takes_results=True)``, a task for all its
    steps with ``"takes_results": True`` in its ``OPTIONS["TASKS"]`` entry.
    """
    validators.flag(takes_results, "takes_results", error=EnqueueError)
    if _is_task(target):
        if payload is not None:
            raise EnqueueError("a task step takes args= and kwargs=, not a payload.")
        call: dict[str, Any] = {"args": list(args), "kwargs": dict(kwargs or {})}
        if takes_results:
            call["takes_results"] = True
        backend = getattr(target, "backend", None)
        if isinstance(backend, str):
            call["backend"] = backend
        payload = call
        queue = queue if queue is not None else getattr(target, "queue_name", None)
        priority = priority if priority is not None else getattr(target, "priority", None)
        target = target.module_path
    elif args or kwargs:
        raise EnqueueError(
            f"args= and kwargs= are for a @task step; the job type {target!r} takes a payload."
        )
    elif takes_results:
        raise EnqueueError(
            f"takes_results= is for a @task step; the handler of {target!r} takes its "
            "parents' results with @handler(..., takes_results=True)."
        )
    return Step(
        target,
        payload,
        name=name,
        on_failure=on_failure,
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        run_at=run_at,
        delay=delay,
    )
