"""A job named across queue databases: its id, prefixed with its alias when the job
lives on a database other than PGQUEUE["DATABASE"] (``"queues2:42"``), since each
database numbers its jobs on its own. Task result ids are such names; so are the
idempotency keys of jobs on other databases (``"pgqueue-queues2:42"``)."""

from __future__ import annotations

from typing import Any

__all__ = ["job_reference", "parse_result_id", "result_id"]


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


def job_reference(job: Any, default: str) -> tuple[int, str]:
    """(job id, alias) of `job`: a job id (on `default`), a result id, a `JobContext`
    (on its database), or a Django ``TaskContext`` (its result's id names it)."""
    if hasattr(job, "task_result"):
        job = job.task_result.id
    elif hasattr(job, "job_id"):
        return int(job.job_id), getattr(job, "database", None) or default
    found = parse_result_id(job, default)
    if found is None:
        raise ValueError(f"not a job id, a result id or a job's context: {job!r}")
    return found
