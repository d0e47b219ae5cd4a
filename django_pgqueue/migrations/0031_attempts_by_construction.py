# An attempt always has its state row: held by construction, no longer by a foreign key.
#
# The foreign key queue_attempts.job_id -> queue_job_state cost every claim one
# RI trigger per claimed row (a lookup of the state row the same statement had just
# updated): about 95 us of a claim of 10 (7%) and 12-36 us of a claim of one, measured
# alternating against the same database without it. What holds the rule now:
# - an attempt is inserted only by pgqueue_claim, from the rows its UPDATE of
#   queue_job_state returned, in the same statement (tests/integration/test_constraints.py);
# - an attempt's job_id never changes (queue_attempts_job_fixed refuses the update);
# - deleting state rows deletes their attempts (a statement-level AFTER DELETE trigger,
#   as ON DELETE CASCADE did; deleting jobs deletes their state rows, so their attempts);
# - TRUNCATE queue_job_state is refused unless queue_attempts goes in the same TRUNCATE.

from django.db import migrations

DELETE_ATTEMPTS = r"""
CREATE FUNCTION queue_job_state_delete_attempts() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        IF EXISTS (SELECT FROM queue_attempts) THEN
            RAISE foreign_key_violation USING MESSAGE = 'queue_job_state: truncate '
                'queue_attempts in the same TRUNCATE';
        END IF;
    ELSE
        -- By an array, not a join: the plan is kept for the session, and one made for
        -- a first delete of many rows (a scan of queue_attempts) would serve every
        -- later one; an array of any size is looked up in the index.
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
                DELETE_ATTEMPTS,
                ATTEMPT_JOB_FIXED,
                "CREATE TRIGGER queue_job_state_delete_attempts AFTER DELETE ON queue_job_state "
                "REFERENCING OLD TABLE AS gone FOR EACH STATEMENT "
                "EXECUTE FUNCTION queue_job_state_delete_attempts()",
                "CREATE TRIGGER queue_job_state_truncate_attempts AFTER TRUNCATE "
                "ON queue_job_state FOR EACH STATEMENT "
                "EXECUTE FUNCTION queue_job_state_delete_attempts()",
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
                "DROP FUNCTION queue_attempts_job_fixed()",
                "DROP FUNCTION queue_job_state_delete_attempts()",
            ],
        ),
    ]
