"""Celery's canvas on top of `Workflow`: `chain`, `group` and `chord`.

Each is a description until `enqueue()`: it is placed into a `Workflow` (a chain's
items each wait for the previous item's last steps, a group's items wait for the
same steps, a chord is a group then its callback) and written in one statement.
Items are `Step`s, job types (``"type"`` or ``("type", payload)``), ``@task``s, or
other canvases: a chain of groups, a group of chains, a chord inside a chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..exceptions import EnqueueError
from .builder import Workflow, WorkflowRun
from .steps import Step, step


class Canvas:
    """A chain, group or chord not enqueued yet."""

    kind = "canvas"

    def enqueue(self, *, name: str | None = None, using: str | None = None) -> WorkflowRun:
        """Enqueue it as one workflow, in the caller's transaction (all or nothing)."""
        return self.workflow(name).enqueue(using=using)

    async def aenqueue(self, *, name: str | None = None, using: str | None = None) -> WorkflowRun:
        """`enqueue` from async code, in the caller's transaction (`aatomic`)."""
        return await self.workflow(name).aenqueue(using=using)

    def workflow(self, name: str | None = None) -> Workflow:
        """The `Workflow` this canvas stands for (to add steps to, or to inspect)."""
        flow = Workflow(name or self.kind)
        self.place(flow, [])
        return flow

    def link_error(self, target: Any, payload: Any = None, **options: Any) -> Canvas:
        """This canvas, with a step that runs only if one of its steps failed."""
        return _WithErrback(self, _as_step(target, payload, options))

    def place(self, flow: Workflow, after: list[str]) -> list[str]:
        """Add this canvas's steps to `flow`, waiting for `after`; return its last steps."""
        raise NotImplementedError


class chain(Canvas):
    """Items one after the other: each waits for the previous one's last steps."""

    kind = "chain"

    def __init__(self, *items: Any) -> None:
        if not items:
            raise EnqueueError("chain() needs at least one item.")
        self.items = [_as_item(item) for item in items]

    def place(self, flow: Workflow, after: list[str]) -> list[str]:
        for item in self.items:
            after = _place(item, flow, after)
        return after


class group(Canvas):
    """Items side by side: each waits for the same steps; all of them are its last steps."""

    kind = "group"

    def __init__(self, *items: Any) -> None:
        if len(items) == 1 and isinstance(items[0], list | tuple) and not _is_pair(items[0]):
            items = tuple(items[0])  # group([a, b, c]), as Celery accepts
        if not items:
            raise EnqueueError("group() needs at least one item.")
        self.items = [_as_item(item) for item in items]

    def place(self, flow: Workflow, after: list[str]) -> list[str]:
        last: list[str] = []
        for item in self.items:
            last.extend(_place(item, flow, after))
        return last


class chord(Canvas):
    """A group, then a callback that waits for all of it and reads its results
    (``ctx.parent_results``, in group order)."""

    kind = "chord"

    def __init__(self, header: Any, body: Any) -> None:
        self.header = header if isinstance(header, group) else group(header)
        self.body = _as_item(body)

    def place(self, flow: Workflow, after: list[str]) -> list[str]:
        return _place(self.body, flow, self.header.place(flow, after))


class _WithErrback(Canvas):
    def __init__(self, inner: Canvas, errback: Step) -> None:
        self.inner, self.errback = inner, errback
        self.kind = inner.kind

    def place(self, flow: Workflow, after: list[str]) -> list[str]:
        known = set(flow._steps)
        last = self.inner.place(flow, after)
        mine = [name for name in flow._steps if name not in known]
        flow.link_error(self.errback, after=mine, name=self.errback.name)
        return last


def _is_pair(item: Any) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)


def _as_step(target: Any, payload: Any, options: dict[str, Any]) -> Step:
    if isinstance(target, Step):
        return replace(target, **options) if options else target
    return step(target, payload, **options)


def _as_item(item: Any) -> Step | Canvas:
    """A canvas item as a `Step` or a `Canvas`."""
    if isinstance(item, Step | Canvas):
        return item
    if _is_pair(item):
        return step(item[0], item[1])
    if isinstance(item, str) or hasattr(item, "module_path"):
        return step(item)
    raise EnqueueError(
        "a canvas item is a Step, a job type, a (type, payload) pair, a @task or a "
        f"chain/group/chord, got {type(item).__name__}."
    )


def _place(item: Step | Canvas, flow: Workflow, after: Sequence[str]) -> list[str]:
    if isinstance(item, Canvas):
        return item.place(flow, list(after))
    name = item.name or f"{item.type}-{len(flow)}"
    return [flow.add(name, item, after=after)]
