# Issue 15: the worker registry (queue_workers) and the per-minute rollup
# (queue_stats_minutely). Both small tables, written by the workers' heartbeats.

import django.db.models.functions.datetime
from django.db import migrations, models

import django_pgqueue.observability.models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0003_schedules"),
    ]

    operations = [
        # Nullable, no default: adding it rewrites nothing, whatever the table size.
        migrations.AddField(
            model_name="job",
            name="traceparent",
            field=models.TextField(blank=True, null=True),
        ),
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
                (
                    "started_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "last_seen_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("gone_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "worker",
                "db_table": "queue_workers",
                "ordering": ["-last_seen_at"],
            },
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
                ("wait_buckets", django_pgqueue.observability.models.IntegerArrayField()),
            ],
            options={
                "verbose_name": "chart",
                "verbose_name_plural": "charts",
                "db_table": "queue_stats_minutely",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("minute", "queue"), name="queue_stats_minutely_key"
                    )
                ],
            },
        ),
    ]
