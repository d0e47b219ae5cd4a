# A workflow step that started stays run when its dependencies are counted again.
# A step started when its current lease was claimed: it has an attempt under its
# lease_version (probed by the attempts' (job_id, lease_version) index). An operator's
# retry and pgqueue_unsettle raise a step's lease version, so a step they reset has
# not started.
#
# - pgqueue_unsettle (an operator retries a dependency) put every pending dependent
#   back to waiting, taking it for one not claimed yet; a pending step may have
#   started: a durable step asleep until its wake-up (its attempt given back, its
#   checkpoints kept), or a step waiting for its retry. It now stays run.
# - pgqueue_settle (a dependency ends) moved every waiting dependent whose count
#   reached zero; a waiting step may have started: a durable step parked for an event
#   (counted again by a retry of its dependency). It was woken (or cancelled) as if its
#   dependencies had just let it start; it now stays parked until its event or timeout.
#
# The functions are the squashed migration's and 0023's texts with that condition.

import importlib

from django.db import migrations

_squashed = importlib.import_module("django_pgqueue.migrations.0001_squashed_0022_many_tenants")
# pgqueue_settle as 0023 left it (it moves sequences on).
_sequences = importlib.import_module("django_pgqueue.migrations.0023_sequences")

NOT_STARTED = (
    "NOT EXISTS (SELECT FROM queue_attempts AS attempt\n"
    "                                    WHERE attempt.job_id = state.job_id\n"
    "                                      AND attempt.lease_version = state.lease_version)"
)

OLD_UNSETTLE = _squashed.UNSETTLE.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
OLD_PENDING = "              AND (state.status = 'pending'\n"
NEW_PENDING = (
    f"              AND ((state.status = 'pending'\n                    AND {NOT_STARTED})\n"
)
OLD_COMMENT = (
    "            -- (it stays run) or an operator cancelled it (cancelled_by NULL): pending\n"
)
NEW_COMMENT = (
    "            -- (a claim under its lease: it stays run, a durable step asleep too)\n"
    "            -- or an operator cancelled it (cancelled_by NULL): pending\n"
)

OLD_SETTLE = _sequences.NEW_SETTLE
OLD_WAITING = (
    "              AND state.status = 'waiting'\n"
    "            RETURNING state.job_id, state.queue, state.status\n"
)
NEW_WAITING = (
    "              AND state.status = 'waiting'\n"
    "              -- a durable step parked for an event started: it waits for its event\n"
    f"              AND {NOT_STARTED}\n"
    "            RETURNING state.job_id, state.queue, state.status\n"
)
if (
    OLD_UNSETTLE.count(OLD_PENDING) != 1
    or OLD_UNSETTLE.count(OLD_COMMENT) != 1
    or OLD_SETTLE.count(OLD_WAITING) != 1
):
    raise RuntimeError("pgqueue_unsettle or pgqueue_settle is not the text 0025 expects")
NEW_UNSETTLE = OLD_UNSETTLE.replace(OLD_PENDING, NEW_PENDING).replace(OLD_COMMENT, NEW_COMMENT)
NEW_SETTLE = OLD_SETTLE.replace(OLD_WAITING, NEW_WAITING)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0023_sequences")]

    operations = [
        migrations.RunSQL(
            sql=[NEW_UNSETTLE, NEW_SETTLE, _sequences.GENERIC],
            reverse_sql=[OLD_UNSETTLE, OLD_SETTLE, _sequences.GENERIC],
        )
    ]
