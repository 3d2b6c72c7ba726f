# Workflows whatever the interleaving (docs/workflows.md, "What the promise survives"; issue 25).
#
# 1. A dependent's ``waiting_on`` is recounted, never counted down, by everything but the
#    completion. The trigger used to count a dead dependency of an ``on_failure="run"``
#    dependent as satisfied by decrementing it each time it died, and a requeue gave nothing
#    back to a dependent still waiting: dead, requeued, done counted the same edge twice (the
#    dependent ran while another dependency never had). dbqueue_settle_dependents() now counts
#    a waiting dependent's unsatisfied edges afresh (not done, and not dead or cancelled under
#    run_on_failure), on every death, cancel and requeue of one of its dependencies: the count
#    is a function of the states, whatever the sequence that led to them. The completion
#    (store.completion.COMPLETE_JOBS) still counts down by the dependencies it completes: under the
#    dependent's row lock, from the newest version, which a recount made before it could only
#    have made with those dependencies not done (they were this completion's, uncommitted).
# 2. The recount and every change to a dependent happen under the dependent's row lock, taken
#    first (in id order), with a statement of its own after it: a plpgsql statement takes a new
#    snapshot, so it sees every transaction that held the lock before. A dependent that is
#    cancelled when they look is locked too: a requeue in flight may be bringing it back
#    (cancelled -> waiting), and a death or completion that skipped it without its lock left a
#    requeue counting that dependency as not finished, forever (the requeue counted in its
#    snapshot, the other skipped the dependent in its own). Whichever takes the lock second
#    sees the first one's commit. dbqueue_release_late() (called by the completion for the
#    dependents it cannot see, and now also for those it sees cancelled) locks them the same way.
# 3. No caller's transaction holds the row of a running job (a workflow's existing dependency,
#    a job being cancelled) for longer than its own COMMIT. The worker holding the job writes
#    that row in its heartbeat (which covers all its jobs), its completion and its claims' ack
#    flushes: a lock held until a long ``atomic()`` ends froze its loop, and past the lease had
#    every job of the worker swept and run again. The caller's statement now writes only new
#    rows; the write to the existing row is a row of its own in an UNLOGGED table (it never
#    outlives its transaction: a crash rolls it back with the rest, so it needs no WAL), whose
#    CONSTRAINT TRIGGER, DEFERRABLE INITIALLY DEFERRED, applies it at the caller's COMMIT and
#    deletes it. The lock lives from then until the commit is through.
#    - dbqueue_link_at_commit: an edge to a job already in the table (INSERT_WORKFLOW). At
#      commit, dbqueue_apply_link() appends the dependent to that job's ``dependents`` (an
#      UPDATE: it waits for a completion or death in flight, then reads the row's newest
#      version) and settles the dependent against the state it returns: dead or cancelled
#      cancels it (unless run_on_failure), anything else recounts it. A completion that
#      committed first is seen there; one that comes after reads ``dependents`` as before.
#    - dbqueue_cancel_at_commit: a cancel of a job that is running (or that was pending or
#      waiting in CANCEL_JOBS' snapshot and is not any more). At commit, dbqueue_apply_cancel()
#      does what CANCEL_JOBS did to it: marks it if it runs, cancels it if it waits or is
#      pending, leaves it if it has finished.
#    The triggers fire at COMMIT (or at ``SET CONSTRAINTS ... IMMEDIATE``), in the order the
#    rows were written: by dependency id, then job id.
# Functions are given in full; the reverse puts migration 0013's versions back.

import importlib

from django.db import migrations

_PLANS_BY_KEY = importlib.import_module("django_dbqueue.migrations.0013_workflow_plans_by_key")

# A waiting dependent's dependencies that do not let it run yet: not done, and not finished
# one way or the other under on_failure="run". A pruned dependency (missing) lets it run.
_UNSATISFIED = """(
            SELECT count(*) FROM dbqueue_dependency AS e2
            JOIN dbqueue_job AS p ON p.id = e2.depends_on_id
            WHERE e2.job_id = {job} AND p.state <> 'done'
              AND NOT (e2.run_on_failure AND p.state IN ('dead', 'cancelled')))"""

# Every state test in a WHERE clause is a constant variable, a parameter to the planner, so that
# a generic plan goes by primary key, not by a partial index of a state (migration 0013).
SETTLE_DEPENDENTS = """
CREATE OR REPLACE FUNCTION dbqueue_settle_dependents() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    woken text[];
    s_waiting CONSTANT text := 'waiting';
    s_dead CONSTANT text := 'dead';
    s_cancelled CONSTANT text := 'cancelled';
BEGIN
    -- The dependents this change concerns, locked in id order before anything reads them: the
    -- statements below take their snapshots after every transaction that held one committed.
    PERFORM 1 FROM dbqueue_job
    WHERE id IN (SELECT job_id FROM dbqueue_dependency WHERE depends_on_id = NEW.id)
      AND state IN (s_waiting, s_cancelled)
    ORDER BY id
    FOR NO KEY UPDATE;
    IF NEW.state IN ('dead', 'cancelled') THEN
        UPDATE dbqueue_job AS d
        SET state = 'cancelled', waiting_on = 0, finished_at = now(),
            errors = d.errors || jsonb_build_array(jsonb_build_object(
                'attempt', d.attempts,
                'class', 'DependencyFailed',
                'message', 'dependency #' || NEW.id || ' (' || NEW.type || ') is '
                           || NEW.state || '; cancelled without running',
                'traceback', '',
                'worker', NULL,
                'dependency', NEW.id,
                'at', now()))
        FROM dbqueue_dependency AS e
        WHERE e.depends_on_id = NEW.id AND d.id = e.job_id AND d.state = s_waiting
          AND NOT e.run_on_failure;
    ELSIF OLD.state IN ('dead', 'cancelled') AND NEW.state IN ('pending', 'waiting') THEN
        UPDATE dbqueue_job AS d
        SET state = 'waiting', finished_at = NULL,
            waiting_on = {unsatisfied_d},
            errors = d.errors || jsonb_build_array(jsonb_build_object(
                'attempt', d.attempts,
                'class', 'DependencyRequeued',
                'message', 'dependency #' || NEW.id || ' (' || NEW.type || ') was requeued; '
                           || 'waiting for it again',
                'traceback', '',
                'worker', NULL,
                'requeued', true,
                'dependency', NEW.id,
                'at', now()))
        FROM dbqueue_dependency AS e
        WHERE e.depends_on_id = NEW.id AND d.id = e.job_id AND d.state = s_cancelled
          AND d.errors -> -1 ->> 'class' = 'DependencyFailed'
          AND NOT EXISTS (
              SELECT 1 FROM dbqueue_dependency AS e3
              JOIN dbqueue_job AS p3 ON p3.id = e3.depends_on_id
              WHERE e3.job_id = d.id AND NOT e3.run_on_failure
                AND p3.state IN (s_dead, s_cancelled));
    ELSE
        RETURN NULL;
    END IF;
    -- Those still waiting (an on_failure="run" edge: this dependency finished, or is back)
    -- count their unsatisfied dependencies again; none left makes them pending, due now.
    WITH recounted AS MATERIALIZED (
        SELECT d.id, {unsatisfied_d} AS n
        FROM dbqueue_job AS d
        WHERE d.id IN (SELECT job_id FROM dbqueue_dependency WHERE depends_on_id = NEW.id)
          AND d.state = s_waiting
    ),
    released AS (
        UPDATE dbqueue_job AS d
        SET waiting_on = r.n,
            state = CASE WHEN r.n = 0 THEN 'pending' ELSE 'waiting' END,
            run_after = CASE WHEN r.n = 0 THEN GREATEST(d.run_after, now()) ELSE d.run_after END
        FROM recounted AS r
        WHERE d.id = r.id AND d.waiting_on <> r.n
        RETURNING d.queue, d.state
    )
    SELECT array_agg(DISTINCT queue) FILTER (WHERE state = 'pending') INTO woken
    FROM released;
    IF woken IS NOT NULL THEN
        PERFORM pg_notify(TG_ARGV[0], q) FROM unnest(woken) AS q;
    END IF;
    RETURN NULL;
END
$fn$;
""".replace("{unsatisfied_d}", _UNSATISFIED.format(job="d.id"))

RELEASE_LATE = """
CREATE OR REPLACE FUNCTION dbqueue_release_late(unseen bigint[], completing bigint[])
RETURNS SETOF text LANGUAGE plpgsql STRICT AS $fn$
DECLARE
    s_waiting CONSTANT text := 'waiting';
    s_cancelled CONSTANT text := 'cancelled';
BEGIN
    PERFORM 1 FROM dbqueue_job WHERE id = ANY(unseen) AND state IN (s_waiting, s_cancelled)
    ORDER BY id FOR NO KEY UPDATE;
    RETURN QUERY
    WITH recounted AS (
        SELECT d.id, (
            SELECT count(*) FROM dbqueue_dependency AS e
            JOIN dbqueue_job AS p ON p.id = e.depends_on_id
            WHERE e.job_id = d.id AND p.state <> 'done' AND NOT (p.id = ANY(completing))
              AND NOT (e.run_on_failure AND p.state IN ('dead', 'cancelled'))
        ) AS n
        FROM dbqueue_job AS d
        WHERE d.id = ANY(unseen) AND d.state = s_waiting
    ),
    released AS (
        UPDATE dbqueue_job AS d
        SET waiting_on = r.n,
            state = CASE WHEN r.n = 0 THEN 'pending' ELSE 'waiting' END,
            run_after = CASE WHEN r.n = 0 THEN GREATEST(d.run_after, now()) ELSE d.run_after END
        FROM recounted AS r
        WHERE d.id = r.id
        RETURNING d.queue, d.state
    )
    SELECT DISTINCT queue::text FROM released WHERE state = 'pending';
END
$fn$;
"""

AT_COMMIT = """
CREATE UNLOGGED TABLE dbqueue_link_at_commit (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL,
    depends_on_id bigint NOT NULL,
    run_on_failure boolean NOT NULL
);
CREATE UNLOGGED TABLE dbqueue_cancel_at_commit (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL,
    cancelled_by varchar(200)
);

CREATE FUNCTION dbqueue_apply_link() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    dep_state text;
    dep_type text;
    woken text;
    s_waiting CONSTANT text := 'waiting';
BEGIN
    DELETE FROM dbqueue_link_at_commit WHERE id = NEW.id;
    -- Waits for a transaction changing the dependency, then appends to its newest version.
    UPDATE dbqueue_job SET dependents = COALESCE(dependents, '{}') || NEW.job_id
    WHERE id = NEW.depends_on_id
    RETURNING state, type INTO dep_state, dep_type;
    IF dep_state IN ('dead', 'cancelled') AND NOT NEW.run_on_failure THEN
        UPDATE dbqueue_job AS d
        SET state = 'cancelled', waiting_on = 0, finished_at = now(),
            errors = d.errors || jsonb_build_array(jsonb_build_object(
                'attempt', d.attempts,
                'class', 'DependencyFailed',
                'message', 'dependency #' || NEW.depends_on_id || ' (' || dep_type || ') is '
                           || dep_state || '; cancelled without running',
                'traceback', '',
                'worker', NULL,
                'dependency', NEW.depends_on_id,
                'at', now()))
        WHERE d.id = NEW.job_id AND d.state = s_waiting;
        RETURN NULL;
    END IF;
    UPDATE dbqueue_job AS d
    SET waiting_on = r.n,
        state = CASE WHEN r.n = 0 THEN 'pending' ELSE 'waiting' END,
        run_after = CASE WHEN r.n = 0 THEN GREATEST(d.run_after, now()) ELSE d.run_after END
    FROM (SELECT {unsatisfied_new} AS n) AS r
    WHERE d.id = NEW.job_id AND d.state = s_waiting AND d.waiting_on <> r.n
    RETURNING CASE WHEN r.n = 0 THEN d.queue END INTO woken;
    IF woken IS NOT NULL THEN
        PERFORM pg_notify(TG_ARGV[0], woken);
    END IF;
    RETURN NULL;
END
$fn$;

CREATE CONSTRAINT TRIGGER dbqueue_apply_link
AFTER INSERT ON dbqueue_link_at_commit
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW EXECUTE FUNCTION dbqueue_apply_link('dbqueue');

CREATE FUNCTION dbqueue_apply_cancel() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM dbqueue_cancel_at_commit WHERE id = NEW.id;
    UPDATE dbqueue_job AS j
    SET state = CASE WHEN j.state = 'running' THEN 'running' ELSE 'cancelled' END,
        finished_at = CASE WHEN j.state = 'running' THEN NULL ELSE now() END,
        waiting_on = 0,
        cancel_requested_at = COALESCE(j.cancel_requested_at, now()),
        cancelled_by = COALESCE(j.cancelled_by, NEW.cancelled_by)
    WHERE j.id = NEW.job_id AND j.state IN ('pending', 'waiting', 'running');
    RETURN NULL;
END
$fn$;

CREATE CONSTRAINT TRIGGER dbqueue_apply_cancel
AFTER INSERT ON dbqueue_cancel_at_commit
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW EXECUTE FUNCTION dbqueue_apply_cancel();
""".replace("{unsatisfied_new}", _UNSATISFIED.format(job="NEW.job_id"))

DROP_AT_COMMIT = """
DROP TABLE IF EXISTS dbqueue_link_at_commit;
DROP TABLE IF EXISTS dbqueue_cancel_at_commit;
DROP FUNCTION IF EXISTS dbqueue_apply_link();
DROP FUNCTION IF EXISTS dbqueue_apply_cancel();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0014_wakeup_slots"),
    ]

    operations = [
        migrations.RunSQL(
            sql=SETTLE_DEPENDENTS + RELEASE_LATE + AT_COMMIT,
            reverse_sql=DROP_AT_COMMIT
            + _PLANS_BY_KEY.SETTLE_BY_KEY
            + _PLANS_BY_KEY.RELEASE_LATE_BY_KEY,
        ),
    ]
