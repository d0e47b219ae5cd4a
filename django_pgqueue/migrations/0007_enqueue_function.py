# Issue 16: enqueue through a PL/pgSQL function. PostgreSQL parses and plans the
# statements of a PL/pgSQL function once per session and reuses the plans, so a single
# enqueue no longer pays for planning two INSERTs every time (Django binds parameters
# on the client and turns psycopg's prepared statements off, and a transaction-mode
# pooler may not allow them anyway; a function call needs neither). The call is the
# job_enqueue statement in sql/core.sql.

from django.db import migrations

ENQUEUE_FUNCTION = r"""
CREATE FUNCTION pgqueue_enqueue(
    p_queue text, p_type text, p_payload jsonb, p_priority smallint, p_run_at timestamptz,
    p_delay float8, p_max_attempts integer, p_idempotency_key text, p_traceparent text,
    p_concurrency_key text,
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
            concurrency_key, updated_at
        )
        VALUES (v_id, p_queue, 'pending', p_priority, v_run_at, 0, p_max_attempts, 0,
                p_concurrency_key, now());
    ELSE
        FOR attempt IN 1..5 LOOP
            WITH new_job AS (
                SELECT nextval(pg_get_serial_sequence('queue_jobs', 'id')) AS id
            ), state AS (
                INSERT INTO queue_job_state AS s (
                    job_id, queue, status, priority, run_at, attempts, max_attempts,
                    lease_version, idempotency_key, concurrency_key, updated_at
                )
                SELECT new_job.id, p_queue, 'pending', p_priority, v_run_at, 0, p_max_attempts,
                       0, p_idempotency_key, p_concurrency_key, now()
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

ENQUEUE_SIGNATURE = (
    "pgqueue_enqueue(text, text, jsonb, smallint, timestamptz, float8, integer, text, text, text)"
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0006_queue_type_controls")]

    operations = [
        migrations.RunSQL(
            sql=[ENQUEUE_FUNCTION],
            reverse_sql=[f"DROP FUNCTION {ENQUEUE_SIGNATURE}"],
        ),
    ]
