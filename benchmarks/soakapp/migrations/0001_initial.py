"""The soak's record tables, and a trigger that logs every state change of a job.

Plain SQL and no models: nothing but the soak reads or writes these tables, and the trigger
must see every writer of ``dbqueue_job`` (the claim, the completion, the sweeper, a requeue,
the workflow trigger), whatever path it takes.

- ``soak_run``: one row per handler run, written by the handler on a connection of its own in
  autocommit, so a run whose job rolls back still leaves its record (benchmarks/soakapp/jobs.py).
- ``soak_effect``: one row per guarded effect key; ``n`` counts how often it happened.
- ``soak_transition``: one row per state change of a job, written by the trigger in the
  transaction that made the change (so it commits or rolls back with it): the clock at the
  statement, the transaction's start (``now()``), the claim's ``started_at``, the transaction's
  id, the row's ``attempts``, the lease token the row had
  before and after, and the class of the error entry it appended, if any.
- ``soak_witness``: ``pg_current_snapshot()`` taken every few milliseconds by the soak, with
  the clock: a transaction visible in a witness was committed before the witness's clock.
"""

from django.db import migrations

TABLES = """
CREATE TABLE soak_run (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    type text NOT NULL,
    queue text NOT NULL,
    serial_key text,
    lease_token bigint,
    worker text NOT NULL,
    mode text NOT NULL,
    pid integer NOT NULL,
    proc_start bigint NOT NULL,
    tid integer NOT NULL,
    thread_start bigint NOT NULL,
    started_at timestamptz NOT NULL,
    ended_at timestamptz,
    outcome text
);
CREATE INDEX soak_run_open_idx ON soak_run (id) WHERE ended_at IS NULL;

CREATE TABLE soak_effect (
    key text PRIMARY KEY,
    n integer NOT NULL,
    job_id bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE soak_transition (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    old_state text,
    new_state text NOT NULL,
    at timestamptz NOT NULL,
    xact_at timestamptz NOT NULL,
    started_at timestamptz,
    xid xid8 NOT NULL,
    attempts integer NOT NULL,
    old_token bigint,
    new_token bigint,
    cause text
);
CREATE INDEX soak_transition_job_idx ON soak_transition (job_id, id);

CREATE TABLE soak_witness (
    id bigserial PRIMARY KEY,
    at timestamptz NOT NULL,
    snap pg_snapshot NOT NULL
);
CREATE INDEX soak_witness_at_idx ON soak_witness (at);
"""

TRIGGER = """
CREATE OR REPLACE FUNCTION soak_log_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO soak_transition
            (job_id, old_state, new_state, at, xact_at, started_at, xid, attempts, old_token, new_token,
             cause)
        VALUES (NEW.id, NULL, NEW.state, clock_timestamp(), now(), NEW.started_at,
                pg_current_xact_id(), NEW.attempts, NULL, NEW.lease_token, NULL);
    ELSE
        INSERT INTO soak_transition
            (job_id, old_state, new_state, at, xact_at, started_at, xid, attempts, old_token, new_token,
             cause)
        VALUES (NEW.id, OLD.state, NEW.state, clock_timestamp(), now(), NEW.started_at,
                pg_current_xact_id(), NEW.attempts, OLD.lease_token, NEW.lease_token,
                CASE WHEN jsonb_array_length(NEW.errors) > jsonb_array_length(OLD.errors)
                     THEN NEW.errors -> -1 ->> 'class' END);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER soak_log_insert AFTER INSERT ON dbqueue_job
    FOR EACH ROW EXECUTE FUNCTION soak_log_transition();
CREATE TRIGGER soak_log_update AFTER UPDATE OF state ON dbqueue_job
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION soak_log_transition();
"""

DROP = """
DROP TRIGGER IF EXISTS soak_log_update ON dbqueue_job;
DROP TRIGGER IF EXISTS soak_log_insert ON dbqueue_job;
DROP FUNCTION IF EXISTS soak_log_transition();
DROP TABLE IF EXISTS soak_witness, soak_transition, soak_effect, soak_run;
"""


class Migration(migrations.Migration):
    dependencies = [("django_dbqueue", "0014_wakeup_slots")]

    operations = [migrations.RunSQL(TABLES + TRIGGER, DROP)]
