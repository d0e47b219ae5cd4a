"""Operator actions on jobs: retry now, cancel, and run a durable job again from one of
its steps, with an account of every job skipped.

Both run the statements every other path uses (`store.retry_jobs` runs
``job_retry_now``, `store.cancel_jobs` runs ``job_cancel``); nothing here writes a
state row itself. Those statements decide, row by row and under the row lock, what
changes; this module only reads back why the other rows did not, so an operator is
told "3 changed, 2 skipped: 1 running, 1 not in an allowed state (completed)".
Cancel also accepts running jobs: it marks them cancel-requested
(``job_cancel_request``) without changing their status; the worker hears of it at its
next lease renewal and the fenced write that ends the attempt ends the job cancelled.
Retry never touches a running job. Running again from a step is a retry that also
deletes the checkpoints from that step on (``step_run_again``), in its transaction.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, transaction

from . import signals
from .job_refs import resolve_jobs
from .models import Job, JobState, Status
from .store import durable as durable_store
from .store import operator as store

RETRYABLE = frozenset({Status.DEAD, Status.CANCELLED, Status.PENDING})
CANCELLABLE = frozenset({Status.WAITING, Status.PENDING, Status.RUNNING})

# Why a job was skipped, in the order a report lists them.
RUNNING = "running"
NOT_ALLOWED = "not in an allowed state"
KEY_HELD = "idempotency key held by another live job"
KEY_SHARED = "idempotency key shared with another selected job"
KEY_RACE = "idempotency key taken by a job enqueued meanwhile (nothing changed; try again)"
MISSING = "no longer exists"
NOT_LISTED = "no longer in the list it was selected from"
CHANGED = "changed by someone else meanwhile"
NO_STEP = "no durable step of that name (nothing changed)"
REASONS = (
    RUNNING,
    NOT_ALLOWED,
    KEY_HELD,
    KEY_SHARED,
    KEY_RACE,
    MISSING,
    NOT_LISTED,
    CHANGED,
    NO_STEP,
)


@dataclass
class ActionReport:
    """What an action changed and, for every other job, why it was skipped."""

    action: str
    changed: list[int] = field(default_factory=list)
    skipped: dict[str, list[int]] = field(default_factory=dict)
    # Statuses of the jobs skipped as NOT_ALLOWED, for the message.
    not_allowed: Counter[str] = field(default_factory=Counter)
    # Running jobs among `changed`: cancellation requested, ending when their attempt does.
    requested: list[int] = field(default_factory=list)

    @property
    def skipped_count(self) -> int:
        return sum(len(ids) for ids in self.skipped.values())

    def skip(self, reason: str, job_id: int, status: str | None = None) -> None:
        self.skipped.setdefault(reason, []).append(job_id)
        if reason == NOT_ALLOWED and status is not None:
            self.not_allowed[status] += 1

    def merge(self, other: ActionReport) -> None:
        self.changed.extend(other.changed)
        for reason, ids in other.skipped.items():
            self.skipped.setdefault(reason, []).extend(ids)
        self.not_allowed.update(other.not_allowed)
        self.requested.extend(other.requested)

    def message(self) -> str:
        """One line for an operator: how many changed, how many skipped and why."""
        text = f"{self.action}: {len(self.changed)} changed"
        if self.requested:
            text += f" ({len(self.requested)} running: cancellation requested)"
        text += f", {self.skipped_count} skipped"
        parts = []
        for reason in REASONS:
            ids = self.skipped.get(reason)
            if not ids:
                continue
            part = f"{len(ids)} {reason}"
            if reason == NOT_ALLOWED and self.not_allowed:
                part += (
                    " ("
                    + ", ".join(
                        f"{count} {status}" for status, count in sorted(self.not_allowed.items())
                    )
                    + ")"
                )
            parts.append(part)
        return text + (": " + ", ".join(parts) if parts else "") + "."


def retry_now(job_ids: Iterable[Any], *, alias: str | None = None) -> ActionReport:
    """Make dead, cancelled and pending jobs due now with fresh attempts (job_retry_now).

    `job_ids` are references of jobs of one database, read as `wait()` reads its job:
    bare ids are jobs of PGQUEUE["DATABASE"], or of `alias`.
    """
    alias, ids = resolve_jobs(job_ids, alias, caller="retry_now()", keyword="alias")
    report = ActionReport("Retry now")
    with transaction.atomic(using=alias):
        before = {
            job_id: (queue, key)
            for job_id, queue, key in JobState.objects.using(alias)
            .filter(pk__in=ids, idempotency_key__isnull=False, status__in=RETRYABLE)
            .values_list("pk", "queue", "idempotency_key")
        }
        # Two selected jobs with the same key would both become live in one statement,
        # which the live-key unique index refuses: keep the newest of each key.
        newest: dict[tuple[str, str], int] = {}
        for job_id, key in sorted(before.items()):
            newest[key] = job_id
        shared = {job_id for job_id, key in before.items() if newest[key] != job_id}
        candidates = [job_id for job_id in ids if job_id not in shared]
        for job_id in sorted(shared):
            report.skip(KEY_SHARED, job_id)
        try:
            with transaction.atomic(using=alias):
                changed = store.retry_jobs(alias, candidates) if candidates else set()
        except IntegrityError:
            for job_id in candidates:
                report.skip(KEY_RACE, job_id)
            return report
        report.changed = sorted(changed)
        _explain(report, alias, [i for i in candidates if i not in changed], RETRYABLE, before)
    return report


def run_again_from(job: Any, step: str, *, alias: str | None = None) -> ActionReport:
    """Retry a durable job so that it resumes at its step `step` (step_run_again).

    The job is retried as `retry_now` retries it (dead, cancelled and pending jobs;
    never a running one), and in the same transaction that step's checkpoint, those
    recorded after it and its event wait are deleted, the earlier ones kept. All or
    nothing: a job the retry skips keeps its checkpoints, and a job without that step
    is not retried. `job` is a job reference, read as `retry_now` reads one.
    """
    alias, ids = resolve_jobs([job], alias, caller="run_again_from()", keyword="alias")
    with transaction.atomic(using=alias):
        report = retry_now(ids, alias=alias)
        report.action = f"Run again from {step!r}"
        if report.changed and not durable_store.drop_steps_from(alias, ids[0], step):
            transaction.set_rollback(True, using=alias)  # the retry goes with it
            report.changed = []
            report.skip(NO_STEP, ids[0])
    return report


def cancel(job_ids: Iterable[Any], *, alias: str | None = None) -> ActionReport:
    """Cancel pending and waiting jobs (job_cancel) and ask running ones to stop
    (job_cancel_request).

    Every other job, and a running job already asked, is skipped and accounted for.
    The jobs are read as `retry_now` reads them (one database; a bare id's is
    PGQUEUE["DATABASE"], or `alias`).
    """
    alias, ids = resolve_jobs(job_ids, alias, caller="cancel()", keyword="alias")
    report = ActionReport("Cancel")
    with transaction.atomic(using=alias):
        changed = store.cancel_jobs(alias, ids) if ids else set()
        rest = [job_id for job_id in ids if job_id not in changed]
        requested = store.request_cancel(alias, rest) if rest else set()
        changed |= requested
        report.changed = sorted(changed)
        report.requested = sorted(requested)
        # Running jobs only asked to stop are announced by the worker that ends them.
        _announce_cancelled(alias, sorted(changed - requested))
        _explain(report, alias, [i for i in ids if i not in changed], CANCELLABLE, {})
    return report


def _explain(
    report: ActionReport,
    alias: str,
    unchanged: list[int],
    allowed: frozenset[str],
    keyed: dict[int, tuple[str, str]],
) -> None:
    """Record why each unchanged job was skipped, from its status after the statement."""
    if not unchanged:
        return
    statuses = dict(
        JobState.objects.using(alias).filter(pk__in=unchanged).values_list("pk", "status")
    )
    for job_id in unchanged:
        status = statuses.get(job_id)
        if status is None:
            report.skip(MISSING, job_id)
        elif status == Status.RUNNING:
            report.skip(RUNNING, job_id)
        elif status not in allowed:
            report.skip(NOT_ALLOWED, job_id, status)
        elif job_id in keyed:
            report.skip(KEY_HELD, job_id)
        else:
            report.skip(CHANGED, job_id)


def _announce_cancelled(alias: str, job_ids: list[int]) -> None:
    """Send job_cancelled for each cancelled job when the cancelling transaction commits."""
    if not signals.job_cancelled.receivers or not job_ids:
        return
    jobs = Job.objects.using(alias).filter(pk__in=job_ids).values_list("pk", "queue", "type")
    events = [{"job_id": pk, "queue": queue, "type": type_} for pk, queue, type_ in jobs]
    signals.send_on_commit(signals.job_cancelled, alias, events)
