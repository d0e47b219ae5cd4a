# A workflow step that started stays run when an operator retries one of its
# dependencies: pgqueue_unsettle puts back to waiting only the dependents that never
# started. It took every pending dependent for one not claimed yet, but a pending step
# may have started: a durable step asleep until its wake-up (its attempt given back,
# pending, its checkpoints kept), or a step waiting for its retry. Such a step was put
# back to waiting for the retried dependency, its lease version raised, as if it had
# never run. A step started when it has an attempt: probed by the attempts'
# (job_id, lease_version) index. The function is the squashed migration's text with
# that condition added.

import importlib

from django.db import migrations

_squashed = importlib.import_module("django_pgqueue.migrations.0001_squashed_0017_claim_function")

OLD_UNSETTLE = _squashed.UNSETTLE.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
OLD_PENDING = "              AND (state.status = 'pending'\n"
NEW_PENDING = (
    "              AND ((state.status = 'pending'\n"
    "                    AND NOT EXISTS (SELECT FROM queue_attempts AS attempt\n"
    "                                    WHERE attempt.job_id = state.job_id))\n"
)
OLD_COMMENT = (
    "            -- (it stays run) or an operator cancelled it (cancelled_by NULL): pending\n"
)
NEW_COMMENT = (
    "            -- (it has an attempt: it stays run, a durable step asleep or parked too)\n"
    "            -- or an operator cancelled it (cancelled_by NULL): pending\n"
)
if OLD_UNSETTLE.count(OLD_PENDING) != 1 or OLD_UNSETTLE.count(OLD_COMMENT) != 1:
    raise RuntimeError("the squashed pgqueue_unsettle is not the text 0025 expects")
NEW_UNSETTLE = OLD_UNSETTLE.replace(OLD_PENDING, NEW_PENDING).replace(OLD_COMMENT, NEW_COMMENT)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0022_many_tenants")]

    operations = [migrations.RunSQL(sql=[NEW_UNSETTLE], reverse_sql=[OLD_UNSETTLE])]
