# The settle step wakes the wait() callers of the steps it cancels: a step cancelled
# because a job it waits for ended dead or cancelled (level after level of a cascade)
# is finished like any other, and its waiters hear the same NOTIFY the statements that
# end a job send (pgqueue_finished, carrying the queue name), instead of finding out
# only at their next look. pgqueue_settle is the text of 0011 with one more CTE.

import importlib

from django.db import migrations

_workflows = importlib.import_module("django_pgqueue.migrations.0011_workflows")

OLD_SETTLE = _workflows.SETTLE_FUNCTION.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
WAKE = """        ), wake AS (
            SELECT count(pg_notify('pgqueue', due.queue)::text) AS queues
            FROM (SELECT DISTINCT queue FROM moved WHERE status = 'pending') AS due
        )
"""
WOKEN = """        ), woken AS (
            -- Wake the wait() callers of the steps cancelled (see job_waiter_add).
            SELECT count(pg_notify('pgqueue_finished', w.queue)) AS waiters
            FROM queue_job_waiters AS w
            WHERE w.job_id IN (SELECT job_id FROM moved WHERE status = 'cancelled')
        )
"""
OLD_FROM = "        FROM wake\n        LEFT JOIN moved ON true\n"
NEW_FROM = "        FROM wake\n        CROSS JOIN woken\n        LEFT JOIN moved ON true\n"
if OLD_SETTLE.count(WAKE) != 1 or OLD_SETTLE.count(OLD_FROM) != 1:
    raise RuntimeError("0011_workflows's pgqueue_settle is not the text 0014 expects")
NEW_SETTLE = OLD_SETTLE.replace(WAKE, WAKE[: -len("        )\n")] + WOKEN).replace(
    OLD_FROM, NEW_FROM
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0013_batches")]

    operations = [migrations.RunSQL(sql=[NEW_SETTLE], reverse_sql=[OLD_SETTLE])]
