# Inspecting and controlling live workers: what a worker says of itself at each beat
# (queue_workers.report), the supervisor whose child it is (queue_workers.supervisor),
# and the operators' requests to a worker (queue_worker_requests), taken by its beat.
# The new columns are NULL until written: adding them rewrites no row.

import django.db.models.functions.datetime
from django.db import migrations, models

# Whether a registered worker process is alive now: not marked gone, and seen within
# three of its beats (its report says how often it beats), or two of its leases if
# shorter (a row without a report: two leases). One rule for every statement that
# asks (the Workers page, the metrics, the marking of silent workers, the requests).
WORKER_ALIVE = r"""
CREATE FUNCTION pgqueue_worker_alive(
    p_gone_at timestamptz, p_last_seen_at timestamptz, p_lease float8, p_report jsonb
) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT p_gone_at IS NULL
       AND p_last_seen_at >= now() - make_interval(
           secs => least(2 * p_lease,
                         3 * coalesce((p_report ->> 'beat_seconds')::float8, p_lease)))
$$
"""


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0019_stats_run_time_and_backlog"),
    ]

    operations = [
        migrations.RunSQL(
            WORKER_ALIVE,
            reverse_sql=[
                "DROP FUNCTION pgqueue_worker_alive(timestamptz, timestamptz, float8, jsonb)"
            ],
        ),
        migrations.AlterModelOptions(
            name="workerrecord",
            options={
                "ordering": ["-last_seen_at"],
                "permissions": [("control_worker", "Can stop, drain, resume and resize workers")],
                "verbose_name": "worker",
            },
        ),
        migrations.AddField(
            model_name="workerrecord",
            name="report",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="workerrecord",
            name="supervisor",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.CreateModel(
            name="WorkerRequest",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("worker_id", models.CharField(max_length=255)),
                ("action", models.CharField(max_length=16)),
                ("concurrency", models.IntegerField(blank=True, null=True)),
                ("requested_by", models.CharField(max_length=255)),
                (
                    "requested_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("taken_at", models.DateTimeField(blank=True, null=True)),
                ("answer", models.TextField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "worker request",
                "db_table": "queue_worker_requests",
                "indexes": [
                    models.Index(
                        condition=models.Q(("taken_at__isnull", True)),
                        fields=["worker_id"],
                        name="queue_worker_requests_open_idx",
                    )
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            ("action__in", ["stop", "drain", "resume", "concurrency"])
                        ),
                        name="queue_worker_requests_action_valid",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(("action", "concurrency"), ("concurrency__gte", 1)),
                            models.Q(
                                models.Q(("action", "concurrency"), _negated=True),
                                ("concurrency__isnull", True),
                            ),
                            _connector="OR",
                        ),
                        name="queue_worker_requests_concurrency_valid",
                    ),
                ],
            },
        ),
    ]
