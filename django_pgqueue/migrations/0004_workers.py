# The worker registry (queue_workers) and the per-minute rollup
# (queue_stats_minutely). Both small tables, written by the workers' heartbeats.

from django.db import migrations, models

import django_pgqueue.models
from django_pgqueue.migrations import _shapes


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0003_schedules")]

    operations = [
        _shapes.add_nullable("job", "traceparent", models.TextField),
        migrations.CreateModel(
            name="WorkerRecord",
            fields=[
                ("id", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("host", models.CharField(max_length=255)),
                ("pid", models.IntegerField()),
                ("queues", models.JSONField()),
                ("concurrency", models.IntegerField()),
                ("lease_seconds", models.FloatField()),
                ("version", models.CharField(max_length=64)),
                ("running", models.IntegerField(db_default=0)),
                ("started_at", _shapes.db_now()),
                ("last_seen_at", _shapes.db_now()),
                ("gone_at", models.DateTimeField(blank=True, null=True)),
            ],
            options=_shapes.table("queue_workers", "worker", ordering=["-last_seen_at"]),
        ),
        migrations.CreateModel(
            name="MinuteStats",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("minute", models.DateTimeField()),
                ("queue", models.CharField(max_length=63)),
                ("completed", models.IntegerField(db_default=0)),
                ("retried", models.IntegerField(db_default=0)),
                ("dead", models.IntegerField(db_default=0)),
                ("wait_seconds_sum", models.FloatField(db_default=0.0)),
                ("wait_buckets", django_pgqueue.models.IntegerArrayField()),
            ],
            options=_shapes.table(
                "queue_stats_minutely",
                "chart",
                verbose_name_plural="charts",
                constraints=[
                    models.UniqueConstraint(
                        fields=("minute", "queue"), name="queue_stats_minutely_key"
                    )
                ],
            ),
        ),
    ]
