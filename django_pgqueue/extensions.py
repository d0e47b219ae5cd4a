"""The seam features plug into: enqueue and the worker call hooks, never a feature.

A feature is an `Extension`, named by its dotted path in ``PGQUEUE["EXTENSIONS"]``
(queue control, schedules and observability by default). It may

- fill columns of a job at enqueue, from the caller's context (`enqueue_columns`);
- gather the jobs enqueued in a scope of the caller's (a batch): it sets
  `routing.enqueue_listener` for the scope, and enqueue tells it the new job ids;
- give each worker process a `WorkerHooks` object (`worker_hooks`), whose methods the
  worker calls at fixed points: the claim of a queue, an outcome written, a heartbeat,
  a periodic pass, the worker's start.

The worker sorts the hooks by point once, at start (`Hooks`): a point nobody hooks
costs nothing, one hooked once costs one call.

What a hook may do: observe, and add work of its own (its own statements on the store
it is given, jobs of its own). What it may not:

- decide who owns a job. Leases do: every write about a claimed job stays one of the
  core's fenced statements, and a hook that takes over a claim (`WorkerHooks.claim`)
  runs the same claim rules (one queue, SKIP LOCKED, a new lease version);
- raise into the worker: a hook guards its own failures (logs them and goes on);
- block the dispatcher on slow work: the claim path and the periodic pass run on the
  dispatcher thread, between two claims. Slow work belongs in a job of its own.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from django.utils.module_loading import import_string

from .claimed import InFlight
from .conf import get_settings
from .context import Lease
from .exceptions import ConfigurationError
from .outcomes import Failure, Outcome
from .store.worker import ClaimedRow, ClaimRequest, Completion, Store
from .worker_config import WorkerConfig

# What runs an attempt: the executor's ``run(ctx, handler, policy)``.
Runner = Callable[..., Outcome]
# What runs an async handler's attempt: the executor's ``arun(ctx, handler, policy)``.
AsyncRunner = Callable[..., Awaitable[Outcome]]
Claimed = tuple[set[int], list[ClaimedRow]]
H = TypeVar("H", bound="WorkerHooks")


class WorkerHooks:
    """A feature's part in one worker process: override the points it needs.

    Each method says which thread calls it. Every default does nothing.
    """

    # -- the worker's start (the thread that calls Worker.run) -------------------------

    def starting(self) -> None:
        """Before the first claim. A database error is the hook's to log: the worker
        starts anyway and reconnects."""

    # -- the claim of a queue (dispatcher thread) ---------------------------------------

    def claim(
        self, store: Store, done: Sequence[Completion] | None, request: ClaimRequest
    ) -> Claimed | None:
        """Claim for `request` instead of the plain claim (with `done`'s completions in
        the same transaction), or None to leave it to the plain claim. At most one
        feature hooks this point."""
        return None

    def resumable(self, queue: str) -> bool:
        """Whether the next claim of `queue` may resume after the last row claimed."""
        return True

    def ready(self) -> set[str]:
        """Queues worth claiming at once (no NOTIFY announces what freed them)."""
        return set()

    def short_claim(self, queue: str, poll_interval: float) -> float | None:
        """Seconds before a claim of `queue` that came back short is worth trying again
        (None: when the core would)."""
        return None

    def settled(self) -> bool:
        """Burst mode: whether the worker may call its queues empty."""
        return True

    # -- outcomes (dispatcher thread) ---------------------------------------------------

    def outcomes_added(self, written: Sequence[tuple[InFlight, Outcome]]) -> None:
        """Handlers finished: their (item, outcome) pairs wait to be written."""

    def write_now(self, queue: str) -> bool:
        """Whether an outcome of `queue` is written at once, not batched."""
        return False

    def claimed(self, items: Sequence[InFlight]) -> None:
        """`items` were claimed and handed to handlers."""

    def released(self, held: Sequence[tuple[int, int, int]]) -> None:
        """Claimed jobs were handed back unstarted: (job_id, lease_version, attempt_id)."""

    def completed(self, done: Sequence[tuple[InFlight, str | None]]) -> None:
        """The completions of `done`, (item, result JSON) each, were written."""

    def failed(self, item: InFlight, failure: Failure, status: str, run_at: Any) -> None:
        """The failure of `item` was written: the job is `status` (pending or dead)."""

    def cancelled(self, item: InFlight) -> None:
        """`item` ended cancelled (an operator asked while it ran)."""

    def snoozed(self, item: InFlight) -> None:
        """`item` snoozed: the job is pending again, its attempt given back."""

    def lease_lost(self, item: InFlight, detected_by: str) -> None:
        """`item`'s lease was found lost, by a "renewal" or a fenced "write"."""

    def executed(self, items: Sequence[InFlight]) -> None:
        """The handlers of `items` returned (their run times are set)."""

    # -- an attempt (handler threads) ---------------------------------------------------

    def run_attempt(self, item: InFlight, run: Runner) -> Outcome:
        """Run `item`'s attempt: call ``run(item.ctx, item.handler, item.policy)``, once,
        and return its outcome (a span around it, say)."""
        return run(item.ctx, item.handler, item.policy)

    async def arun_attempt(self, item: InFlight, run: AsyncRunner) -> Outcome:
        """`run_attempt` for an async handler, on the worker's event loop: await
        ``run(item.ctx, item.handler, item.policy)`` once. Never block the loop here."""
        return await run(item.ctx, item.handler, item.policy)

    # -- the heartbeat (its thread; `renewed` also on the dispatcher's reconnect) -------

    def renewed(self, held: Sequence[Lease]) -> None:
        """A renewal of `held` found some lost (their `lost` is set)."""

    def beat(self, store: Store, running: int) -> None:
        """After each renewal, on the heartbeat's own connection."""

    def stopped(self, store: Store) -> None:
        """The heartbeat stops: the worker is shutting down."""

    # -- a periodic pass (dispatcher thread) --------------------------------------------

    def next_pass(self) -> float:
        """time.monotonic() at which `periodic` is due next."""
        return math.inf

    def periodic(self, now: float) -> None:
        """Do the periodic work that is due (its own statements on the dispatcher's store)."""


# The answers of a point no feature hooks.
_NO_HOOKS = WorkerHooks()


# The columns of queue_jobs a feature may fill at enqueue (both enqueue statements
# write them); the others are the core's, validated before anything is written.
ENQUEUE_COLUMNS = frozenset({"traceparent"})


class Extension:
    """A feature: what it adds to enqueue and to each worker."""

    def enqueue_columns(self) -> Mapping[str, Any]:
        """Columns of ``queue_jobs`` this feature fills at enqueue (the caller's thread),
        among `ENQUEUE_COLUMNS`."""
        return {}

    def worker_hooks(self, config: WorkerConfig, store: Store) -> WorkerHooks | None:
        """This feature's part in a worker; `store` is the dispatcher's connection."""
        return None


def _overrides(obj: object, name: str, base: type) -> bool:
    return getattr(type(obj), name) is not getattr(base, name)


# The points where every feature that hooks them is told, in order, and nothing is
# returned: `Hooks` calls them through one fan-out each.
NOTICES = (
    "starting",
    "outcomes_added",
    "claimed",
    "released",
    "completed",
    "failed",
    "cancelled",
    "snoozed",
    "lease_lost",
    "executed",
    "renewed",
    "beat",
    "stopped",
)


# The points whose answers combine when several features hook them.
ANSWERS: dict[str, Callable[[list[Any]], Any]] = {
    "resumable": all,  # a queue's walk resumes only if every feature lets it
    "ready": lambda answers: set().union(*answers),
    "short_claim": lambda answers: min((a for a in answers if a is not None), default=None),
    "settled": all,
    "next_pass": lambda answers: min(answers, default=math.inf),
}


class Hooks:
    """The hooks of a worker's features, sorted by point once, called by the worker.

    Each notice point (`NOTICES`) and answer point (`ANSWERS`) is an attribute: the
    default of `WorkerHooks` when no feature hooks it, the one feature's method when one
    does, a fan-out (combining the answers) when several do.
    """

    starting: Callable[[], None]
    outcomes_added: Callable[[Sequence[tuple[InFlight, Outcome]]], None]
    claimed: Callable[[Sequence[InFlight]], None]
    released: Callable[[Sequence[tuple[int, int, int]]], None]
    completed: Callable[[Sequence[tuple[InFlight, str | None]]], None]
    failed: Callable[[InFlight, Failure, str, Any], None]
    cancelled: Callable[[InFlight], None]
    snoozed: Callable[[InFlight], None]
    lease_lost: Callable[[InFlight, str], None]
    executed: Callable[[Sequence[InFlight]], None]
    renewed: Callable[[Sequence[Lease]], None]
    beat: Callable[[Store, int], None]
    stopped: Callable[[Store], None]
    resumable: Callable[[str], bool]
    ready: Callable[[], set[str]]
    short_claim: Callable[[str, float], float | None]
    settled: Callable[[], bool]
    next_pass: Callable[[], float]

    def __init__(self, parts: Sequence[WorkerHooks]) -> None:
        self.parts = tuple(parts)
        claims = self._by("claim")
        if len(claims) > 1:
            raise ConfigurationError(
                "Two extensions take over the claim: "
                + ", ".join(type(fn.__self__).__name__ for fn in claims)
            )
        self.claimer = claims[0] if claims else None
        for name in NOTICES:
            setattr(self, name, _fan_out(self._by(name)))
        for name, combine in ANSWERS.items():
            setattr(self, name, _answer(self._by(name), getattr(_NO_HOOKS, name), combine))
        writes = self._by("write_now")
        # None when no feature writes any outcome at once: the writer skips the check.
        self.write_now = (lambda queue: any(fn(queue) for fn in writes)) if writes else None
        self._periodic = [p for p in self.parts if _overrides(p, "periodic", WorkerHooks)]
        # Only a part with a periodic pass says when it is due (a next_pass alone would
        # be due for ever, its pass never run).
        nexts = [p.next_pass for p in self._periodic]
        self.next_pass = _answer(nexts, _NO_HOOKS.next_pass, ANSWERS["next_pass"])
        self.run_attempt = _nest(self._by("run_attempt"))
        self.arun_attempt = _anest(self._by("arun_attempt"))

    def _by(self, name: str) -> list[Any]:
        """The parts' methods for the point `name`, of those that override it."""
        return [getattr(p, name) for p in self.parts if _overrides(p, name, WorkerHooks)]

    def find(self, kind: type[H]) -> H | None:
        """The first part that is a `kind` (the Observer, say), or None."""
        return next((part for part in self.parts if isinstance(part, kind)), None)

    def periodic(self, now: float) -> None:
        """Run the periodic passes that are due at `now`."""
        for part in self._periodic:
            if now >= part.next_pass():
                part.periodic(now)


def _answer(fns: list[Callable[..., Any]], default: Any, combine: Any) -> Callable[..., Any]:
    """One callable for an answer point: the default, the one method, or all combined."""
    if not fns:
        return default  # type: ignore[no-any-return]
    if len(fns) == 1:
        return fns[0]
    return lambda *args: combine([fn(*args) for fn in fns])


def _nothing(*args: Any) -> None:
    """A notice no feature hooks."""


def _fan_out(fns: list[Callable[..., None]]) -> Callable[..., None]:
    """One callable for a notice point: a no-op, the one method, or each in turn."""
    if not fns:
        return _nothing
    if len(fns) == 1:
        return fns[0]

    def each(*args: Any) -> None:
        for fn in fns:
            fn(*args)

    return each


def _run(item: InFlight, run: Runner) -> Outcome:
    return run(item.ctx, item.handler, item.policy)


def _nest(wrappers: list[Callable[[InFlight, Runner], Outcome]]) -> Callable[..., Outcome]:
    """One `run_attempt` out of several: the first listed runs outermost."""
    if not wrappers:
        return _run
    if len(wrappers) == 1:
        return wrappers[0]

    def nested(item: InFlight, run: Runner) -> Outcome:
        for wrapper in reversed(wrappers[1:]):
            run = _bind(wrapper, item, run)
        return wrappers[0](item, run)

    return nested


def _bind(wrapper: Callable[[InFlight, Runner], Outcome], item: InFlight, run: Runner) -> Runner:
    return lambda ctx, handler, policy: wrapper(item, run)


async def _arun(item: InFlight, run: AsyncRunner) -> Outcome:
    return await run(item.ctx, item.handler, item.policy)


def _anest(
    wrappers: list[Callable[[InFlight, AsyncRunner], Awaitable[Outcome]]],
) -> Callable[[InFlight, AsyncRunner], Awaitable[Outcome]]:
    """One `arun_attempt` out of several: the first listed runs outermost."""
    if not wrappers:
        return _arun
    if len(wrappers) == 1:
        return wrappers[0]

    def nested(item: InFlight, run: AsyncRunner) -> Awaitable[Outcome]:
        for wrapper in reversed(wrappers[1:]):
            run = _abind(wrapper, item, run)
        return wrappers[0](item, run)

    return nested


def _abind(
    wrapper: Callable[[InFlight, AsyncRunner], Awaitable[Outcome]], item: InFlight, run: AsyncRunner
) -> AsyncRunner:
    return lambda ctx, handler, policy: wrapper(item, run)


class _Loaded:
    """The extensions of one value of the setting, and those that fill enqueue columns."""

    def __init__(self, paths: tuple[str, ...]) -> None:
        self.paths = paths
        self.extensions = tuple(_load(path) for path in paths)
        self.enqueue = [
            e.enqueue_columns
            for e in self.extensions
            if _overrides(e, "enqueue_columns", Extension)
        ]


_loaded: _Loaded | None = None


def _current() -> _Loaded:
    global _loaded
    paths = get_settings().EXTENSIONS
    if _loaded is None or _loaded.paths is not paths:
        _loaded = _Loaded(paths)
    return _loaded


def installed() -> tuple[Extension, ...]:
    """The extensions PGQUEUE["EXTENSIONS"] names, loaded once per value of the setting."""
    return _current().extensions


def _load(path: str) -> Extension:
    try:
        found = import_string(path)
    except ImportError as exc:
        raise ConfigurationError(
            f"PGQUEUE['EXTENSIONS'] names {path!r}, which cannot be imported: {exc}"
        ) from exc
    extension = found() if isinstance(found, type) else found
    if not isinstance(extension, Extension):
        raise ConfigurationError(
            f"PGQUEUE['EXTENSIONS'] names {path!r}, which is not an Extension "
            "(django_pgqueue.extensions.Extension)."
        )
    return extension


def enqueue_columns() -> dict[str, Any]:
    """The job columns the extensions fill for an enqueue made now."""
    columns: dict[str, Any] = {}
    for fill in _current().enqueue:
        columns.update(fill())
    if not columns.keys() <= ENQUEUE_COLUMNS:
        raise ConfigurationError(
            f"An extension fills {sorted(columns.keys() - ENQUEUE_COLUMNS)} at enqueue; "
            f"the columns it may fill are {sorted(ENQUEUE_COLUMNS)}."
        )
    return columns


def worker_hooks(config: WorkerConfig, store: Store) -> Hooks:
    """The hooks of every installed extension for one worker; a feature that takes over
    claims does so on `store` (the dispatcher's connection)."""
    parts = [extension.worker_hooks(config, store) for extension in installed()]
    hooks = Hooks([part for part in parts if part is not None])
    store.claimer = hooks.claimer
    return hooks
