"""Celery's canvas on top of `Workflow`: `chain`, `group`, `chord` and ``|``.

Each is a description until `enqueue()`: it is placed into a `Workflow` (a chain's
items each wait for the previous item's last steps, a group's items wait for the
same steps, a chord is a group then its callback) and written in one statement.
Items are `Step`s, job types (``"type"`` or ``("type", payload)``), ``@task``s, or
other canvases: a chain of groups, a group of chains, a chord inside a chain.

They compose with ``|`` as Celery's do: ``a | b`` is ``chain(a, b)`` (a chain's items
spliced in), ``group | b`` is ``chord(group, b)``. A step placed after a group (a
chord's callback among them) collects: it takes its parents' results as one list,
``[]`` after an empty group, as Celery hands them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..exceptions import EnqueueError
from . import steps
from .builder import Workflow, WorkflowRun
from .steps import Step, step


class Canvas:
    """A chain, group or chord not enqueued yet; `name` names its workflow (the admin
    lists it by that name)."""

    kind = "canvas"
    name: str | None = None

    def enqueue(self, *, name: str | None = None, using: str | None = None) -> WorkflowRun:
        """Enqueue it as one workflow, in the caller's transaction (all or nothing).

        The run's `wait()` returns the canvas's result: a chain's last step's, a
        group's list, a chord's callback's.
        """
        flow, outputs = self._built(name)
        return self._shaped(flow.enqueue(using=using), outputs)

    async def aenqueue(self, *, name: str | None = None, using: str | None = None) -> WorkflowRun:
        """`enqueue` from async code, in the caller's transaction (`aatomic`)."""
        flow, outputs = self._built(name)
        return self._shaped(await flow.aenqueue(using=using), outputs)

    def workflow(self, name: str | None = None) -> Workflow:
        """The `Workflow` this canvas stands for (to add steps to, or to inspect)."""
        return self._built(name)[0]

    def link_error(self, target: Any, payload: Any = None, **options: Any) -> Canvas:
        """This canvas, with a step that runs only if one of its steps failed.

        A task step with ``takes_results=True`` (a handler with it) receives the
        failure: a `StepFailure` with the failed job's id, error and traceback.
        """
        return _WithErrback(self, _as_step(target, payload, options))

    def place(self, flow: Workflow, after: list[str], *, collects: bool) -> list[str]:
        """Add this canvas's steps to `flow`, waiting for `after` (their results as one
        list when `collects`); return its last steps."""
        raise NotImplementedError

    def gives_list(self) -> bool:
        """Whether its result is a list (a group's) rather than one step's result."""
        raise NotImplementedError

    def __or__(self, other: Any) -> Canvas:
        return chain(self, other)

    def __ror__(self, other: Any) -> Canvas:
        return chain(other, self)

    def _built(self, name: str | None) -> tuple[Workflow, list[str]]:
        """The workflow it stands for, and its last steps."""
        flow = Workflow(name or self.name or self.kind, allow_empty=True)
        return flow, self.place(flow, [], collects=False)

    def _shaped(self, run: WorkflowRun, outputs: list[str]) -> WorkflowRun:
        """`run` with this canvas's outputs: its last steps, and whether they are a list."""
        return replace(run, outputs=tuple(outputs), as_list=self.gives_list())


def _named(name: Any, kind: str) -> str | None:
    if name is not None and (not isinstance(name, str) or not name):
        raise EnqueueError(f"a {kind}'s name must be a non-empty string, got {name!r}.")
    return name


class chain(Canvas):
    """Items one after the other: each waits for the previous one's last steps."""

    kind = "chain"

    def __init__(self, *items: Any, name: str | None = None) -> None:
        if len(items) == 1 and _is_iterable(items[0]):
            items = tuple(items[0])  # chain(generator), chain([a, b])
        if not items:
            raise EnqueueError("chain() needs at least one item.")
        self.name = _named(name, self.kind)
        self.items: list[Step | Canvas] = []
        for item in map(_as_item, items):
            # A plain chain in a chain is spliced in, as Celery's ``|`` does.
            if isinstance(item, chain) and item.name is None:
                self.items.extend(item.items)
            else:
                self.items.append(item)

    def place(self, flow: Workflow, after: list[str], *, collects: bool) -> list[str]:
        for item in self.items:
            after = _place(item, flow, after, collects)
            collects = isinstance(item, Canvas) and item.gives_list()
        return after

    def gives_list(self) -> bool:
        last = self.items[-1]
        return isinstance(last, Canvas) and last.gives_list()

    def __or__(self, other: Any) -> Canvas:
        return chain(*self.items, other, name=self.name)


class group(Canvas):
    """Items side by side: each waits for the same steps; all of them are its last steps.

    Takes items, one list of them, or a generator (``group(fetch(u) for u in urls)``);
    an empty group has no steps, and its result is ``[]``: alone, as a chord's header
    (the callback runs at once, with ``[]``), or first in a chain. After other steps it
    is refused: what follows it would wait for nothing and run at once.
    """

    kind = "group"

    def __init__(self, *items: Any, name: str | None = None) -> None:
        if len(items) == 1 and _is_iterable(items[0]):
            items = tuple(items[0])  # group([a, b, c]), group(x for x in ...), as Celery
        self.name = _named(name, self.kind)
        self.items = [_as_item(item) for item in items]

    def place(self, flow: Workflow, after: list[str], *, collects: bool) -> list[str]:
        if not self.items and after:
            raise EnqueueError(
                f"{flow.name!r}: an empty group after other steps: what follows it would "
                "wait for nothing and run before them. Leave the group out, or put it first."
            )
        last: list[str] = []
        for item in self.items:
            last.extend(_place(item, flow, after, collects))
        return last

    def gives_list(self) -> bool:
        return True

    def __or__(self, other: Any) -> Canvas:
        # Celery upgrades a group followed by a task to a chord.
        if isinstance(other, group | chain | chord):
            return chain(self, other)
        return chord(self, other)


class chord(Canvas):
    """A group, then a callback that waits for all of it and receives its results (as
    one list, in group order, ``[]`` for an empty group, when it takes them; else
    ``ctx.parent_results``)."""

    kind = "chord"

    def __init__(self, header: Any, body: Any, *, name: str | None = None) -> None:
        self.name = _named(name, self.kind)
        self.header = header if isinstance(header, group) else group(header)
        self.body = _as_item(body)

    def place(self, flow: Workflow, after: list[str], *, collects: bool) -> list[str]:
        return _place(self.body, flow, self.header.place(flow, after, collects=collects), True)

    def gives_list(self) -> bool:
        return isinstance(self.body, Canvas) and self.body.gives_list()


class _WithErrback(Canvas):
    def __init__(self, inner: Canvas, errback: Step) -> None:
        self.inner, self.errback = inner, errback
        self.kind, self.name = inner.kind, inner.name

    def place(self, flow: Workflow, after: list[str], *, collects: bool) -> list[str]:
        known = set(flow._steps)
        last = self.inner.place(flow, after, collects=collects)
        mine = [name for name in flow._steps if name not in known]
        flow.link_error(self.errback, after=mine, name=self.errback.name)
        return last

    def gives_list(self) -> bool:
        return self.inner.gives_list()


steps.chain_maker = chain


def _is_pair(item: Any) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)


def _is_iterable(item: Any) -> bool:
    """Whether `item` is a collection of items (a list, a tuple, a generator), not one."""
    if isinstance(item, str | bytes | dict | Step | Canvas) or _is_pair(item):
        return False
    return hasattr(item, "__iter__")


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


def _place(item: Step | Canvas, flow: Workflow, after: Sequence[str], collects: bool) -> list[str]:
    if isinstance(item, Canvas):
        return item.place(flow, list(after), collects=collects)
    name = item.name or f"{item.type}-{len(flow)}"
    return [flow.add(name, replace(item, collects=collects) if collects else item, after=after)]
