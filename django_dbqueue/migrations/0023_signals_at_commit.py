"""Signals bump their job at commit, not at ``signal_job()``.

``signal_job()`` used to update the job's row (``signal_seq``, and ``run_after`` for a job that
waits for that signal) in the caller's transaction, holding the row's lock until the caller
committed. The worker's heartbeat renews every lease of the worker in one statement, so a
sender's transaction left open stalled the heartbeat of every job of the worker that ran the
signalled job, and past the lease those jobs could be taken back and run twice.

Now ``signal_job()`` only inserts the signal (numbered under an advisory lock of the job, which
orders concurrent senders to one job and nothing else), and this deferred trigger makes the
row's change at the sender's COMMIT, when the signal becomes visible: the row is locked for that
instant only. The race with a run writing its wait is unchanged in substance: the signal and the
bump of ``signal_seq`` become visible together; a wait written before the commit is found by the
trigger (the job is made due), and a wait written after it reads the new ``signal_seq`` (the
wait's statement sees that it changed and is due at once) or waits for the trigger's row lock
and re-reads it. The full text of what is installed is here.
"""

from django.db import migrations

FORWARD = """
CREATE FUNCTION dbqueue_apply_signal() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    UPDATE dbqueue_job
    SET signal_seq = signal_seq + 1,
        run_after = CASE WHEN state = 'pending' AND wait_reason = 'signal:' || NEW.name
                              AND wait_token = lease_token THEN LEAST(run_after, now())
                         ELSE run_after END
    WHERE id = NEW.job_id AND state NOT IN ('done', 'dead', 'cancelled');
    RETURN NULL;
END
$fn$;

CREATE CONSTRAINT TRIGGER dbqueue_apply_signal
AFTER INSERT ON dbqueue_signal
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW EXECUTE FUNCTION dbqueue_apply_signal();
"""

REVERSE = """
DROP TRIGGER IF EXISTS dbqueue_apply_signal ON dbqueue_signal;
DROP FUNCTION IF EXISTS dbqueue_apply_signal();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0022_sql_enqueue"),
    ]

    operations = [migrations.RunSQL(FORWARD, REVERSE)]
