"""Operator maintenance passes: prune finished jobs, requeue dead ones.

The built-in schedule (``PGQUEUE["PRUNE"]``, the job type in `django_pgqueue.jobs`)
runs `prune_older_than`; `manage.py prune_queue_jobs` runs `prune`.

Each is a plain function a test or a command calls once. Both work in bounded
batches, each batch its own short statement, so neither holds locks for long or
builds one huge transaction on a table of millions of jobs.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import validators
from .actions import ActionReport, retry_now
from .conf import get_settings
from .models import FINISHED_STATUSES
from .prune_policy import pruning_rounds
from .store import durable as durable_store
from .store import operator as store

DEFAULT_PRUNE_BATCH = 1_000
DEFAULT_REQUEUE_BATCH = 500


@dataclass
class PruneResult:
    cutoff: dt.datetime
    statuses: list[str]
    dry_run: bool
    # By status: deleted, or on a dry run, what would be.
    jobs: dict[str, int] = field(default_factory=dict)
    # Rows deleted by each DELETE, in order (empty on a dry run).
    batches: list[int] = field(default_factory=list)
    # Workflows deleted once their last step was pruned (not counted on a dry run).
    workflows: int = 0
    # Batch rows deleted once their members and callbacks were pruned (idem).
    batches_deleted: int = 0
    # Rows of sequences with nothing left (no job pending, running, held or waiting;
    # not counted on a dry run): an enqueue of the sequence writes its row again.
    sequences: int = 0
    # Events emitted before the cutoff, when completed jobs are pruned (on a dry run,
    # what would be).
    events: int = 0

    @property
    def total(self) -> int:
        return sum(self.jobs.values())


def _delete_all(
    delete: Callable[[str, Any, int, int], tuple[int, int]],
    alias: str,
    cutoff: Any,
    batch_size: int,
) -> int:
    """Run `delete` (a store's DELETE of the next `batch_size` rows created before
    `cutoff`, by id) from the first id on until a batch comes back short: the rows deleted."""
    total, after_id = 0, 0
    while True:
        deleted, after_id = delete(alias, cutoff, batch_size, after_id)
        total += deleted
        if deleted < batch_size:
            return total


def _sequence_rows(alias: str, _cutoff: Any, limit: int, after_id: int) -> tuple[int, int]:
    """`_delete_all`'s step for the rows of sequences with nothing left (no cutoff: an
    enqueue of the sequence writes its row again)."""
    return store.prune_sequence_rows(alias, limit, after_id)


def check_prunable(statuses: Sequence[str]) -> list[str]:
    """Return the statuses, refusing any that is not a finished one."""
    finished = [str(status) for status in FINISHED_STATUSES]
    for status in statuses:
        if status not in finished:
            raise ValueError(
                f"{status!r} is not a finished status; only {', '.join(finished)} jobs "
                "can be pruned (pending and running jobs never are)."
            )
    return list(dict.fromkeys(statuses)) or finished


def prune(
    older_than: dt.timedelta,
    *,
    statuses: Sequence[str] = (),
    batch_size: int = DEFAULT_PRUNE_BATCH,
    dry_run: bool = False,
    alias: str | None = None,
    on_batch: Callable[[int], Any] | None = None,
) -> PruneResult:
    """Delete jobs in `statuses` (default: all finished) that finished before now - older_than."""
    alias = alias or get_settings().DATABASE
    statuses = check_prunable(statuses)
    validators.count(batch_size, "batch_size")
    validators.seconds(older_than.total_seconds(), "older_than", allow_zero=True)
    cutoff = store.clock_ago(alias, older_than.total_seconds())
    result = PruneResult(cutoff=cutoff, statuses=statuses, dry_run=dry_run)
    # An event is finished once emitted: it is kept as long as the completed jobs.
    events = "completed" in statuses
    if dry_run:
        result.jobs = store.count_prunable(alias, cutoff, statuses)
        result.events = durable_store.count_prunable_events(alias, cutoff) if events else 0
        return result
    after_id, more = 0, True
    while more:
        deleted, after_id, more = store.prune_batch(alias, cutoff, statuses, batch_size, after_id)
        count = sum(deleted.values())
        if count:
            result.batches.append(count)
            for status, jobs in deleted.items():
                result.jobs[status] = result.jobs.get(status, 0) + jobs
            if on_batch is not None:
                on_batch(count)
        # The walk ends at the last finished job; a unit left because an operator holds
        # one of its jobs right now (a retry) is found by a later run.
    result.workflows = _delete_all(store.prune_workflow_batch, alias, cutoff, batch_size)
    # After the workflows: a batch's callbacks' workflow is gone by now.
    result.batches_deleted = _delete_all(store.prune_batch_rows, alias, cutoff, batch_size)
    # The rows of sequences with nothing left, whatever their age.
    result.sequences = _delete_all(_sequence_rows, alias, cutoff, batch_size)
    after_key: str | None = ""
    while events and after_key is not None:
        deleted, after_key = durable_store.prune_events(alias, cutoff, batch_size, after_key)
        result.events += deleted
    return result


def prune_older_than(older_than: Mapping[str, float], *, alias: str) -> dict[str, int]:
    """Prune each status in `older_than` once it finished that many seconds ago; return
    the jobs deleted by status, and 'workflows', 'batches', 'sequences' and 'events' for
    those rows.

    The passes go from the shortest age to the longest, each with every status kept no
    longer than its age, so a workflow whose steps ended in several statuses goes whole
    once its longest-kept one is due.
    """
    deleted: dict[str, int] = {}
    for age, statuses in pruning_rounds(older_than):
        result = prune(dt.timedelta(seconds=age), statuses=statuses, alias=alias)
        rows = {
            "workflows": result.workflows,
            "batches": result.batches_deleted,
            "sequences": result.sequences,
        }
        for key, count in (*result.jobs.items(), *rows.items(), ("events", result.events)):
            deleted[key] = deleted.get(key, 0) + count
    return deleted


def requeue_dead(
    *,
    queue: str | None = None,
    type: str | None = None,
    since: dt.datetime | dt.timedelta | None = None,
    batch_size: int = DEFAULT_REQUEUE_BATCH,
    dry_run: bool = False,
    alias: str | None = None,
) -> tuple[int, ActionReport]:
    """Retry now the dead jobs matching the filters; return (jobs matched, report)."""
    alias = alias or get_settings().DATABASE
    validators.count(batch_size, "batch_size")
    if isinstance(since, dt.timedelta):
        seconds = validators.seconds(since.total_seconds(), "since", allow_zero=True)
        since = store.clock_ago(alias, seconds)
    until = store.clock_ago(alias, 0)
    report = ActionReport("Requeue dead")
    matched = 0
    after: tuple[Any, int] | None = None
    while True:
        page = store.dead_job_page(
            alias, until=until, after=after, limit=batch_size, since=since, queue=queue, type=type
        )
        if not page:
            break
        matched += len(page)
        last_id, last_finished = page[-1]
        after = (last_finished, last_id)
        if not dry_run:
            report.merge(retry_now([job_id for job_id, _ in page], alias=alias))
        if len(page) < batch_size:
            break
    return matched, report
