"""Durable waits and signals (type ``soak-waits``, benchmarks/soakapp/jobs.py).

- ``soak_wait``: one row per call of ``ctx.sleep``, ``ctx.wait_for_signal`` or a snooze in a
  ``soak-waits`` handler, written by the handler on its own recording connection in autocommit
  (as ``soak_step_body``) once the call returned or raised: its run (``soak_run``), attempt, the
  wait's name and occurrence, what came of it (``slept``, ``signal`` with the payload in
  ``value``, ``timeout``, ``suspend``: the run ended at the wait, ``snooze``, or ``raised
  <class>``), ``began_at``, the database's clock read just before the call, and ``at``, after.
- ``soak_signal``: one row per ``signal_job`` call of the soak's producer, inserted in the
  sender's transaction after the call (so it commits with the signal, or not at all): the job,
  the unique number sent as the payload (``value``), the signal's number among the job's
  signals of its name that ``signal_job`` returned (``seq``; NULL: the job had finished,
  nothing stored), how long the transaction was held open after it (``held``), and
  ``committed_by``: the database's clock read on the sender's connection after its commit
  returned (the signal was visible to every snapshot taken after it).

Plain SQL, as 0001: nothing but the soak reads or writes them.
"""

from django.db import migrations

TABLES = """
CREATE TABLE soak_wait (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    run_id bigint,
    attempt integer NOT NULL,
    kind text NOT NULL CHECK (kind IN ('sleep', 'signal', 'snooze')),
    name text NOT NULL,
    occurrence integer NOT NULL,
    outcome text NOT NULL,
    value bigint,
    began_at timestamptz NOT NULL,
    at timestamptz NOT NULL
);
CREATE INDEX soak_wait_job_idx ON soak_wait (job_id, name, occurrence);

CREATE TABLE soak_signal (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    name text NOT NULL,
    value bigint NOT NULL UNIQUE,
    seq integer,
    held real NOT NULL DEFAULT 0,
    sent_at timestamptz NOT NULL,
    committed_by timestamptz
);
CREATE INDEX soak_signal_job_idx ON soak_signal (job_id, name, seq);
"""

DROP = "DROP TABLE IF EXISTS soak_signal, soak_wait;"


class Migration(migrations.Migration):
    dependencies = [
        ("soakapp", "0002_step_bodies"),
        ("django_dbqueue", "0021_snoozes_waits_signals"),
    ]

    operations = [migrations.RunSQL(TABLES, DROP)]
