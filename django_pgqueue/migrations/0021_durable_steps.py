# Durable execution inside a handler: its checkpoints (queue_job_steps), the events it
# waits for (queue_events) and the jobs parked until one comes (queue_event_waits).
#
# A park and an emit of one event key are decided under a transaction-level advisory
# lock on the key, each by a PL/pgSQL function whose statements run with snapshots of
# their own taken after the lock: whichever comes second sees what the first
# committed, so an event emitted while a job parks is never missed by both (in one
# statement, the snapshot is taken before the lock is granted). A transaction lock,
# not a session one: nothing a connection pooler could strand.

from django.db import migrations, models
from django.db.models.functions import Now

# The advisory lock's first key: the event keys' name space (two-key form, so a
# project's own one-key advisory locks never collide with these).
PARK = r"""
CREATE FUNCTION pgqueue_park(
    p_job_id bigint, p_lease_version bigint, p_attempt_id bigint, p_key text,
    p_name text, p_timeout float8, p_reason text
) RETURNS TABLE (status text, run_at timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_payload jsonb;
    v_emitted boolean;
    v_status text;
    v_run_at timestamptz;
    v_queue text;
    v_has_dependents boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(1886418805, hashtext(p_key));
    SELECT event.payload INTO v_payload FROM queue_events AS event WHERE event.key = p_key;
    v_emitted := FOUND;
    -- Fenced like every end of an attempt; the attempt is given back (a park is no
    -- failure). Parked, the job is waiting: in no claim index until an emit or its
    -- timeout makes it pending; an event already emitted makes it pending at once.
    UPDATE queue_job_state AS state
    SET status = CASE
            WHEN state.cancel_requested_at IS NOT NULL THEN 'cancelled'
            WHEN v_emitted THEN 'pending'
            ELSE 'waiting'
        END,
        run_at = CASE
            WHEN state.cancel_requested_at IS NULL AND v_emitted THEN now() ELSE state.run_at
        END,
        attempts = CASE
            WHEN state.cancel_requested_at IS NULL THEN state.attempts - 1 ELSE state.attempts
        END,
        finished_at = CASE WHEN state.cancel_requested_at IS NOT NULL THEN now() END,
        locked_by = NULL,
        locked_until = NULL,
        updated_at = now()
    WHERE state.job_id = p_job_id
      AND state.lease_version = p_lease_version
      AND state.status = 'running'
    RETURNING state.status, state.run_at, state.queue, state.has_dependents
    INTO v_status, v_run_at, v_queue, v_has_dependents;
    IF NOT FOUND THEN
        RETURN;  -- the lease was lost
    END IF;
    UPDATE queue_attempts AS attempt
    SET status = 'snoozed', finished_at = now(),
        error_class = 'django_pgqueue.AwaitEvent', error_message = p_reason
    WHERE attempt.id = p_attempt_id;
    IF v_status = 'cancelled' THEN
        PERFORM pg_notify('pgqueue_finished', waiter.queue)
        FROM queue_job_waiters AS waiter WHERE waiter.job_id = p_job_id;
        IF v_has_dependents THEN
            PERFORM pgqueue_settle('{}', ARRAY[p_job_id]);
        END IF;
    ELSIF v_emitted THEN
        INSERT INTO queue_job_steps (job_id, name, kind, result, lease_version)
        VALUES (p_job_id, p_name, 'event', jsonb_build_object('payload', v_payload),
                p_lease_version)
        ON CONFLICT DO NOTHING;
        PERFORM pg_notify('pgqueue', v_queue);
    ELSE
        INSERT INTO queue_event_waits (job_id, key, name, timeout_at)
        VALUES (p_job_id, p_key, p_name, now() + make_interval(secs => p_timeout))
        ON CONFLICT (job_id) DO UPDATE
        SET key = EXCLUDED.key, name = EXCLUDED.name, timeout_at = EXCLUDED.timeout_at,
            created_at = now();
    END IF;
    status := v_status;
    run_at := v_run_at;
    RETURN NEXT;
END
$$
"""

EMIT = r"""
CREATE FUNCTION pgqueue_emit(p_key text, p_payload jsonb)
RETURNS TABLE (emitted boolean, delivered integer)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pg_advisory_xact_lock(1886418805, hashtext(p_key));
    INSERT INTO queue_events (key, payload) VALUES (p_key, p_payload)
    ON CONFLICT (key) DO NOTHING;
    IF NOT FOUND THEN
        emitted := false;  -- the first emit of a key wins
        delivered := 0;
        RETURN NEXT;
        RETURN;
    END IF;
    -- Each wait's row is taken once: by this delete or by the timeout's (whichever
    -- deletes it records the wait's checkpoint and wakes the job).
    WITH taken AS (
        DELETE FROM queue_event_waits AS wait
        WHERE wait.key = p_key
        RETURNING wait.job_id, wait.name
    ), recorded AS (
        INSERT INTO queue_job_steps (job_id, name, kind, result)
        SELECT taken.job_id, taken.name, 'event', jsonb_build_object('payload', p_payload)
        FROM taken
        ON CONFLICT DO NOTHING
    ), woken AS (
        UPDATE queue_job_state AS state
        SET status = 'pending', run_at = now(), updated_at = now()
        WHERE state.job_id IN (SELECT taken.job_id FROM taken)
          AND state.status = 'waiting'
        RETURNING state.queue
    ), notified AS (
        SELECT count(pg_notify('pgqueue', queues.queue)) AS queues
        FROM (SELECT DISTINCT woken.queue FROM woken) AS queues
    )
    SELECT (SELECT count(*) FROM taken)::integer INTO delivered FROM notified;
    emitted := true;
    RETURN NEXT;
END
$$
"""

FOREIGN_KEYS = [
    "ALTER TABLE queue_job_steps ADD CONSTRAINT queue_job_steps_job_fk "
    "FOREIGN KEY (job_id) REFERENCES queue_jobs (id) ON DELETE CASCADE",
    "ALTER TABLE queue_event_waits ADD CONSTRAINT queue_event_waits_job_fk "
    "FOREIGN KEY (job_id) REFERENCES queue_jobs (id) ON DELETE CASCADE",
]


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0020_workers_inspect_control")]

    operations = [
        migrations.CreateModel(
            name="Event",
            fields=[
                ("key", models.TextField(primary_key=True, serialize=False)),
                ("payload", models.JSONField(null=True)),
                ("emitted_at", models.DateTimeField(db_default=Now())),
            ],
            options={
                "verbose_name": "event",
                "db_table": "queue_events",
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("key__regex", "^.{1,200}$")),
                        name="queue_events_valid",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="EventWait",
            fields=[
                ("job_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("key", models.TextField()),
                ("name", models.TextField()),
                ("timeout_at", models.DateTimeField(null=True)),
                ("created_at", models.DateTimeField(db_default=Now())),
            ],
            options={
                "verbose_name": "event wait",
                "db_table": "queue_event_waits",
                "indexes": [
                    models.Index(fields=["key"], name="queue_event_waits_key_idx"),
                    models.Index(
                        condition=models.Q(("timeout_at__isnull", False)),
                        fields=["timeout_at"],
                        name="queue_event_waits_timeout_idx",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="JobStep",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "job_id",
                        "name",
                        blank=True,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("job_id", models.BigIntegerField()),
                ("name", models.TextField()),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("step", "Step"),
                            ("atomic", "Atomic"),
                            ("sleep", "Sleep"),
                            ("event", "Event"),
                        ],
                        max_length=16,
                    ),
                ),
                ("result", models.JSONField(null=True)),
                ("lease_version", models.BigIntegerField(null=True)),
                ("runtime", models.FloatField(null=True)),
                ("recorded_at", models.DateTimeField(db_default=Now())),
            ],
            options={
                "verbose_name": "job step",
                "db_table": "queue_job_steps",
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            ("kind__in", ["step", "atomic", "sleep", "event"]),
                            ("name__regex", "^.{1,200}$"),
                            models.Q(
                                ("runtime__isnull", True), ("runtime__gte", 0), _connector="OR"
                            ),
                        ),
                        name="queue_job_steps_valid",
                    )
                ],
            },
        ),
        migrations.RunSQL(
            sql=FOREIGN_KEYS,
            reverse_sql=[
                "ALTER TABLE queue_event_waits DROP CONSTRAINT queue_event_waits_job_fk",
                "ALTER TABLE queue_job_steps DROP CONSTRAINT queue_job_steps_job_fk",
            ],
        ),
        migrations.RunSQL(
            sql=[PARK, EMIT],
            reverse_sql=[
                "DROP FUNCTION pgqueue_emit(text, jsonb)",
                "DROP FUNCTION pgqueue_park(bigint, bigint, bigint, text, text, float8, text)",
            ],
        ),
    ]
