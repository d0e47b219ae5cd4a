# Every claim takes its jobs through one function. The claims differ only in which jobs
# they walk to (job_claim, job_claim_after, job_claim_controlled in sql/); what taking
# a job means, running under a new lease with an attempt opened and its row returned,
# is pgqueue_claim's, written once. It is given the ids its caller's walk locked (FOR
# UPDATE SKIP LOCKED, in that statement): no other transaction can change those rows
# until the claim commits, so its statements, which PL/pgSQL runs with a snapshot of
# their own, find them as the walk left them.
#
# PostgreSQL plans a PL/pgSQL function's statements once per session and keeps the
# plans: with the generic plan forced, the claim's update, attempt insert and job probes
# are planned once per connection, also behind a pooler that allows no prepared
# statements (measured there, a claim of 10 as the worker sends it: 1.27 ms against
# 1.54 ms when the whole claim was planned at every call). Sequential scans are off in
# it, so the plan kept is the primary-key probes at every size, even one built while
# the tables were empty. On a worker's prepared claim the call costs 30-45 us of the
# server's time a claim of 10 (5-7%), 2-4% of the claim's round trip; the controlled
# claim, planned at every call, got 3% faster (medians of 600-1,000 alternating runs).

from django.db import migrations

CLAIM = r"""
CREATE FUNCTION pgqueue_claim(
    p_job_ids bigint[], p_queue text, p_worker_id text, p_lease float8,
    p_started_at timestamptz
) RETURNS TABLE (
    job_id bigint, queue text, type text, payload text, priority smallint,
    attempts integer, max_attempts integer, lease_version bigint, attempt_id bigint,
    idempotency_key text, created_at timestamptz, run_at timestamptz, traceparent text
)
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH claimed AS (
        UPDATE queue_job_state AS state
        SET status = 'running',
            attempts = state.attempts + 1,
            lease_version = state.lease_version + 1,
            locked_by = p_worker_id,
            locked_until = now() + make_interval(secs => p_lease),
            updated_at = now()
        -- An array of ids, not a join: a join can turn into a sequential scan of the
        -- whole table when the statistics are stale (and autovacuum may be off). The
        -- queue is not repeated here: a filter on it lowers the planner's estimate of
        -- the rows updated, which changes the joins below.
        WHERE state.job_id = ANY (p_job_ids)
        RETURNING state.job_id, state.queue, state.priority, state.run_at, state.attempts,
                  state.max_attempts, state.lease_version
    ), opened AS (
        -- started_at is the clock when the row is claimed (p_started_at: the controlled
        -- claim's rate-window time), not now(): now() is the transaction's start,
        -- before the walk took its snapshot, so a job that a sweep requeued in between
        -- would show its new attempt starting before the lost one ended (seen in the
        -- claims-racing-sweeps scenario).
        INSERT INTO queue_attempts (
            job_id, lease_version, attempt_index, worker_id, status, started_at
        )
        SELECT claimed.job_id, claimed.lease_version, claimed.attempts, p_worker_id,
               'running', coalesce(p_started_at, clock_timestamp())
        FROM claimed
        RETURNING queue_attempts.id, queue_attempts.job_id
    )
    SELECT claimed.job_id, claimed.queue::text, job.type::text, job.payload,
           claimed.priority, claimed.attempts, claimed.max_attempts, claimed.lease_version,
           opened.id, job.idempotency_key::text, job.created_at, claimed.run_at,
           job.traceparent
    FROM claimed
    JOIN opened ON opened.job_id = claimed.job_id
    -- LIMIT 1 keeps this subquery from being flattened into a join: one primary-key
    -- probe per claimed row, instead of a hash join that reads all of queue_jobs when
    -- the planner underestimates how cheap the probes are.
    CROSS JOIN LATERAL (
        SELECT j.type, j.payload::text AS payload, j.idempotency_key, j.created_at,
               j.traceparent
        FROM queue_jobs AS j
        WHERE j.id = claimed.job_id
          -- The queue names the shard where the tables are distributed by it (Citus,
          -- see docs/howto/scaling-out.md); here it only checks the row the key found.
          AND j.queue = p_queue
        LIMIT 1
    ) AS job;
END
$$
"""


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0016_unsettle_every_dependent")]

    operations = [
        migrations.RunSQL(
            sql=[CLAIM],
            reverse_sql=["DROP FUNCTION pgqueue_claim(bigint[], text, text, float8, timestamptz)"],
        ),
    ]
