# pgqueue_claim opens the attempts of the jobs it is given in the order it is given
# them, and returns the rows in that order: the order of the claim's walk (the fair
# claim's turns, the plain claim's priority and due time). It opened them in the order
# its UPDATE met them (by job id, through the primary key), so a claim's attempts were
# numbered by job id: an older tenant's jobs taken in the same claim as a late tenant's
# counted as started before it, whatever their turns.
#
# The function is the squashed migration's text with that order (and sorts on).

import importlib

from django.db import migrations

_squashed = importlib.import_module("django_pgqueue.migrations.0001_squashed_0022_many_tenants")

OLD_CLAIM = _squashed.CLAIM.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
OLD_OPEN = (
    "        SELECT claimed.job_id, claimed.lease_version, claimed.attempts, p_worker_id,\n"
    "               'running', coalesce(p_started_at, clock_timestamp())\n"
    "        FROM claimed\n"
    "        RETURNING queue_attempts.id, queue_attempts.job_id\n"
)
NEW_OPEN = (
    "        SELECT claimed.job_id, claimed.lease_version, claimed.attempts, p_worker_id,\n"
    "               'running', coalesce(p_started_at, clock_timestamp())\n"
    "        FROM claimed\n"
    "        -- in the order given: the attempts' ids number the jobs as the walk took them\n"
    "        ORDER BY array_position(p_job_ids, claimed.job_id)\n"
    "        RETURNING queue_attempts.id, queue_attempts.job_id\n"
)
OLD_END = "        LIMIT 1\n    ) AS job;\nEND\n"
NEW_END = "        LIMIT 1\n    ) AS job\n    ORDER BY opened.id;\nEND\n"
# Sorts on: the plain claim's transaction turns them off (claim_plan_generic), and the
# two sorts of a few rows, priced as disabled, put the plan above jit_above_cost:
# compiling it took ~250 ms a claim.
OLD_SET = "SET plan_cache_mode = force_generic_plan\n"
NEW_SET = "SET plan_cache_mode = force_generic_plan\nSET enable_sort = on\n"
if OLD_CLAIM.count(OLD_OPEN) != 1 or OLD_CLAIM.count(OLD_END) != 1 or OLD_CLAIM.count(OLD_SET) != 1:
    raise RuntimeError("pgqueue_claim is not the text this migration changes")
NEW_CLAIM = (
    OLD_CLAIM.replace(OLD_OPEN, NEW_OPEN).replace(OLD_END, NEW_END).replace(OLD_SET, NEW_SET)
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0027_cancel_in_progress")]

    operations = [migrations.RunSQL(sql=NEW_CLAIM, reverse_sql=OLD_CLAIM)]
