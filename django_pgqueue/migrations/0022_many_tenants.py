# Many tenants on one queue: unique jobs and debounce, and fair queues' keys.
#
# Unique jobs and debounce: a unique key with a hold and a policy on conflict, decided
# by the database in the enqueuing transaction (never a read, then a write).
#
# - The holds that follow a job's status (pending, until first claimed; active: pending,
#   running or parked in waiting; until it completed) are one unique partial index on
#   the state rows, whose predicate is each row's own hold: a row with no key never
#   enters it, so queues without unique keys pay nothing. The enqueue's INSERT names the
#   predicate in ON CONFLICT (written whole in each statement, as the index has it): DO
#   NOTHING to return or refuse (then the holder is looked up, and a key that changed
#   hands after the statement's snapshot is tried again, as pgqueue_enqueue does), DO
#   UPDATE of a holder never claimed (pending, lease_version 0) of the same type to
#   replace (a debounce: its due time here, its payload in the same statement; the
#   holder's row lock keeps the claim off it until the caller commits; a "pending"
#   holder claimed meanwhile no longer conflicts, so a new job is written; a holder of
#   another hold that was claimed is returned, one of another type refused:
#   'other_type'). A "pending" hold ends at the first claim (lease_version > 0), so a
#   job going back to pending (a retry, a lost lease) never meets the newer holder of
#   its key.
# - A hold for a period is a row per key (queue_unique_keys): INSERT ... ON CONFLICT DO
#   UPDATE takes the key when its period ended, and otherwise locks the row all the
#   same, so the holder read next is the one that holds it until this transaction ends.
#
# Fair queues: every job of a fair queue carries a fair key (queue_job_state.fair_key),
# indexed per queue and key in claim order (queue_job_state_fair_idx, pending rows with a
# key only: other queues pay nothing). The enqueue functions write it: pgqueue_enqueue
# takes it as a new last argument (the old signature is dropped), and so does
# pgqueue_enqueue_unique.

import importlib

from django.db import migrations, models

OLD_ENQUEUE = importlib.import_module(
    "django_pgqueue.migrations.0001_squashed_0017_claim_function"
).ENQUEUE

# pgqueue_enqueue as the first migration wrote it, the fair key written with the state row.
ENQUEUE = r"""
CREATE FUNCTION pgqueue_enqueue(
    p_queue text, p_type text, p_payload jsonb, p_priority smallint, p_run_at timestamptz,
    p_delay float8, p_max_attempts integer, p_idempotency_key text, p_traceparent text,
    p_concurrency_key text, p_fair_key text,
    OUT job_id bigint, OUT created boolean, OUT created_at timestamptz
)
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
    v_run_at timestamptz := coalesce(p_run_at, now() + make_interval(secs => p_delay));
BEGIN
    IF p_idempotency_key IS NULL THEN
        INSERT INTO queue_jobs (queue, type, payload, created_at, traceparent)
        VALUES (p_queue, p_type, p_payload, now(), p_traceparent)
        RETURNING id INTO v_id;
        INSERT INTO queue_job_state (
            job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version,
            concurrency_key, fair_key, updated_at
        )
        VALUES (v_id, p_queue, 'pending', p_priority, v_run_at, 0, p_max_attempts, 0,
                p_concurrency_key, p_fair_key, now());
    ELSE
        FOR attempt IN 1..5 LOOP
            WITH new_job AS (
                SELECT nextval(pg_get_serial_sequence('queue_jobs', 'id')) AS id
            ), state AS (
                INSERT INTO queue_job_state AS s (
                    job_id, queue, status, priority, run_at, attempts, max_attempts,
                    lease_version, idempotency_key, concurrency_key, fair_key, updated_at
                )
                SELECT new_job.id, p_queue, 'pending', p_priority, v_run_at, 0, p_max_attempts,
                       0, p_idempotency_key, p_concurrency_key, p_fair_key, now()
                FROM new_job
                ON CONFLICT (queue, idempotency_key)
                    WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'running')
                    DO NOTHING
                RETURNING s.job_id
            ), job AS (
                INSERT INTO queue_jobs (id, queue, type, payload, idempotency_key, created_at,
                                        traceparent)
                SELECT state.job_id, p_queue, p_type, p_payload, p_idempotency_key, now(),
                       p_traceparent
                FROM state
                RETURNING id
            )
            SELECT job.id INTO v_id FROM job;
            EXIT WHEN v_id IS NOT NULL;
            SELECT live.job_id, held.created_at INTO job_id, created_at
            FROM queue_job_state AS live
            JOIN queue_jobs AS held ON held.id = live.job_id
            WHERE live.queue = p_queue
              AND live.idempotency_key = p_idempotency_key
              AND live.status IN ('pending', 'running');
            IF job_id IS NOT NULL THEN
                created := false;
                RETURN;
            END IF;
        END LOOP;
        IF v_id IS NULL THEN
            RETURN;
        END IF;
    END IF;
    IF p_concurrency_key IS NOT NULL AND NOT EXISTS (
        SELECT FROM queue_controls AS known WHERE known.queue = p_queue AND known.keyed
    ) THEN
        INSERT INTO queue_controls AS c (queue, paused, key_limit, rate_starts, keyed, updated_at)
        VALUES (p_queue, false, 1, '{}', true, now())
        ON CONFLICT (queue) DO UPDATE SET keyed = true, updated_at = now();
    END IF;
    IF v_run_at <= now() THEN
        PERFORM pg_notify('pgqueue', p_queue);
    END IF;
    job_id := v_id;
    created := true;
    created_at := now();
END
$$
"""

OLD_ENQUEUE_SIGNATURE = (
    "pgqueue_enqueue(text, text, jsonb, smallint, timestamptz, float8, integer, text, text, text)"
)
ENQUEUE_SIGNATURE = (
    "pgqueue_enqueue(text, text, jsonb, smallint, timestamptz, float8, integer, text, text, "
    "text, text)"
)

ENQUEUE_UNIQUE = r"""
CREATE FUNCTION pgqueue_enqueue_unique(
    p_queue text, p_type text, p_payload jsonb, p_priority smallint, p_run_at timestamptz,
    p_delay float8, p_max_attempts integer, p_traceparent text, p_concurrency_key text,
    p_unique_key text, p_unique_hold text, p_unique_seconds float8, p_on_conflict text,
    p_fair_key text,
    OUT job_id bigint, OUT outcome text, OUT created_at timestamptz
)
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
    v_held_type text;
    v_run_at timestamptz := coalesce(p_run_at, now() + make_interval(secs => p_delay));
BEGIN
    IF p_unique_hold = 'period' THEN
        v_id := nextval(pg_get_serial_sequence('queue_jobs', 'id'));
        INSERT INTO queue_unique_keys AS k (queue, unique_key, job_id, held_until)
        VALUES (p_queue, p_unique_key, v_id,
                now() + make_interval(secs => p_unique_seconds))
        ON CONFLICT (queue, unique_key) DO UPDATE
            SET job_id = excluded.job_id, held_until = excluded.held_until
            WHERE k.held_until <= now()
        RETURNING k.job_id INTO v_id;
        IF v_id IS NULL THEN
            -- Held: the row is locked by this transaction now, its holder final.
            SELECT k.job_id INTO job_id
            FROM queue_unique_keys AS k
            WHERE k.queue = p_queue AND k.unique_key = p_unique_key;
            SELECT held.created_at INTO created_at FROM queue_jobs AS held WHERE held.id = job_id;
            outcome := 'existing';
            RETURN;
        END IF;
        INSERT INTO queue_jobs (id, queue, type, payload, created_at, traceparent)
        VALUES (v_id, p_queue, p_type, p_payload, now(), p_traceparent);
        INSERT INTO queue_job_state (
            job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version,
            concurrency_key, unique_key, unique_hold, fair_key, updated_at
        )
        VALUES (v_id, p_queue, 'pending', p_priority, v_run_at, 0, p_max_attempts, 0,
                p_concurrency_key, p_unique_key, 'period', p_fair_key, now());
        outcome := 'created';
    ELSE
        FOR attempt IN 1..5 LOOP
            IF p_on_conflict = 'replace' THEN
                WITH new_job AS (
                    SELECT nextval(pg_get_serial_sequence('queue_jobs', 'id')) AS id
                ), state AS (
                    INSERT INTO queue_job_state AS s (
                        job_id, queue, status, priority, run_at, attempts, max_attempts,
                        lease_version, concurrency_key, unique_key, unique_hold, fair_key,
                        updated_at
                    )
                    SELECT new_job.id, p_queue, 'pending', p_priority, v_run_at, 0,
                           p_max_attempts, 0, p_concurrency_key, p_unique_key, p_unique_hold,
                           p_fair_key, now()
                    FROM new_job
                    ON CONFLICT (queue, unique_key) WHERE (
                        (unique_hold = 'pending' AND status = 'pending' AND lease_version = 0)
                        OR (unique_hold = 'active'
                            AND status IN ('waiting', 'pending', 'running'))
                        OR (unique_hold = 'until_completed'
                            AND status IN ('waiting', 'pending', 'running', 'dead'))
                    )
                    DO UPDATE SET run_at = excluded.run_at, updated_at = now()
                        -- Only a holder never claimed, of this job type, is replaced:
                        -- another is returned below (or, of another type, refused).
                        WHERE s.status = 'pending' AND s.lease_version = 0
                          AND EXISTS (
                              SELECT FROM queue_jobs AS held
                              WHERE held.id = s.job_id AND held.type = p_type
                          )
                    RETURNING s.job_id, s.job_id = (SELECT id FROM new_job) AS inserted
                ), job AS (
                    INSERT INTO queue_jobs (id, queue, type, payload, created_at, traceparent)
                    SELECT state.job_id, p_queue, p_type, p_payload, now(), p_traceparent
                    FROM state
                    WHERE state.inserted
                    RETURNING id, 'created' AS outcome, queue_jobs.created_at
                ), replaced AS (
                    UPDATE queue_jobs AS j
                    SET payload = p_payload, traceparent = p_traceparent
                    FROM state
                    WHERE j.id = state.job_id AND NOT state.inserted
                    RETURNING j.id, 'replaced' AS outcome, j.created_at
                )
                SELECT written.id, written.outcome, written.created_at
                INTO v_id, outcome, created_at
                FROM (SELECT * FROM job UNION ALL SELECT * FROM replaced) AS written;
            ELSE
                WITH new_job AS (
                    SELECT nextval(pg_get_serial_sequence('queue_jobs', 'id')) AS id
                ), state AS (
                    INSERT INTO queue_job_state AS s (
                        job_id, queue, status, priority, run_at, attempts, max_attempts,
                        lease_version, concurrency_key, unique_key, unique_hold, fair_key,
                        updated_at
                    )
                    SELECT new_job.id, p_queue, 'pending', p_priority, v_run_at, 0,
                           p_max_attempts, 0, p_concurrency_key, p_unique_key, p_unique_hold,
                           p_fair_key, now()
                    FROM new_job
                    ON CONFLICT (queue, unique_key) WHERE (
                        (unique_hold = 'pending' AND status = 'pending' AND lease_version = 0)
                        OR (unique_hold = 'active'
                            AND status IN ('waiting', 'pending', 'running'))
                        OR (unique_hold = 'until_completed'
                            AND status IN ('waiting', 'pending', 'running', 'dead'))
                    )
                    DO NOTHING
                    RETURNING s.job_id
                ), job AS (
                    INSERT INTO queue_jobs (id, queue, type, payload, created_at, traceparent)
                    SELECT state.job_id, p_queue, p_type, p_payload, now(), p_traceparent
                    FROM state
                    RETURNING id, queue_jobs.created_at
                )
                SELECT job.id, 'created', job.created_at INTO v_id, outcome, created_at
                FROM job;
            END IF;
            EXIT WHEN v_id IS NOT NULL;
            SELECT live.job_id, held.created_at, held.type
            INTO job_id, created_at, v_held_type
            FROM queue_job_state AS live
            JOIN queue_jobs AS held ON held.id = live.job_id
            WHERE live.queue = p_queue
              AND live.unique_key = p_unique_key
              AND (
                  (live.unique_hold = 'pending' AND live.status = 'pending'
                   AND live.lease_version = 0)
                  OR (live.unique_hold = 'active'
                      AND live.status IN ('waiting', 'pending', 'running'))
                  OR (live.unique_hold = 'until_completed'
                      AND live.status IN ('waiting', 'pending', 'running', 'dead'))
              );
            IF job_id IS NOT NULL THEN
                -- A debounce never puts its payload on a job of another type.
                outcome := CASE
                    WHEN p_on_conflict = 'replace' AND v_held_type <> p_type THEN 'other_type'
                    ELSE 'existing'
                END;
                RETURN;
            END IF;
        END LOOP;
        IF v_id IS NULL THEN
            RETURN;  -- the key kept changing hands: all NULL, the caller says so
        END IF;
    END IF;
    IF outcome = 'created' AND p_concurrency_key IS NOT NULL AND NOT EXISTS (
        SELECT FROM queue_controls AS known WHERE known.queue = p_queue AND known.keyed
    ) THEN
        INSERT INTO queue_controls AS c (queue, paused, key_limit, rate_starts, keyed, updated_at)
        VALUES (p_queue, false, 1, '{}', true, now())
        ON CONFLICT (queue) DO UPDATE SET keyed = true, updated_at = now();
    END IF;
    IF v_run_at <= now() THEN
        PERFORM pg_notify('pgqueue', p_queue);
    END IF;
    job_id := v_id;
END
$$
"""

ENQUEUE_UNIQUE_SIGNATURE = (
    "pgqueue_enqueue_unique(text, text, jsonb, smallint, timestamptz, float8, integer, text, "
    "text, text, text, float8, text, text)"
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0021_durable_steps")]

    operations = [
        migrations.CreateModel(
            name="UniqueKey",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("queue", models.CharField(max_length=63)),
                ("unique_key", models.CharField(max_length=255)),
                ("job_id", models.BigIntegerField()),
                ("held_until", models.DateTimeField()),
            ],
            options={"verbose_name": "unique key", "db_table": "queue_unique_keys"},
        ),
        migrations.AddConstraint(
            model_name="uniquekey",
            constraint=models.UniqueConstraint(
                fields=("queue", "unique_key"), name="queue_unique_keys_key"
            ),
        ),
        migrations.AddField(
            model_name="jobstate",
            name="unique_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="jobstate",
            name="unique_hold",
            field=models.CharField(blank=True, max_length=16, null=True),
        ),
        migrations.AddConstraint(
            model_name="jobstate",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    models.Q(
                        ("lease_version", 0), ("status", "pending"), ("unique_hold", "pending")
                    ),
                    models.Q(
                        ("status__in", ["waiting", "pending", "running"]), ("unique_hold", "active")
                    ),
                    models.Q(
                        ("status__in", ["waiting", "pending", "running", "dead"]),
                        ("unique_hold", "until_completed"),
                    ),
                    _connector="OR",
                ),
                fields=("queue", "unique_key"),
                name="queue_job_state_unique_key",
            ),
        ),
        migrations.AddField(
            model_name="jobstate",
            name="fair_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddIndex(
            model_name="jobstate",
            index=models.Index(
                condition=models.Q(("fair_key__isnull", False), ("status", "pending")),
                fields=["queue", "fair_key", "-priority", "run_at", "job"],
                name="queue_job_state_fair_idx",
            ),
        ),
        migrations.RunSQL(
            sql=[f"DROP FUNCTION {OLD_ENQUEUE_SIGNATURE}", ENQUEUE],
            reverse_sql=[f"DROP FUNCTION {ENQUEUE_SIGNATURE}", OLD_ENQUEUE],
        ),
        migrations.RunSQL(
            sql=[ENQUEUE_UNIQUE],
            reverse_sql=[f"DROP FUNCTION {ENQUEUE_UNIQUE_SIGNATURE}"],
        ),
    ]
