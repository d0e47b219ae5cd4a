"""Exceptions raised by django_pgqueue, and the ones handlers raise to steer their job."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from . import validators
from .validators import clamp_seconds


class PgQueueError(Exception):
    """Root of every error django_pgqueue raises."""


class ConfigurationError(PgQueueError, ImproperlyConfigured):
    """The PGQUEUE setting or a handler registration is invalid."""


class EnqueueError(PgQueueError, ValueError):
    """An argument of enqueue() is invalid; nothing was written."""


class PayloadError(PgQueueError, TypeError):
    """A payload cannot be stored as JSON; nothing was written.

    `path` names the offending value, e.g. ``payload['items'][2]``.
    """

    def __init__(self, message: str, path: str = "payload") -> None:
        super().__init__(message)
        self.path = path


class UniqueConflict(PgQueueError):
    """enqueue() with ``Unique(..., on_conflict="refuse")`` found its key held.

    Nothing was written; `job_id` is the job that holds `key` on `queue`.
    """

    def __init__(self, queue: str, key: str, job_id: int) -> None:
        super().__init__(
            f"The unique key {key!r} on queue {queue!r} is held by job #{job_id}: "
            "nothing was enqueued."
        )
        self.queue = queue
        self.key = key
        self.job_id = job_id


class UnknownJobType(PgQueueError, LookupError):
    """No handler is registered for a job's type."""


class DatabaseUnavailable(PgQueueError):
    """The worker lost its database connection; it reconnects with backoff."""


# Control flow a handler raises to steer its job. They are exceptions, like
# Django's Http404, so a handler can raise them from any depth.


class PermanentFailure(PgQueueError):
    """Raise from a handler to fail the job now, without retrying: it goes to dead."""


class RetryLater(PgQueueError):
    """Raise from a handler to retry the job after `delay` seconds.

    The attempt counts against max_attempts; when none are left the job is dead.
    A delay longer than 10 years (`validators.MAX_SECONDS`; infinity included) is
    shortened to 10 years with a warning in the log, so the job still gets its retry
    written. A delay that is not a number, is negative or is NaN raises ValueError
    here: raised from a handler, that is an ordinary failure of the attempt (retried
    by the retry policy), its message saying what was wrong.
    """

    def __init__(self, delay: float, reason: str = "") -> None:
        if not isinstance(delay, int | float) or isinstance(delay, bool) or not delay >= 0:
            raise ValueError(f"RetryLater delay must be a number of seconds >= 0, got {delay!r}")
        delay = clamp_seconds(delay, "RetryLater delay")
        super().__init__(reason or f"retry requested in {delay:g}s")
        self.delay = delay
        self.reason = reason


class JobTimeout(PgQueueError):
    """A handler ran past its timeout; the attempt is failed and the job retried."""


class SoftTimeLimitExceeded(PgQueueError):
    """Raised in a sync handler that runs past its soft time limit (Celery's name).

    Its ``except`` and ``finally`` blocks run; what the handler does then is its
    outcome: a handler that lets it propagate fails its attempt (retried by its
    policy), one that returns completes its job.
    """


class TimeLimitExceeded(PgQueueError):
    """Recorded when a handler ran past its hard time limit and the worker process
    running it was ended: the attempt is failed and the job retried by its policy."""


# Failures the queue records itself, not raised by handlers. They are classes so that
# the error class stored with an attempt ("django_pgqueue.LeaseExpired") imports, as
# Django's TaskError.exception_class expects of it.


class ResultNotStorable(PgQueueError):
    """Recorded when a handler's return value cannot be stored as JSON: the job is dead."""


class WorkerShutdown(PgQueueError):
    """Recorded when a worker stopped before the handler finished: the job is due again at
    once, its attempt given back."""


class LeaseExpired(PgQueueError):
    """Recorded when a job's lease ran out before its worker finished: the job is requeued."""


class Snooze(PgQueueError):
    """Raise (or return) from a handler to run the job again after `seconds`.

    The job goes back to pending at now() + seconds without spending an attempt; the
    attempt is recorded as snoozed. `seconds` must be finite, > 0 and at most
    `validators.MAX_SECONDS` (10 years), the bound of every other duration.
    """

    def __init__(self, seconds: float, reason: str = "") -> None:
        value = validators.seconds(seconds, "Snooze(seconds)")
        super().__init__(reason or f"snoozed for {value:g}s")
        self.seconds = value
        self.reason = reason


class AwaitEvent(PgQueueError):
    """Raised by `JobContext.wait_for_event` when the event has not come yet: the worker
    parks the job until it is emitted or the wait times out, then runs the handler
    again. Let it propagate: a handler that catches it goes on without the event."""

    def __init__(self, key: str, name: str, timeout: float | None) -> None:
        after = "" if timeout is None else f" (at most {timeout:g}s)"
        super().__init__(f"waiting for the event {key!r}{after}")
        self.key = key
        self.name = name
        self.timeout = timeout


class EventTimeout(PgQueueError, TimeoutError):
    """`JobContext.wait_for_event` timed out: the event did not come in time."""

    def __init__(self, key: str, name: str) -> None:
        super().__init__(f"the event {key!r} did not come before the wait {name!r} timed out")
        self.key = key
        self.name = name


class StepNotRecorded(PgQueueError):
    """A step's checkpoint was not recorded: the job's lease was lost (another worker
    may own the job now). An atomic step's writes were rolled back with it."""


# What wait() and await_job() raise when a job did not end with a result.


class JobNotFound(PgQueueError, LookupError):
    """wait() was given a job id no job has (or not yet, to another connection)."""

    def __init__(self, job_id: int) -> None:
        super().__init__(
            f"no job #{job_id}: it was never enqueued, was pruned, or was enqueued in a "
            "transaction that has not committed yet (wait() reads on its own connection; "
            "commit the enqueue before waiting)"
        )
        self.job_id = job_id


class BatchNotFound(PgQueueError, LookupError):
    """batch_status() was given a batch id no batch has, or a job that is in no batch."""


class WaitTimeout(PgQueueError, TimeoutError):
    """The job did not finish within wait()'s timeout; it is left as it was."""

    def __init__(self, job_id: int, timeout: float, status: str) -> None:
        super().__init__(f"job #{job_id} did not finish within {timeout:g}s (it is {status})")
        self.job_id = job_id
        self.timeout = timeout
        self.status = status


class JobFailed(PgQueueError):
    """The job ended without a result: dead (`JobDead`) or cancelled (`JobCancelled`)."""

    def __init__(self, message: str, job_id: int) -> None:
        super().__init__(message)
        self.job_id = job_id


class JobDead(JobFailed):
    """The job is dead: a permanent failure, or its attempts are spent.

    `last_error` is the job's last error as the admin shows it, `error_class` the class
    its last failed attempt recorded (None if no attempt recorded one).
    """

    def __init__(self, job_id: int, last_error: str | None, error_class: str | None) -> None:
        super().__init__(f"job #{job_id} is dead: {last_error or 'no error recorded'}", job_id)
        self.last_error = last_error
        self.error_class = error_class


class JobCancelled(JobFailed):
    """The job was cancelled by an operator (before it ran, or while it ran)."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"job #{job_id} was cancelled", job_id)


class WorkflowFailed(JobFailed):
    """A workflow ended without its result: one of its steps failed.

    `step` and `job_id` name the step that failed by itself (dead, or cancelled by an
    operator), `status` says which, and `last_error` is its last error, as the admin
    shows it; `workflow_id` is the workflow's. The steps that waited for it were
    cancelled because of it.
    """

    def __init__(
        self,
        workflow: str,
        workflow_id: int,
        step: str,
        job_id: int,
        status: str,
        last_error: str | None,
    ) -> None:
        how = "was cancelled" if status == "cancelled" else "is dead"
        why = f": {last_error}" if last_error else ""
        super().__init__(
            f"workflow {workflow!r} #{workflow_id} failed: its step {step!r} (job #{job_id}) "
            f"{how}{why}",
            job_id,
        )
        self.workflow_id = workflow_id
        self.step = step
        self.status = status
        self.last_error = last_error
