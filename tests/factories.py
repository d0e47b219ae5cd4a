"""Fixtures of the admin and operations tests: jobs fabricated in any state, and users.

`make_job` enqueues through the real enqueue() and then moves the state row to the
wanted status with plain SQL that keeps every CHECK constraint, so a test can set up a
running job with an unexpired lease or a job that died two weeks ago in one call.
"""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command

from django_pgqueue import enqueue
from tests.conftest import sql

VIEWER_PERMISSIONS = ("view_job", "view_deadjob")
OPERATOR_PERMISSIONS = (*VIEWER_PERMISSIONS, "operate_job")


def make_job(
    status: str = "pending",
    *,
    queue: str = "ops",
    type: str = "qa.noop",
    payload: Any = None,
    key: str | None = None,
    finished_ago: str = "1 hour",
    error: str = "ValueError: boom",
    attempts: int | None = None,
    max_attempts: int = 3,
) -> int:
    """Create a job and put it in `status`; return its id."""
    job = enqueue(
        type,
        {"n": 1} if payload is None else payload,
        queue=queue,
        idempotency_key=key,
        max_attempts=max_attempts,
    )
    job_id = job.id
    if status == "pending":
        if attempts:
            sql(
                "UPDATE queue_job_state SET attempts = %s, lease_version = %s, last_error = %s "
                "WHERE job_id = %s",
                [attempts, attempts, error, job_id],
            )
            _attempts(job_id, attempts, "failed", error)
        return job_id
    if status == "running":
        sql(
            "UPDATE queue_job_state SET status = 'running', attempts = 1, lease_version = 1, "
            "locked_by = 'worker-a', locked_until = now() + interval '5 minutes' "
            "WHERE job_id = %s",
            [job_id],
        )
        sql(
            "INSERT INTO queue_attempts (job_id, lease_version, attempt_index, worker_id) "
            "VALUES (%s, 1, 1, 'worker-a')",
            [job_id],
        )
        return job_id
    done = attempts if attempts is not None else (max_attempts if status == "dead" else 1)
    if status == "cancelled":
        done = attempts or 0
    sql(
        "UPDATE queue_job_state SET status = %s, attempts = %s, lease_version = %s, "
        "finished_at = now() - %s::interval, last_error = %s WHERE job_id = %s",
        [status, done, done, finished_ago, error if status == "dead" else None, job_id],
    )
    outcome = {"completed": "succeeded", "dead": "failed"}.get(status, "failed")
    _attempts(job_id, done, outcome, error)
    return job_id


def _attempts(job_id: int, count: int, last_status: str, error: str) -> None:
    for index in range(1, count + 1):
        final = index == count
        status = last_status if final else "failed"
        failed = status == "failed"
        sql(
            "INSERT INTO queue_attempts (job_id, lease_version, attempt_index, worker_id, status, "
            "started_at, finished_at, error_class, error_message, traceback) "
            "VALUES (%s, %s, %s, 'worker-a', %s, now() - interval '2 hours', "
            "now() - interval '2 hours' + interval '1.5 seconds', %s, %s, %s)",
            [
                job_id,
                index,
                index,
                status,
                "ValueError" if failed else None,
                error.partition(": ")[2] if failed else None,
                f"Traceback (most recent call last):\n  attempt {index}\n{error}"
                if failed
                else None,
            ],
        )


def state(job_id: int) -> dict[str, Any]:
    """The job's state row as a dict (None values included)."""
    rows = sql(
        "SELECT status, attempts, max_attempts, lease_version, run_at <= now() AS due, "
        "finished_at, locked_by, last_error FROM queue_job_state WHERE job_id = %s",
        [job_id],
    )
    if not rows:
        return {}
    keys = ("status", "attempts", "max_attempts", "lease_version", "due", "finished_at")
    keys += ("locked_by", "last_error")
    return dict(zip(keys, rows[0], strict=True))


def make_user(username: str, *codenames: str, password: str | None = None) -> User:
    """A staff user with these django_pgqueue permissions (no password: force_login)."""
    user = User.objects.create_user(username, password=password, is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_pgqueue", codename__in=codenames)
    )
    return user


@pytest.fixture
def operator(db: None) -> User:
    """A staff user who may view jobs and dead jobs, and retry and cancel them."""
    return make_user("operator", *OPERATOR_PERMISSIONS)


@pytest.fixture
def viewer(db: None) -> User:
    """A staff user who may only look."""
    return make_user("viewer", *VIEWER_PERMISSIONS)


@pytest.fixture
def operator_client(client: Any, operator: User) -> Any:
    client.force_login(operator)
    return client


@pytest.fixture
def viewer_client(client: Any, viewer: User) -> Any:
    client.force_login(viewer)
    return client


@pytest.fixture
def superuser_client(client: Any, db: None) -> Any:
    """A logged-in superuser (pytest-django's admin_client hashes a password: slow)."""
    client.force_login(User.objects.create_superuser("root", password=None))
    return client


def run_command(*args: str) -> str:
    """Run a management command in-process; what it wrote to stdout."""
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def job_exists(job_id: int) -> bool:
    """Tell whether the job's row is still in queue_jobs (not pruned)."""
    return bool(sql("SELECT 1 FROM queue_jobs WHERE id = %s", [job_id]))
