# Workflows: job dependencies as data. A job may wait for others (status 'waiting':
# in no claim index); its step row counts the dependencies not finished yet and those
# that failed. pgqueue_settle is called by the statements that end a job (job_complete,
# job_fail, job_cancel, lease_sweep, job_release, job_give_back in sql/core.sql) in
# the same statement, so a dependent is made pending, or cancelled, in the transaction
# that finished its last dependency: a refused (stale) write settles nothing, a crash
# before the commit settles nothing. pgqueue_unsettle is job_retry_now's: an operator
# retry of a dead or cancelled job counts it unfinished again and puts the dependents
# its failure cancelled back to waiting. Both are PL/pgSQL so that a cascade (a
# cancelled step cancels what waits on it, level after level) is one call.

import importlib

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

_initial = importlib.import_module("django_pgqueue.migrations.0001_initial")

STATUSES = "'pending', 'running', 'completed', 'dead', 'cancelled'"
WAITING_STATUSES = "'waiting', " + STATUSES
JOB_STATE_VALID = _initial.JOB_STATE_VALID.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
if JOB_STATE_VALID.count(STATUSES) != 2:
    raise RuntimeError("0001_initial's queue_job_state_valid is not the text 0011 expects")

SETTLE_FUNCTION = r"""
CREATE FUNCTION pgqueue_settle(p_completed bigint[], p_failed bigint[]) RETURNS integer
LANGUAGE plpgsql
-- Its plans are cached for the session, possibly built while queue_job_deps was
-- empty: without sequential scans they are the index probes at every size.
SET enable_seqscan = off
AS $$
DECLARE
    v_completed bigint[] := coalesce(p_completed, '{}');
    v_failed bigint[] := coalesce(p_failed, '{}');
    v_cancelled bigint[];
    v_culprits bigint[];
    v_moved integer;
    v_total integer := 0;
BEGIN
    WHILE cardinality(v_completed) + cardinality(v_failed) > 0 LOOP
        -- The dependents' step rows, locked in job_id order: two transactions settling
        -- one fan-in queue on the first row instead of deadlocking. Once locked, the
        -- next statement's snapshot sees every settle committed before: the counters
        -- it reads are the latest, so each finished dependency is counted once.
        PERFORM FROM queue_workflow_steps AS step
        WHERE step.job_id IN (
            SELECT dep.job_id FROM queue_job_deps AS dep
            WHERE dep.depends_on = ANY (v_completed || v_failed)
        )
        ORDER BY step.job_id
        FOR UPDATE;
        WITH hits AS (
            SELECT dep.job_id, count(*)::integer AS finished,
                   (count(*) FILTER (WHERE dep.depends_on = ANY (v_failed)))::integer AS failed,
                   min(dep.depends_on) FILTER (WHERE dep.depends_on = ANY (v_failed)) AS culprit
            FROM queue_job_deps AS dep
            WHERE dep.depends_on = ANY (v_completed || v_failed)
            GROUP BY dep.job_id
        ), counted AS (
            UPDATE queue_workflow_steps AS step
            SET waiting_for = step.waiting_for - hits.finished,
                failed = step.failed + hits.failed
            FROM hits
            WHERE step.job_id = hits.job_id
            RETURNING step.job_id,
                CASE
                    WHEN step.on_failure = 'cancel' AND step.failed > 0 THEN 'cancelled'
                    WHEN step.waiting_for > 0 THEN NULL
                    WHEN step.on_failure = 'error' AND step.failed = 0 THEN 'cancelled'
                    ELSE 'pending'
                END AS status,
                CASE
                    WHEN step.on_failure = 'error' AND step.failed = 0 THEN
                        'skipped: nothing it waits for failed (a link_error step)'
                    ELSE format('cancelled: job %s it waits for ended dead or cancelled',
                                coalesce(hits.culprit::text, 'a job'))
                END AS reason,
                hits.culprit
        ), moved AS (
            -- Only a waiting step changes: one an operator cancelled, or that runs
            -- already (on_failure "run", or put back by a retry), keeps its status.
            UPDATE queue_job_state AS state
            SET status = counted.status,
                run_at = CASE WHEN counted.status = 'pending'
                              THEN greatest(state.run_at, now()) ELSE state.run_at END,
                finished_at = CASE WHEN counted.status = 'cancelled' THEN now() END,
                last_error = CASE WHEN counted.status = 'cancelled' THEN counted.reason
                                  ELSE state.last_error END,
                updated_at = now()
            FROM counted
            WHERE state.job_id = counted.job_id
              AND counted.status IS NOT NULL
              AND state.status = 'waiting'
            RETURNING state.job_id, state.queue, state.status
        ), wake AS (
            SELECT count(pg_notify('pgqueue', due.queue)::text) AS queues
            FROM (SELECT DISTINCT queue FROM moved WHERE status = 'pending') AS due
        )
        SELECT coalesce(array_agg(moved.job_id) FILTER (WHERE moved.status = 'cancelled'),
                        '{}'),
               coalesce(array_agg(counted.culprit) FILTER (WHERE moved.status = 'cancelled'),
                        '{}'),
               count(moved.job_id)
        INTO v_cancelled, v_culprits, v_moved
        FROM wake
        LEFT JOIN moved ON true
        LEFT JOIN counted ON counted.job_id = moved.job_id;
        IF cardinality(v_cancelled) > 0 THEN
            -- Remember which failure cancelled them: an operator retry of it puts them
            -- back to waiting (a skipped link_error step has no culprit and stays).
            UPDATE queue_workflow_steps AS step
            SET cancelled_by = cancel.culprit
            FROM unnest(v_cancelled, v_culprits) AS cancel(job_id, culprit)
            WHERE step.job_id = cancel.job_id;
        END IF;
        v_total := v_total + v_moved;
        v_completed := '{}';
        v_failed := v_cancelled;
    END LOOP;
    RETURN v_total;
END
$$
"""

UNSETTLE_FUNCTION = r"""
CREATE FUNCTION pgqueue_unsettle(p_retried bigint[]) RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
AS $$
DECLARE
    v_back bigint[] := coalesce(p_retried, '{}');
    v_total integer := 0;
BEGIN
    WHILE cardinality(v_back) > 0 LOOP
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
            -- A step its dependencies' failure cancelled, none failed now: waiting again.
            UPDATE queue_job_state AS state
            SET status = 'waiting',
                finished_at = NULL,
                last_error = NULL,
                lease_version = state.lease_version + 1,
                updated_at = now()
            FROM counted
            WHERE state.job_id = counted.job_id
              AND state.status = 'cancelled'
              AND counted.cancelled_by IS NOT NULL
              AND counted.failed = 0
            RETURNING state.job_id
        )
        SELECT coalesce(array_agg(job_id), '{}') INTO v_back FROM restored;
        UPDATE queue_workflow_steps SET cancelled_by = NULL WHERE job_id = ANY (v_back);
        v_total := v_total + cardinality(v_back);
    END LOOP;
    RETURN v_total;
END
$$
"""


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0010_schedule_code"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobstate",
            name="has_dependents",
            field=models.BooleanField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="jobstate",
            index=models.Index(
                condition=models.Q(("status", "waiting")),
                fields=["queue"],
                name="queue_job_state_waiting_idx",
            ),
        ),
        migrations.CreateModel(
            name="Workflow",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=255)),
                ("steps", models.IntegerField()),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "workflow",
                "db_table": "queue_workflows",
            },
        ),
        migrations.AlterField(
            model_name="jobstate",
            name="status",
            field=models.CharField(
                choices=[
                    ("waiting", "waiting (for its dependencies)"),
                    ("pending", "Pending"),
                    ("running", "Running"),
                    ("completed", "Completed"),
                    ("dead", "Dead"),
                    ("cancelled", "Cancelled"),
                ],
                db_default="pending",
                max_length=16,
            ),
        ),
        migrations.CreateModel(
            name="JobDependency",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "depends_on",
                    models.ForeignKey(
                        db_column="depends_on",
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="dependents",
                        to="django_pgqueue.job",
                    ),
                ),
                (
                    "job",
                    models.ForeignKey(
                        db_column="job_id",
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="dependencies",
                        to="django_pgqueue.job",
                    ),
                ),
            ],
            options={
                "verbose_name": "job dependency",
                "db_table": "queue_job_deps",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("depends_on", "job"), name="queue_job_deps_edge"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("job", models.F("depends_on")), _negated=True),
                        name="queue_job_deps_not_self",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="WorkflowStep",
            fields=[
                (
                    "job",
                    models.OneToOneField(
                        db_column="job_id",
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="workflow_step",
                        serialize=False,
                        to="django_pgqueue.job",
                    ),
                ),
                ("name", models.CharField(max_length=255)),
                (
                    "on_failure",
                    models.CharField(
                        choices=[
                            ("cancel", "cancelled when a dependency fails"),
                            ("run", "runs anyway once its dependencies finished"),
                            ("error", "runs only when a dependency failed (link_error)"),
                        ],
                        max_length=8,
                    ),
                ),
                ("waiting_for", models.IntegerField()),
                ("failed", models.IntegerField(default=0)),
                ("cancelled_by", models.BigIntegerField(blank=True, null=True)),
                (
                    "workflow",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="step_rows",
                        to="django_pgqueue.workflow",
                    ),
                ),
            ],
            options={
                "verbose_name": "workflow step",
                "db_table": "queue_workflow_steps",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("workflow", "name"), name="queue_workflow_steps_name"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("failed__gte", 0), ("waiting_for__gte", 0)),
                        name="queue_workflow_steps_counts",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("on_failure__in", ["cancel", "run", "error"])),
                        name="queue_workflow_steps_on_failure",
                    ),
                ],
            },
        ),
        migrations.RunSQL(
            sql=[
                JOB_STATE_VALID.replace(STATUSES, WAITING_STATUSES),
                "ALTER TABLE queue_workflow_steps ADD CONSTRAINT queue_workflow_steps_job_fk "
                "FOREIGN KEY (job_id) REFERENCES queue_jobs (id) ON DELETE CASCADE",
                "ALTER TABLE queue_workflow_steps ADD CONSTRAINT queue_workflow_steps_flow_fk "
                "FOREIGN KEY (workflow_id) REFERENCES queue_workflows (id) ON DELETE CASCADE",
                "ALTER TABLE queue_job_deps ADD CONSTRAINT queue_job_deps_job_fk "
                "FOREIGN KEY (job_id) REFERENCES queue_jobs (id) ON DELETE CASCADE",
                "ALTER TABLE queue_job_deps ADD CONSTRAINT queue_job_deps_depends_on_fk "
                "FOREIGN KEY (depends_on) REFERENCES queue_jobs (id) ON DELETE CASCADE",
                SETTLE_FUNCTION,
                UNSETTLE_FUNCTION,
            ],
            reverse_sql=[
                "DROP FUNCTION pgqueue_unsettle(bigint[])",
                "DROP FUNCTION pgqueue_settle(bigint[], bigint[])",
                "ALTER TABLE queue_job_deps DROP CONSTRAINT queue_job_deps_depends_on_fk",
                "ALTER TABLE queue_job_deps DROP CONSTRAINT queue_job_deps_job_fk",
                "ALTER TABLE queue_workflow_steps DROP CONSTRAINT queue_workflow_steps_flow_fk",
                "ALTER TABLE queue_workflow_steps DROP CONSTRAINT queue_workflow_steps_job_fk",
                JOB_STATE_VALID,
            ],
        ),
    ]
