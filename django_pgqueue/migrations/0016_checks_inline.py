# The job tables' CHECK constraints call PL/pgSQL functions (0001, 0005, 0011) so that a
# broken invariant is refused with a message naming it. A PL/pgSQL call per row written
# is a hot-path cost: 30 of the 130 ms a 20,000-job enqueue_many spends in PostgreSQL,
# and one more call for every claim, heartbeat and completion of a job. Each constraint
# now asks the plain SQL expression of its function's first test (inlined, no function
# call) and calls the function only when that is not true: a valid row costs the
# expression alone; a broken one still gets the function's message. Same names, same
# rules; the functions stay as they are.
#
# The rules now stand twice: in each function's first test and in its constraint. A
# migration that changes a rule replaces both (test_constraints compares them).
#
# Not atomic: each ALTER TABLE swaps a constraint under its own short lock (added NOT
# VALID, no scan), then VALIDATE reads the table under a lock that lets writes through.
# The swap waits for the table's lock at most LOCK_WAIT at a time (a worker's shutdown
# may hold its rows for a lease; writes queued behind a waiting ALTER would stall every
# worker meanwhile), and tries again, up to LOCK_TRIES times.

import time

from django.db import migrations, transaction
from django.db.utils import OperationalError

LOCK_WAIT = "2s"
LOCK_TRIES = 30

JOB_STATUSES = "'waiting', 'pending', 'running', 'completed', 'dead', 'cancelled'"
ATTEMPT_STATUSES = "'running', 'succeeded', 'failed', 'lost', 'released', 'snoozed', 'interrupted'"

# (table, constraint, the function's first test as plain SQL, the function call)
CHECKS = [
    (
        "queue_jobs",
        "queue_jobs_valid",
        "queue::text ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' AND length(queue::text) <= 63"
        " AND type::text ~ '^[A-Za-z_][A-Za-z0-9_.:-]*$' AND length(type::text) <= 255",
        "queue_jobs_valid(queue::text, type::text)",
    ),
    (
        "queue_job_state",
        "queue_job_state_valid",
        f"status::text IN ({JOB_STATUSES})"
        " AND priority BETWEEN -100 AND 100"
        " AND attempts >= 0 AND max_attempts >= 1 AND attempts <= max_attempts"
        " AND lease_version >= 0"
        " AND (status::text = 'running') = (locked_by IS NOT NULL AND locked_until IS NOT NULL)"
        " AND (status::text IN ('completed', 'dead', 'cancelled')) = (finished_at IS NOT NULL)",
        "queue_job_state_valid(status::text, priority, attempts, max_attempts, lease_version, "
        "locked_by::text, locked_until, finished_at)",
    ),
    (
        "queue_attempts",
        "queue_attempts_valid",
        f"status::text IN ({ATTEMPT_STATUSES})"
        " AND attempt_index >= 1 AND lease_version >= 1"
        " AND (status::text = 'running') = (finished_at IS NULL)",
        "queue_attempts_valid(status::text, attempt_index, lease_version, finished_at)",
    ),
]


def swap(schema_editor, table: str, name: str, check: str) -> None:
    alias = schema_editor.connection.alias
    for attempt in range(1, LOCK_TRIES + 1):
        try:
            with transaction.atomic(using=alias), schema_editor.connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
                cursor.execute(
                    f"ALTER TABLE {table} DROP CONSTRAINT {name}, "
                    f"ADD CONSTRAINT {name} CHECK ({check}) NOT VALID"
                )
            break
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != "55P03" or attempt == LOCK_TRIES:
                raise
            time.sleep(1)
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}")


def inline(apps, schema_editor) -> None:
    for table, name, fast, call in CHECKS:
        swap(schema_editor, table, name, f"({fast}) OR {call}")


def functions_only(apps, schema_editor) -> None:
    for table, name, _, call in CHECKS:
        swap(schema_editor, table, name, call)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_pgqueue", "0015_settle_generic_plans"),
    ]

    operations = [migrations.RunPython(inline, functions_only)]
