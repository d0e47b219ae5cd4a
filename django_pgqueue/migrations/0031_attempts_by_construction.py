# An attempt always has its state row: held by construction, no longer by a foreign key.
#
# The foreign key queue_attempts.job_id -> queue_job_state cost every claim one
# RI trigger per claimed row (a lookup of the state row the same statement had just
# updated): about 95 us of a claim of 10 (7%) and 12-36 us of a claim of one, measured
# alternating against the same database without it. What holds the rule now:
# - an attempt is inserted only by pgqueue_claim, from the rows its UPDATE of
#   queue_job_state returned, in the same statement (tests/integration/test_constraints.py);
# - an attempt's job_id never changes (queue_attempts_job_fixed refuses the update);
# - deleting state rows deletes their attempts, as ON DELETE CASCADE did, and TRUNCATE
#   queue_job_state is refused unless queue_attempts goes in the same TRUNCATE: the rule
#   queue_jobs' triggers already hold for the state rows, so one function holds both.

import importlib

from django.db import migrations

SQUASHED = importlib.import_module(
    "django_pgqueue.migrations.0001_squashed_0029_enqueue_statement_work"
)

# A table's rows that belong to rows of another go with them: queue_jobs' state rows,
# queue_job_state's attempts. Deleting rows deletes theirs (statement-level, from the
# transition table); a TRUNCATE that leaves theirs behind is refused. The deletes go by
# an array, not a join: PL/pgSQL keeps a statement's plan for the session, and one made
# for a first delete of many rows (a scan of the table) would serve every later one; an
# array of any size is looked up in the index.
DELETE_DEPENDENTS = r"""
CREATE FUNCTION queue_delete_dependents() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        IF TG_TABLE_NAME = 'queue_jobs' AND EXISTS (SELECT FROM queue_job_state) THEN
            RAISE foreign_key_violation USING MESSAGE = 'queue_jobs: truncate '
                'queue_job_state and queue_attempts in the same TRUNCATE';
        ELSIF TG_TABLE_NAME = 'queue_job_state' AND EXISTS (SELECT FROM queue_attempts) THEN
            RAISE foreign_key_violation USING MESSAGE = 'queue_job_state: truncate '
                'queue_attempts in the same TRUNCATE';
        END IF;
    ELSIF TG_TABLE_NAME = 'queue_jobs' THEN
        DELETE FROM queue_job_state AS state
        WHERE state.job_id = ANY (ARRAY(SELECT gone.id FROM gone));
    ELSE
        DELETE FROM queue_attempts AS attempt
        WHERE attempt.job_id = ANY (ARRAY(SELECT gone.job_id FROM gone));
    END IF;
    RETURN NULL;
END
$$
"""

ATTEMPT_JOB_FIXED = r"""
CREATE FUNCTION queue_attempts_job_fixed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE foreign_key_violation USING MESSAGE =
        'queue_attempts: an attempt''s job never changes (it belongs to its state row)';
END
$$
"""


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0030_holds_unique_key_and_end_event_waits")]

    operations = [
        migrations.RunSQL(
            sql=[
                DELETE_DEPENDENTS,
                ATTEMPT_JOB_FIXED,
                # queue_jobs' two triggers move to the one function.
                "DROP TRIGGER queue_jobs_truncate_state ON queue_jobs",
                "DROP TRIGGER queue_jobs_delete_state ON queue_jobs",
                "DROP FUNCTION queue_jobs_delete_state()",
                "CREATE TRIGGER queue_jobs_delete_state AFTER DELETE ON queue_jobs "
                "REFERENCING OLD TABLE AS gone FOR EACH STATEMENT "
                "EXECUTE FUNCTION queue_delete_dependents()",
                "CREATE TRIGGER queue_jobs_truncate_state AFTER TRUNCATE ON queue_jobs "
                "FOR EACH STATEMENT EXECUTE FUNCTION queue_delete_dependents()",
                "CREATE TRIGGER queue_job_state_delete_attempts AFTER DELETE ON queue_job_state "
                "REFERENCING OLD TABLE AS gone FOR EACH STATEMENT "
                "EXECUTE FUNCTION queue_delete_dependents()",
                "CREATE TRIGGER queue_job_state_truncate_attempts AFTER TRUNCATE "
                "ON queue_job_state FOR EACH STATEMENT EXECUTE FUNCTION queue_delete_dependents()",
                "CREATE TRIGGER queue_attempts_job_fixed AFTER UPDATE OF job_id ON queue_attempts "
                "FOR EACH ROW WHEN (OLD.job_id IS DISTINCT FROM NEW.job_id) "
                "EXECUTE FUNCTION queue_attempts_job_fixed()",
                "ALTER TABLE queue_attempts DROP CONSTRAINT queue_attempts_job_fk",
            ],
            reverse_sql=[
                # An attempt written without its state row (by hand) would fail the key.
                "DELETE FROM queue_attempts AS attempt WHERE NOT EXISTS "
                "(SELECT FROM queue_job_state AS state WHERE state.job_id = attempt.job_id)",
                "ALTER TABLE queue_attempts ADD CONSTRAINT queue_attempts_job_fk "
                "FOREIGN KEY (job_id) REFERENCES queue_job_state (job_id) ON DELETE CASCADE",
                "DROP TRIGGER queue_attempts_job_fixed ON queue_attempts",
                "DROP TRIGGER queue_job_state_truncate_attempts ON queue_job_state",
                "DROP TRIGGER queue_job_state_delete_attempts ON queue_job_state",
                "DROP TRIGGER queue_jobs_truncate_state ON queue_jobs",
                "DROP TRIGGER queue_jobs_delete_state ON queue_jobs",
                "DROP FUNCTION queue_attempts_job_fixed()",
                "DROP FUNCTION queue_delete_dependents()",
                SQUASHED.DELETE_STATE,
                *SQUASHED.DELETE_STATE_TRIGGERS,
            ],
        ),
    ]
