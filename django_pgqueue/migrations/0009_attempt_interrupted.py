# The attempts' CHECK function learns the 'interrupted' status: an attempt that the
# worker's own shutdown stopped (its handler still ran past SHUTDOWN_GRACE). Such an
# attempt is given back to the job, like a snooze, instead of being spent.

import importlib

from django.db import migrations, models

_initial = importlib.import_module("django_pgqueue.migrations.0001_initial")
_queue_control = importlib.import_module("django_pgqueue.migrations.0005_queue_control")
_BEFORE = _queue_control._SNOOZED
_INTERRUPTED = _BEFORE + ", 'interrupted'"


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0008_state_job_by_construction")]

    operations = [
        migrations.AlterField(
            model_name="attempt",
            name="status",
            field=models.CharField(
                choices=[
                    *_initial.ATTEMPT_CHOICES,
                    ("snoozed", "snoozed (attempt given back)"),
                    ("interrupted", "interrupted (the worker stopped; attempt given back)"),
                ],
                db_default="running",
                max_length=16,
            ),
        ),
        migrations.RunSQL(
            sql=[_initial.ATTEMPTS_VALID.format(create="CREATE OR REPLACE", statuses=_INTERRUPTED)],
            reverse_sql=[
                _initial.ATTEMPTS_VALID.format(create="CREATE OR REPLACE", statuses=_BEFORE)
            ],
        ),
    ]
