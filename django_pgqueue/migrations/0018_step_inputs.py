# What a step receives from the steps it waits for, and when it is due after them:
#
# - queue_workflow_steps.collects: the step takes its parents' results as one list,
#   whatever their number (a chord's callback, a step after a group: Celery hands
#   such a step a list, [] for an empty group). Off, one parent's result is handed
#   as it is.
# - queue_workflow_steps.delay: the seconds a step waits after its last dependency
#   finished, as Celery counts a chained task's countdown from its parent's end.
#   pgqueue_settle makes the step due at now() + delay when it makes it pending
#   (before, a step's delay counted from the workflow's enqueue, and a step whose
#   parents ran longer than its delay was due at once). The settle is the squashed
#   migration's text, with the step's delay read in `counted` and added in `moved`.

import importlib

from django.db import migrations, models

_squashed = importlib.import_module("django_pgqueue.migrations.0001_squashed_0017_claim_function")

OLD_SETTLE = _squashed.SETTLE.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
OLD_COUNTED = "                hits.culprit\n        ), moved AS ("
NEW_COUNTED = "                hits.culprit,\n                step.delay\n        ), moved AS ("
OLD_DUE = "THEN greatest(state.run_at, now()) ELSE state.run_at END,"
NEW_DUE = (
    "THEN greatest(state.run_at, now() + make_interval(secs => counted.delay))\n"
    "                              ELSE state.run_at END,"
)
if OLD_SETTLE.count(OLD_COUNTED) != 1 or OLD_SETTLE.count(OLD_DUE) != 1:
    raise RuntimeError("the squashed pgqueue_settle is not the text 0018 expects")
NEW_SETTLE = OLD_SETTLE.replace(OLD_COUNTED, NEW_COUNTED).replace(OLD_DUE, NEW_DUE)
GENERIC = (
    "ALTER FUNCTION pgqueue_settle(bigint[], bigint[]) SET plan_cache_mode = force_generic_plan"
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0017_claim_function")]

    operations = [
        migrations.AddField(
            model_name="workflowstep",
            name="collects",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name="workflowstep",
            name="delay",
            field=models.FloatField(db_default=0.0, default=0.0),
        ),
        # The old function reads no delay: it can stay while the columns come and go.
        migrations.RunSQL(sql=[NEW_SETTLE, GENERIC], reverse_sql=[OLD_SETTLE, GENERIC]),
    ]
