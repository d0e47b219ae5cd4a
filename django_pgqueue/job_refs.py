"""A job named across queue databases: its id and the alias of the database it lives on.

Each queue database numbers its jobs on its own, so an id alone names a job only
together with its database. Every API that takes a job (`wait`, `await_job`, the
operator actions, `parent_results`, `batch_status`, ...) reads the job's database from
what it was given, here, by one rule (`job_reference`):

- a bare id (an int) is a job of PGQUEUE["DATABASE"], or of the API's `using` when the
  caller names one;
- a result id is ``"42"`` (a job of DATABASE) or ``"queues2:42"`` (of that alias): the
  id of a Django Tasks result, and `JobRef`'s ``str()``;
- what ``enqueue()`` returned, a `JobRef` (``WorkflowRun.job(name)``), a handler's
  `JobContext`, a Django ``TaskContext`` or ``TaskResult``, or a row of the job tables
  carries its database: a `using` that names another is refused (the same id there is
  another job).

The idempotency keys of jobs on other databases name them the same way
(``"pgqueue-queues2:42"``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from .conf import get_settings

__all__ = [
    "JobRef",
    "carried_database",
    "job_reference",
    "parse_result_id",
    "resolve_jobs",
    "result_id",
]


@dataclass(frozen=True, slots=True)
class JobRef:
    """A job and the alias of the queue database it lives on.

    ``str()`` gives its result id (``"42"`` on DATABASE, ``"queues2:42"`` elsewhere),
    which every API that takes a job reads back as this job.
    """

    id: int
    database: str

    def __str__(self) -> str:
        return result_id(self.id, self.database, get_settings().DATABASE)


def result_id(job_id: int, database: str, default: str) -> str:
    """A result's id: the job's id, prefixed with its alias (``"queues2:42"``) when the
    job lives on a database other than `default` (PGQUEUE["DATABASE"]), so that
    get_result finds the job there (ids of different databases may be equal)."""
    return str(job_id) if database == default else f"{database}:{job_id}"


def parse_result_id(value: Any, default: str) -> tuple[int, str] | None:
    """(job id, alias) of a result id result_id() made; None if it is not one."""
    database = default
    if isinstance(value, str) and ":" in value:
        database, _, value = value.rpartition(":")
        if not database:
            return None
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, database) if 0 < value < 2**63 else None
    if isinstance(value, str) and value.isascii() and value.isdigit():
        number = int(value)
        return (number, database) if 0 < number < 2**63 else None
    return None


def carried_database(
    carried: str | None, using: str | None, what: str, caller: str, keyword: str = "using"
) -> str:
    """The database of a reference that carries one (`carried`; None: DATABASE).

    `using`, the alias the caller named, must be that one or None: a reference read on
    another database would be another job (or workflow, or batch) under the same id.
    """
    database = carried or get_settings().DATABASE
    if using is not None and using != database:
        raise ValueError(
            f"{caller} was given {what}, which is on database {database!r}, with "
            f"{keyword}={using!r}: the same id there names another. Leave {keyword} out, "
            f"or pass a bare id to read {using!r}'s."
        )
    return database


def job_reference(
    job: Any, using: str | None = None, *, caller: str = "this call", keyword: str = "using"
) -> JobRef:
    """The job `job` names, and its database (see the module's docstring for the rule).

    `using` is the alias the caller named (`keyword` is its name in their call, for the
    messages): the database of a bare id, and for a reference that carries its own, a
    check. TypeError for what names no job; ValueError for a `using` that disagrees.
    """
    conf = get_settings()
    if isinstance(job, int) and not isinstance(job, bool):
        return JobRef(_job_id(job, caller), using or conf.DATABASE)
    if isinstance(job, JobRef):
        return JobRef(job.id, carried_database(job.database, using, f"job {job}", caller, keyword))
    if hasattr(job, "task_result"):  # a Django TaskContext: its result's id names the job
        job = job.task_result.id
    found: tuple[int, str | None] | None = None
    if isinstance(job, str):
        found = parse_result_id(job, conf.DATABASE)
        if found is not None and found[1] not in settings.DATABASES:
            raise ValueError(
                f"{caller} was given the result id {job!r}, whose database {found[1]!r} "
                "is not one of settings.DATABASES."
            )
    elif _job_row(job):  # read on READ_DATABASE: a job of DATABASE
        read = job._state.db
        found = (job.pk, None if read in (None, conf.READ_DATABASE) else read)
    elif hasattr(job, "job_id"):  # a JobContext (database None: DATABASE)
        found = (job.job_id, getattr(job, "database", None))
    elif isinstance(getattr(job, "id", None), str):  # a Django TaskResult
        found = parse_result_id(job.id, conf.DATABASE)
    elif hasattr(job, "id") and hasattr(job, "database"):  # what enqueue() returned
        database = job.database
        if database is None and isinstance(getattr(job, "queue", None), str):
            database = conf.database_for(job.queue)  # an EnqueuedJob made by hand
        found = (job.id, database)
    if found is None:
        raise TypeError(
            f'{caller} takes a job id (a bigint >= 1), a result id ("42", '
            f'"queues2:42"), what enqueue() returned, a JobRef or a job\'s context; '
            f"got {job!r}"
        )
    job_id = _job_id(found[0], caller)
    where = f"job {result_id(job_id, found[1] or conf.DATABASE, conf.DATABASE)}"
    return JobRef(job_id, carried_database(found[1], using, where, caller, keyword))


def resolve_jobs(
    jobs: Iterable[Any], using: str | None = None, *, caller: str, keyword: str = "using"
) -> tuple[str, list[int]]:
    """The one database of `jobs` and their ids, sorted, each once.

    Each job is resolved by `job_reference`; jobs of several databases are refused
    (ValueError): an operation runs in one database's transaction. With no jobs, the
    database is `using` (else DATABASE).
    """
    refs = {job_reference(job, using, caller=caller, keyword=keyword) for job in jobs}
    databases = sorted({ref.database for ref in refs})
    if len(databases) > 1:
        named = ", ".join(repr(database) for database in databases)
        raise ValueError(
            f"{caller} was given jobs of several databases ({named}): it runs in one "
            "database's transaction. Call it once per database."
        )
    database = databases[0] if databases else using or get_settings().DATABASE
    return database, sorted({ref.id for ref in refs})


def _job_row(value: Any) -> bool:
    """Whether `value` is a row of the job tables (Job, DeadJob, JobState): its pk is a job's."""
    meta = getattr(value, "_meta", None)
    return (
        meta is not None
        and meta.app_label == "django_pgqueue"
        and meta.model_name in {"job", "deadjob", "jobstate"}
    )


def _job_id(value: Any, caller: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**63:
        raise TypeError(f"{caller} takes a job id (a bigint >= 1), got {value!r}")
    return value
