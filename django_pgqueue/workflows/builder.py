"""`Workflow`: a DAG of steps, each naming the steps it waits for, enqueued in one statement;
`WorkflowRun`: an enqueued one, its result waited for."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from django.db import transaction

from .. import enqueue_scope, extensions, validation, waiting
from ..aenqueue import call_sync
from ..conf import get_settings
from ..exceptions import EnqueueError, JobFailed, WorkflowFailed
from ..job_refs import JobRef, carried_database
from ..store import operator
from ..store import workflows as store
from .steps import Step, step


@dataclass(frozen=True)
class Cancelled:
    """What cancelling a workflow did: the steps cancelled, and the running steps asked
    to stop (they end cancelled when their worker writes their outcome)."""

    cancelled: list[int]
    requested: list[int]


@dataclass(frozen=True)
class WorkflowRun:
    """An enqueued workflow: its id and each step's job id, by step name.

    `using` is the alias of the database it was written on (None: PGQUEUE["DATABASE"]);
    `job(name)` names a step's job with it, for `wait()` and the other APIs that take
    a job (a bare id from `jobs` is read on DATABASE). `outputs` are the steps whose
    results are the workflow's (a chain's last step, a group's members' last steps, a
    chord's callback; a `Workflow`'s steps that no step waits for), `as_list` whether
    that result is their list (a group, or several outputs) rather than one's result.
    """

    id: int
    jobs: dict[str, int] = field(default_factory=dict)
    using: str | None = None
    name: str = "workflow"
    outputs: tuple[str, ...] = ()
    as_list: bool = False

    def job(self, name: str) -> JobRef:
        """Step `name`'s job, with the workflow's database (for `wait()` and the rest)."""
        if name not in self.jobs:
            steps = ", ".join(repr(step) for step in self.jobs)
            raise KeyError(f"workflow #{self.id} has no step {name!r} (its steps: {steps})")
        return JobRef(self.jobs[name], self.using or get_settings().DATABASE)

    def cancel(self) -> Cancelled:
        """Cancel the workflow: its pending and waiting steps, and ask running ones to stop."""
        return cancel_workflow(self)

    def wait(self, timeout: float | None = None) -> Any:
        """Wait until the workflow's outputs finished; return its result.

        A group's list of results (in group order, ``[]`` for an empty one), a chord's
        callback's result, a chain's last step's. Read on the workflow's database, on a
        connection of the wait's own. Raises `WorkflowFailed` (a `JobFailed`) naming the
        step that failed and its error, `WaitTimeout` when the outputs have not all
        finished within `timeout` seconds (None: no limit).
        """
        deadline = _deadline(timeout)
        results = []
        for output in self.outputs:
            try:
                results.append(waiting.wait(self.job(output), _left(deadline)))
            except JobFailed as exc:
                failure = self._failure()
                if failure is None:
                    raise
                raise failure from exc
        return self._shaped(results)

    async def wait_async(self, timeout: float | None = None) -> Any:
        """`wait` for asyncio: awaits the result without blocking the event loop."""
        deadline = _deadline(timeout)
        results = []
        for output in self.outputs:
            try:
                results.append(await waiting.await_job(self.job(output), _left(deadline)))
            except JobFailed as exc:
                failure = await call_sync(self._failure)
                if failure is None:
                    raise
                raise failure from exc
        return self._shaped(results)

    def result(self) -> Any:
        """The workflow's result now, without waiting: `wait` with a timeout of 0
        (`WaitTimeout` while an output has not finished)."""
        return self.wait(0)

    def _shaped(self, results: list[Any]) -> Any:
        if self.as_list:
            return results
        return results[0] if results else None

    def _failure(self) -> WorkflowFailed | None:
        """The error naming the step that failed by itself (None: none found, pruned)."""
        found = store.workflow_failure(self.using or get_settings().DATABASE, self.id)
        return None if found is None else WorkflowFailed(self.name, self.id, *found)


class Workflow:
    """A general workflow: steps added by name, each waiting for the steps it names.

    ``after`` may name steps added later; `enqueue` refuses unknown names and cycles,
    naming them, before anything is written. `allow_empty`: a workflow of no steps is
    written (a canvas's empty group) rather than refused.
    """

    def __init__(self, name: str = "workflow", *, allow_empty: bool = False) -> None:
        if not isinstance(name, str) or not name:
            raise EnqueueError(f"a workflow's name must be a non-empty string, got {name!r}.")
        self.name = name
        self.allow_empty = allow_empty
        self._steps: dict[str, tuple[Step, tuple[str, ...]]] = {}

    def __len__(self) -> int:
        return len(self._steps)

    def add(
        self,
        name: str,
        target: Step | Any,
        payload: Any = None,
        *,
        after: Iterable[str] = (),
        **options: Any,
    ) -> str:
        """Add step `name`: a `Step`, or a job type or ``@task`` with `step`'s arguments.

        Returns `name`, to use in a later step's `after`.
        """
        if isinstance(target, Step):
            if payload is not None:
                raise EnqueueError(f"step {name!r}: a Step carries its payload already.")
            made = replace(target, **options) if options else target
        else:
            made = step(target, payload, **options)
        if not isinstance(name, str) or not name:
            raise EnqueueError(f"a step's name must be a non-empty string, got {name!r}.")
        if name in self._steps:
            raise EnqueueError(f"workflow {self.name!r} has a step named {name!r} already.")
        parents = tuple(dict.fromkeys(after if not isinstance(after, str) else [after]))
        self._steps[name] = (made, parents)
        return name

    def link_error(self, target: Step | Any, payload: Any = None, **options: Any) -> str:
        """Add a step that runs only if a step before it failed (dead or cancelled).

        It waits for every step added so far (or those named in ``after``), and is
        skipped (cancelled, saying so) when they all completed.
        """
        after = options.pop("after", None)
        name = options.pop("name", None) or f"link_error-{len(self._steps)}"
        parents = list(self._steps) if after is None else after
        made = target if isinstance(target, Step) else step(target, payload, **options)
        made = replace(made, name=name, on_failure="error")
        return self.add(name, made, after=parents)

    def order(self) -> list[str]:
        """The step names, parents before children; EnqueueError on an unknown step or a cycle."""
        unknown = sorted(
            (name, parent)
            for name, (_, parents) in self._steps.items()
            for parent in parents
            if parent not in self._steps
        )
        if unknown:
            listed = ", ".join(f"{child!r} waits for {parent!r}" for child, parent in unknown)
            raise EnqueueError(f"workflow {self.name!r}: unknown steps: {listed}.")
        for name, (_, parents) in self._steps.items():
            if name in parents:
                raise EnqueueError(f"workflow {self.name!r}: step {name!r} waits for itself.")
        return _topological(self.name, {n: ps for n, (_, ps) in self._steps.items()})

    def enqueue(self, *, using: str | None = None) -> WorkflowRun:
        """Write the whole workflow in one statement, in the caller's transaction.

        Steps without dependencies are due at once; the others wait, in no claim index,
        until the statement that finishes their last dependency makes them pending.
        Everything is validated first: nothing is written if any step is refused.
        """
        if not self._steps and not self.allow_empty:
            raise EnqueueError(f"workflow {self.name!r} has no steps.")
        conf = get_settings()
        names = self.order()
        position = {name: index for index, name in enumerate(names)}
        rows: list[store.StepRow] = []
        payloads: list[Any] = []
        for name in names:
            made, parents = self._steps[name]
            try:
                options = made.checked_options()
            except EnqueueError as exc:
                raise EnqueueError(f"workflow {self.name!r}, step {name!r}: {exc}") from exc
            rows.append(store.StepRow(*options, name, made.on_failure, len(parents), made.collects))
            payloads.append(made.payload)
        edges = [
            (position[name], position[parent]) for name in names for parent in self._steps[name][1]
        ]
        try:
            text = validation.payloads(payloads, conf.MAX_PAYLOAD_BYTES)
        except EnqueueError as exc:
            raise EnqueueError(f"workflow {self.name!r}: {exc} (the step order: {names})") from exc
        alias = using or (self._database(rows) if rows else conf.DATABASE)
        # Inside a transaction on another database only, it could not be atomic with it.
        enqueue_scope.commit_to_wait_for(
            alias, rows[0].queue if rows else conf.DEFAULT_QUEUE, on_commit=False
        )
        traceparent = extensions.enqueue_columns().get("traceparent")
        workflow_id, job_ids = store.insert_workflow(
            alias, self.name, rows, text, edges, traceparent
        )
        where = None if alias == conf.DATABASE else alias
        jobs = dict(zip(names, job_ids, strict=True))
        outputs = self._outputs()
        return WorkflowRun(workflow_id, jobs, where, self.name, outputs, len(outputs) != 1)

    def _outputs(self) -> tuple[str, ...]:
        """The steps no step waits for, link_error steps left out, in the order added."""
        waited_for = {parent for _, parents in self._steps.values() for parent in parents}
        return tuple(
            name
            for name, (made, _) in self._steps.items()
            if name not in waited_for and made.on_failure != "error"
        )

    async def aenqueue(self, *, using: str | None = None) -> WorkflowRun:
        """`enqueue` from async code, in the caller's transaction (`aatomic`)."""
        return await call_sync(self.enqueue, using=using)

    def _database(self, rows: Sequence[store.StepRow]) -> str:
        """The database the steps' queues live on (QUEUE_DATABASES); EnqueueError when
        they span several: a step can wait only for steps of its own database."""
        conf = get_settings()
        found: dict[str, str] = {}
        for row in rows:
            found.setdefault(conf.database_for(row.queue), row.queue)
        if len(found) > 1:
            where = ", ".join(f"{queue!r} on {alias!r}" for alias, queue in found.items())
            raise EnqueueError(
                f"workflow {self.name!r} has steps on queues of several databases ({where}): "
                "its steps wait for each other within one database. Route its queues to "
                "one database (PGQUEUE['QUEUE_DATABASES']), or pass using= to write it all "
                "on one."
            )
        return next(iter(found))


def _deadline(timeout: float | None) -> float | None:
    """When a wait of `timeout` seconds ends (None: never); TypeError or ValueError for
    a bad timeout."""
    limit = waiting.checked_timeout(timeout)
    return None if limit is None else time.monotonic() + limit


def _left(deadline: float | None) -> float | None:
    """The seconds left until `deadline` (0 once it passed: look once more)."""
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def _topological(workflow: str, graph: dict[str, Sequence[str]]) -> list[str]:
    """`graph`'s nodes, each after the nodes it names; EnqueueError naming a cycle."""
    done: set[str] = set()
    order: list[str] = []
    for root in graph:
        if root in done:
            continue
        # An explicit stack (a workflow may be thousands of steps long): node, next parent.
        path: list[str] = [root]
        on_path = {root}
        stack: list[tuple[str, int]] = [(root, 0)]
        while stack:
            node, index = stack[-1]
            parents = graph[node]
            if index < len(parents):
                stack[-1] = (node, index + 1)
                parent = parents[index]
                if parent in on_path:
                    cycle = [*path[path.index(parent) :], parent]
                    raise EnqueueError(
                        f"workflow {workflow!r} has a cycle: "
                        + " -> ".join(repr(n) for n in reversed(cycle))
                    )
                if parent not in done:
                    path.append(parent)
                    on_path.add(parent)
                    stack.append((parent, 0))
                continue
            stack.pop()
            path.pop()
            on_path.discard(node)
            done.add(node)
            order.append(node)
    return order


def cancel_workflow(workflow: WorkflowRun | int, *, using: str | None = None) -> Cancelled:
    """Cancel a workflow's pending and waiting steps; ask its running steps to stop.

    `workflow` is what `Workflow.enqueue()` returned, cancelled on its database, or a
    workflow id, on PGQUEUE["DATABASE"] or `using`. Finished steps are left as they
    are. One transaction: the cancelled steps settle what waits on them in the same
    statement (job_cancel), then the running ones are marked (job_cancel_request) and
    end cancelled when their worker writes them.
    """
    if isinstance(workflow, WorkflowRun):
        where = f"workflow #{workflow.id}"
        alias = carried_database(workflow.using, using, where, "cancel_workflow()")
        workflow_id = workflow.id
    else:
        alias, workflow_id = using or get_settings().DATABASE, workflow
    with transaction.atomic(using=alias):
        live = [
            job_id
            for job_id, status in store.workflow_jobs(alias, workflow_id)
            if status in ("waiting", "pending", "running")
        ]
        cancelled = operator.cancel_jobs(alias, live) if live else set()
        rest = [job_id for job_id in live if job_id not in cancelled]
        requested = operator.request_cancel(alias, rest) if rest else set()
    return Cancelled(sorted(cancelled), sorted(requested))
