# The per-minute rollup also keeps how long the finished attempts ran (a sum and a
# histogram, as for their waits) and a sample of each queue's backlog (jobs due and not
# started), for the admin's run-time and backlog charts. Nullable or with a constant
# default: adding them rewrites nothing.

from django.db import migrations, models

import django_pgqueue.models


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0018_step_inputs")]

    operations = [
        migrations.AddField(
            model_name="minutestats",
            name="run_seconds_sum",
            field=models.FloatField(db_default=0.0),
        ),
        migrations.AddField(
            model_name="minutestats",
            name="run_buckets",
            field=django_pgqueue.models.IntegerArrayField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="minutestats",
            name="backlog",
            field=models.IntegerField(blank=True, null=True),
        ),
    ]
