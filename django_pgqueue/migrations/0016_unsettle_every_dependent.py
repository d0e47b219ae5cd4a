# An operator retry puts back to waiting every dependent that has not started, by one
# rule, and a retried step forgets what cancelled it. pgqueue_unsettle takes the retried
# jobs too (a second array), so job_retry_now's bookkeeping of steps stays one call:
#
# - A dependent the retry makes unfinished-for again waits, whatever its kind, unless it
#   started (running, or ended by its own run) or an operator cancelled it: one made
#   pending by the settle but not claimed yet (a batch's on_finish or on_discard, a
#   step with on_failure "run" or "error") as well as one its dependencies' failure
#   cancelled. Before, only the cancelled ones did: a pending callback kept waiting_for
#   above 0, ran before the retried member finished, and never after.
# - cancelled_by is set while, and only while, the settle's cancellation is the step's
#   status. A step the operator retries directly clears it, here in the same statement;
#   before, it kept it, and a later retry of the old culprit revived the step even after
#   an operator had cancelled it. Rows left stale by the old function (a step retried
#   directly, not cancelled now) are cleared below.

import importlib

from django.db import migrations

_workflows = importlib.import_module("django_pgqueue.migrations.0011_workflows")

UNSETTLE = r"""
CREATE FUNCTION pgqueue_unsettle(p_reopened bigint[], p_retried bigint[]) RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_back bigint[] := coalesce(p_reopened, '{}');
    v_moved integer;
    v_total integer := 0;
BEGIN
    -- The retried steps and the first dependents, locked together in job_id order (as
    -- pgqueue_settle locks), so a settle running at the same time queues behind.
    PERFORM FROM queue_workflow_steps AS step
    WHERE step.job_id = ANY (coalesce(p_retried, '{}') || ARRAY(
        SELECT dep.job_id FROM queue_job_deps AS dep WHERE dep.depends_on = ANY (v_back)
    ))
    ORDER BY step.job_id
    FOR UPDATE;
    -- The retried steps' own cancellation is over (each is pending or waiting now):
    -- a later retry of what cancelled one must not take it for a step that failure
    -- cancelled.
    UPDATE queue_workflow_steps
    SET cancelled_by = NULL
    WHERE job_id = ANY (coalesce(p_retried, '{}')) AND cancelled_by IS NOT NULL;
    WHILE cardinality(v_back) > 0 LOOP
        -- The dependents' step rows, locked in job_id order (held already at the
        -- first turn).
        PERFORM FROM queue_workflow_steps AS step
        WHERE step.job_id IN (
            SELECT dep.job_id FROM queue_job_deps AS dep WHERE dep.depends_on = ANY (v_back)
        )
        ORDER BY step.job_id
        FOR UPDATE;
        -- Each job in v_back was counted finished and failed when it ended dead or
        -- cancelled; it is unfinished again.
        WITH hits AS (
            SELECT dep.job_id, count(*)::integer AS back
            FROM queue_job_deps AS dep
            WHERE dep.depends_on = ANY (v_back)
            GROUP BY dep.job_id
        ), counted AS (
            UPDATE queue_workflow_steps AS step
            SET waiting_for = step.waiting_for + hits.back,
                failed = step.failed - hits.back
            FROM hits
            WHERE step.job_id = hits.job_id
            RETURNING step.job_id, step.failed, step.cancelled_by
        ), restored AS (
            -- A dependent waits while a dependency is unfinished, unless it started
            -- (it stays run) or an operator cancelled it (cancelled_by NULL): pending
            -- (due, not claimed yet) goes back to waiting, and so does one its
            -- dependencies' failure cancelled, once none of them is failed.
            UPDATE queue_job_state AS state
            SET status = 'waiting',
                finished_at = NULL,
                last_error = CASE WHEN state.status = 'cancelled' THEN NULL
                                  ELSE state.last_error END,
                lease_version = state.lease_version + 1,
                updated_at = now()
            FROM counted
            WHERE state.job_id = counted.job_id
              AND (state.status = 'pending'
                   OR (state.status = 'cancelled'
                       AND counted.cancelled_by IS NOT NULL
                       AND counted.failed = 0))
            RETURNING state.job_id, counted.cancelled_by IS NOT NULL AS reopened
        )
        -- Only a restored cancelled step had been counted finished by its own
        -- dependents: it is unfinished for them again (the next turn).
        SELECT coalesce(array_agg(job_id) FILTER (WHERE reopened), '{}'), count(*)
        INTO v_back, v_moved
        FROM restored;
        UPDATE queue_workflow_steps SET cancelled_by = NULL WHERE job_id = ANY (v_back);
        v_total := v_total + v_moved;
    END LOOP;
    RETURN v_total;
END
$$
"""

# 0011's function, with 0015's setting: what the reverse puts back.
OLD_UNSETTLE = _workflows.UNSETTLE_FUNCTION

STALE = """
UPDATE queue_workflow_steps AS step
SET cancelled_by = NULL
FROM queue_job_state AS state
WHERE state.job_id = step.job_id
  AND step.cancelled_by IS NOT NULL
  AND state.status <> 'cancelled'
"""


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0015_settle_generic_plans")]

    operations = [
        migrations.RunSQL(
            sql=["DROP FUNCTION pgqueue_unsettle(bigint[])", UNSETTLE, STALE],
            reverse_sql=[
                "DROP FUNCTION pgqueue_unsettle(bigint[], bigint[])",
                OLD_UNSETTLE,
                "ALTER FUNCTION pgqueue_unsettle(bigint[]) SET plan_cache_mode = "
                "force_generic_plan",
            ],
        ),
    ]
