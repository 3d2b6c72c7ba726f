"""The bodies of durable steps (type ``soak-steps``, benchmarks/soakapp/jobs.py).

- ``soak_step_body``: one row when a step's body starts (``start``) and one as the last thing
  it does before it returns (``end``), each written by the handler on its own recording
  connection in autocommit (never the job's connection, which the soak terminates), with
  ``now()``: the database's clock, as the step's record in ``dbqueue_step`` has it
  (``finished_at``). ``run_id`` is the handler run's ``soak_run`` row, so the checker knows
  whose body it was: its worker, whether it died, whether its lease was taken over.

Plain SQL, as 0001: nothing but the soak reads or writes it.
"""

from django.db import migrations

TABLE = """
CREATE TABLE soak_step_body (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    run_id bigint NOT NULL,
    name text NOT NULL,
    occurrence integer NOT NULL,
    attempt integer NOT NULL,
    phase text NOT NULL CHECK (phase IN ('start', 'end')),
    at timestamptz NOT NULL
);
CREATE INDEX soak_step_body_job_idx ON soak_step_body (job_id, name, occurrence);
"""

DROP = "DROP TABLE IF EXISTS soak_step_body;"


class Migration(migrations.Migration):
    dependencies = [("soakapp", "0001_initial"), ("django_dbqueue", "0020_steps")]

    operations = [migrations.RunSQL(TABLE, DROP)]
