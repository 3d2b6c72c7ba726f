"""The end of a claimed job: completion (batched, releasing workflow dependents), failure
(retry or dead letter), a cancelled end, an unknown type deferred, and the read-back of writes
whose reply was lost. Every write is fenced by the claim's lease token."""

import json

from ..connections import PlannedOnce
from ._db import _commit, _execute, dependents_free, int_array, text_array


def _channel():
    from ..conf import get_settings

    return get_settings().NOTIFY_CHANNEL


def complete(using, acks, *, async_commit=False, channel=None):
    """Mark ``[(id, token, result_json_or_None), ...]`` done; returns the set of ids that matched.

    An id missing from the result was fenced out: its lease was lost and the job claimed again
    (or an earlier try of this same write committed; :func:`read_back` tells). Jobs of a workflow
    that were waiting for these are released in the same statement, and the workers of their
    queues woken on ``channel`` (default ``DBQUEUE["NOTIFY_CHANNEL"]``).
    """
    if not acks:
        return set()
    statement = complete_statement(acks, async_commit=async_commit, channel=channel, wait=True)
    return completed_ids(_execute(using, *statement))


def complete_ending(using, acks, *, async_commit=False, channel=None):
    """:func:`complete`, returning ``{id: None}`` for a job done and ``{id: who}`` for one that
    ended cancelled (its cancel was asked for while it ran; ``''`` when nobody is recorded)."""
    if not acks:
        return {}
    statement = complete_statement(acks, async_commit=async_commit, channel=channel, wait=True)
    return completed_endings(_execute(using, *statement))


# Whether anybody waits for a result (wait_for_result, results.py): the waiter holds this
# advisory lock shared, at session level, on its LISTEN connection. A statement that finishes
# jobs tries it exclusively for an instant (the CASE fixes the order: unlock only what it took)
# and, where it fails, notifies "<NOTIFY_CHANNEL>.done" with the finished ids ('*' where they
# would not fit NOTIFY's 8000 bytes: "look again"), delivered at its commit. With nobody waiting that is two function calls per
# statement and no notification.
RESULT_LOCK = f"{0x64627133}, 0"  # class "dbq3" in ASCII, key 0
RESULT_WAITED = (
    f"CASE WHEN pg_try_advisory_lock({RESULT_LOCK}) THEN NOT pg_advisory_unlock({RESULT_LOCK})"
    " ELSE true END"
)


# Batched acknowledgement of successes. Fenced by (id, lease token) and state: a worker whose
# lease expired and whose job was claimed again matches nothing here, so it cannot overwrite the
# new holder's state. The ids it did not match come back missing from RETURNING. Committed like
# the claim (asynchronously with ASYNC_COMMIT: a completion lost in a crash only means the job
# runs again).
# Workflows (docs/workflows.md): the same statement releases the jobs waiting for the ones it
# completes, so "the last dependency is done -> the dependent is pending" commits with the
# completion or not at all, exactly once:
# - The dependents' ids come from the completed rows' own ``dependents`` column, as RETURNING
#   gives it from the newest row version: a completion that waited for the transaction of a
#   workflow adding a dependent to this job (it locks the row) still sees that dependent, which
#   an edge-table read with this statement's snapshot would miss.
# - Each dependent is locked once, in id order, and counts down by the number of its
#   dependencies completed here; two workers completing dependencies of the same jobs take the
#   locks in the same order (no deadlock), and the second one's UPDATE re-reads the row the first
#   one committed, so the counter goes down one completion after the other.
# - A dependent this statement cannot see at all was linked by a workflow whose commit (its
#   deferred trigger, migration 0015) ran while this statement waited for the completed row's
#   lock: its row is newer than this statement's snapshot. A dependent it sees ``cancelled``
#   may be coming back (a requeue of its failed dependency, in flight or committed since this
#   snapshot) and counting the dependency completed here as not done. ``late`` hands both to
#   dbqueue_release_late() (migration 0015), which locks them, waiting or cancelled, and whose
#   next statement sees every commit before that lock: it counts a waiting one's dependencies
#   again (the ones completed here counted as done). A requeue that comes after the lock sees
#   this completion committed. Dependents seen waiting are counted down here, under their lock,
#   and those seen in any other state (pending, running, finished) need nothing.
# - A job outside a workflow has no dependents (NULL): the CTEs after ``completed`` see no row,
#   and the function is not called.
# - A count written by hand lower than the dependencies completed here stops at 0 (the job is
#   released), rather than going negative: the CHECK on waiting_on would fail the whole batch,
#   every job in it, at every try (issue 35).
# Cancelling (docs/concepts/cancelling.md): a job whose cancel was asked for while it ran carries
# cancel_requested_at, and its success ends it ``cancelled`` with the result kept. One CASE on a
# column that is NULL for every other job, in the same statement, so the completion of an
# unmarked job costs what it did. Its dependents are not counted down here (``done`` is false):
# the workflow trigger of migration 0009 fires for its new state and cancels them (or releases
# those whose edge says run_on_failure), like for any other cancelled job.
# The result is one row (one value each to decode, as the claim's): the ids made done as a JSON
# array, the ids ended cancelled as a JSON object id -> who cancelled it ('' when nobody is
# recorded), NULL for none, how many queues were woken, and whether waiters of results were told
# (RESULT_WAITED).
# Planned once per session (connections.PlannedOnce). The states it matches, 'running' and
# 'waiting', are parameters so that a plan made without the values cannot use dbqueue_job_lease_idx
# or dbqueue_job_waiting_idx, partial indexes on those states: statistics taken while few jobs ran
# (or none waited) rate such an index at one row, and a plan made then would walk every running job
# for each completed one (every waiting job for each batch that releases a dependent) until the
# table is next analyzed (PostgreSQL plans it again then; autovacuum analyzes once a tenth of the
# rows changed, by default). The primary key, one probe per id, is the plan at every size
# (tests/integration/test_plans.py); the trigger's and dbqueue_release_late()'s statements, planned
# under the same mode, match theirs the same way (migration 0013). The join to unnest() alone did
# not make it so: a plan made on a table of a few hundred rows (a worker started before its queue
# filled) hashed the ids and walked the whole primary key, done rows included, at every batch
# (about 4x the server CPU per job; benchmarks/results/2026-12-06-drain-two-ways.md). Hence
# ``j.id = ANY(%(ids)s)`` beside the join, in ``completed`` and in ``mine``: an index condition on
# the primary key whatever the plan, as the claim's UPDATE has.
# Two texts (docs/concepts/worker.md#callers-transactions). The worker's batch (COMPLETE_HELD_JOBS,
# complete_statement) never waits for the row of a job it completes: ``mine`` locks them first
# with SKIP LOCKED, and a job whose row a caller's transaction holds (a select_for_update(), a
# signal or cancel whose deferred trigger ran early, a workflow linking a dependent to it) is
# left out; its id is missing from the answer, the worker reads it back (still running under
# this claim) and writes it again later, while every other job of the batch is done now. An
# atomic handler's own completion (COMPLETE_JOBS, complete_ending) runs on the handler's thread
# inside its transaction, and waits for the row as any statement there does.
_COMPLETE = """
WITH commit_mode AS MATERIALIZED (
    SELECT set_config('synchronous_commit'::text,
                      COALESCE(%(commit)s::text, current_setting('synchronous_commit'::text)),
                      true)
),{MINE}
completed AS (
    UPDATE dbqueue_job AS j
    SET state = CASE WHEN j.cancel_requested_at IS NULL THEN 'done' ELSE 'cancelled' END,
        finished_at = now(), leased_until = NULL, result = c.result::jsonb
    FROM ROWS FROM (pg_catalog.unnest(%(ids)s::bigint[]), pg_catalog.unnest(%(tokens)s::bigint[]),
                    pg_catalog.unnest(%(results)s::text[])) AS c(id, token, result),
         commit_mode
    WHERE j.id = ANY(%(ids)s::bigint[])
      AND j.id = c.id AND j.lease_token = c.token AND j.state::text = %(running)s::text{ONLY_MINE}
    RETURNING j.id, j.dependents, j.cancel_requested_at IS NULL AS done, j.cancelled_by
),
counts AS MATERIALIZED (
    SELECT d.id, count(*) AS n
    FROM completed AS c CROSS JOIN LATERAL pg_catalog.unnest(c.dependents) AS d(id)
    WHERE c.done
    GROUP BY d.id
),
locked AS MATERIALIZED (
    SELECT j.id FROM dbqueue_job AS j
    WHERE j.id IN (SELECT id FROM counts) AND j.state::text = %(waiting)s::text
    ORDER BY j.id
    FOR NO KEY UPDATE
),
released AS (
    UPDATE dbqueue_job AS d
    SET waiting_on = GREATEST(d.waiting_on - n.n, 0),
        state = CASE WHEN d.waiting_on <= n.n THEN 'pending' ELSE 'waiting' END,
        run_after = CASE WHEN d.waiting_on <= n.n THEN GREATEST(d.run_after, now())
                         ELSE d.run_after END
    FROM counts AS n
    WHERE d.id = n.id AND d.id IN (SELECT id FROM locked) AND d.state::text = %(waiting)s::text
    RETURNING d.queue::text AS queue, d.state::text AS state
),
late AS (
    SELECT f.queue
    FROM (
        SELECT pg_catalog.array_agg(c.id) AS ids FROM counts AS c
        WHERE NOT EXISTS (SELECT 1 FROM dbqueue_job AS v
                          WHERE v.id = c.id AND v.state::text <> 'cancelled')
    ) AS unseen
    CROSS JOIN LATERAL dbqueue_release_late(unseen.ids, ARRAY(SELECT id FROM completed
                                                              WHERE done)) AS f(queue)
    WHERE unseen.ids IS NOT NULL
)
SELECT (SELECT pg_catalog.json_agg(id) FROM completed WHERE done)::text,
       (SELECT pg_catalog.json_object_agg(id, COALESCE(cancelled_by::text, ''))
        FROM completed WHERE NOT done)::text,
       (SELECT pg_catalog.count(pg_notify(%(channel)s::text, queue))
        FROM (SELECT queue FROM released WHERE state = 'pending' UNION SELECT queue FROM late)
             AS woken),
       (SELECT pg_catalog.count(pg_notify(%(channel)s::text || '.done', finished))
        FROM (SELECT CASE WHEN sum(length(id::text) + 1) > 7000 THEN '*'
                          ELSE pg_catalog.string_agg(id::text, ','::text) END
              FROM completed HAVING count(*) > 0) AS f(finished)
        WHERE {RESULT_WAITED})
""".replace("{RESULT_WAITED}", RESULT_WAITED)

_MINE = """
mine AS MATERIALIZED (
    SELECT j.id, j.dependents
    FROM ROWS FROM (pg_catalog.unnest(%(ids)s::bigint[]), pg_catalog.unnest(%(tokens)s::bigint[]))
        AS m(id, token)
    JOIN dbqueue_job AS j ON j.id = m.id AND j.lease_token = m.token
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state::text = %(running)s::text
    ORDER BY j.id
    FOR NO KEY UPDATE OF j SKIP LOCKED
),
{FREE},""".replace("{FREE}", dependents_free("true"))
COMPLETE_JOBS = _COMPLETE.replace("{MINE}", "").replace("{ONLY_MINE}", "")  # not on a Session
COMPLETE_HELD_JOBS = PlannedOnce(
    _COMPLETE.replace("{MINE}", _MINE).replace(
        "{ONLY_MINE}", "\n      AND c.id IN (SELECT id FROM free)"
    )
)


def complete_statement(acks, *, async_commit=False, channel=None, wait=False):
    """The worker's batched completion (COMPLETE_HELD_JOBS: a job whose row another transaction
    holds is left out, not waited for) and its parameters, for a Session's
    ``execute_pipelined``; with ``wait``, :func:`complete`'s (COMPLETE_JOBS)."""
    if channel is None:
        from ..conf import get_settings

        channel = get_settings().NOTIFY_CHANNEL
    ids, tokens, results = zip(*acks, strict=True)
    params = {
        "ids": int_array(ids),
        "tokens": int_array(tokens),
        "results": text_array(results),
        "running": "running",
        "waiting": "waiting",
        "commit": _commit(async_commit),
        "channel": channel,
    }
    return (COMPLETE_JOBS if wait else COMPLETE_HELD_JOBS), params


def completed_ids(rows):
    return set(completed_endings(rows))


def completed_endings(rows):
    """``{id: None}`` for each job a completion made done, ``{id: who}`` for each it ended
    ``cancelled`` (its cancel was asked for while it ran; ``''`` when nobody is recorded)."""
    if not rows:
        return {}
    done, cancelled = rows[0][0], rows[0][1]
    endings = dict.fromkeys(json.loads(done)) if done is not None else {}
    if cancelled is not None:
        endings.update((int(job_id), who) for job_id, who in json.loads(cancelled).items())
    return endings


def fail(using, *, job_id, token, error, delay, dead=False):
    """Record a failed attempt: retry after ``delay`` seconds, or dead (spent or ``dead=True``),
    or cancelled when a cancel was asked for while it ran.

    Returns the new state, or ``None`` when the write was fenced out. Always a durable commit.
    """
    ended = fail_job(using, job_id=job_id, token=token, error=error, delay=delay, dead=dead)
    return ended[0] if ended else None


def _one_mine(columns):
    """The CTE ``mine``: one running job's row under this lease, locked unless another
    transaction holds it (then it is nothing)."""
    return f"""
WITH mine AS MATERIALIZED (
    SELECT {columns} FROM dbqueue_job
    WHERE id = %(id)s::bigint AND lease_token = %(token)s::bigint AND state::text = 'running'
    FOR NO KEY UPDATE SKIP LOCKED
)"""


# One failure: back to pending after a delay, or dead when the attempts are spent or the handler
# asked for no retry. Fenced like COMPLETE_JOBS. The error entry gets its time from the database.
# A job whose cancel was asked for while it ran ends cancelled instead, its error kept: a
# cancelled job is neither retried nor a dead letter (docs/concepts/cancelling.md). No timestamp
# comes back: a dead job keeps its run_after, which may be one Python cannot read (a row written
# by hand that the worker fails as unreadable), and a typed one would fail the reply.
# The worker writes it on its only connection: the row is locked first with SKIP LOCKED, so a
# row a caller's transaction holds matches nothing instead of holding up every other lease; the
# worker reads it back (still running under this claim) and writes it again later. On a worker's
# Session (FAIL_HELD_JOB) the same for a dead or cancelled end whose workflow dependent another
# transaction holds (DEPENDENTS_FREE); through Django's connection (store.fail) that waits.
# The write both share; {FROM} is the CTE that names the row: mine, or free (its dependents not
# held).
_FAIL = """
UPDATE dbqueue_job
SET state = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                 WHEN %(dead)s::boolean OR attempts >= max_attempts THEN 'dead'
                 ELSE 'pending' END,
    finished_at = CASE WHEN cancel_requested_at IS NOT NULL OR %(dead)s::boolean
                            OR attempts >= max_attempts THEN now() END,
    run_after = CASE WHEN cancel_requested_at IS NOT NULL OR %(dead)s::boolean
                          OR attempts >= max_attempts
                     THEN run_after ELSE now() + %(delay)s::float8 * interval '1 second' END,
    leased_until = NULL,
    errors = errors || pg_catalog.jsonb_build_array(
        %(error)s::jsonb || pg_catalog.jsonb_build_object('at'::text, now()))
WHERE id = (SELECT id FROM {FROM})
RETURNING state, cancelled_by,
          CASE WHEN state::text <> 'pending' AND {RESULT_WAITED}
               THEN pg_notify(%(channel)s::text || '.done', id::text) END
""".replace("{RESULT_WAITED}", RESULT_WAITED)
FAIL_JOB = _one_mine("id") + _FAIL.replace("{FROM}", "mine")
# On a worker's Session (acks.py), the same without waiting for a dependent (DEPENDENTS_FREE).
FAIL_HELD_JOB = (
    _one_mine(
        "id, dependents, cancel_requested_at IS NOT NULL OR %(dead)s::boolean"
        " OR attempts >= max_attempts AS ending"
    )
    + ",\n"
    + dependents_free("m.ending")
    + _FAIL.replace("{FROM}", "free")
)


def fail_job(using, *, job_id, token, error, delay, dead=False):
    """:func:`fail`, returning ``(state, cancelled_by)``, or ``None`` when fenced out."""
    rows = _execute(
        using,
        FAIL_JOB if isinstance(using, str) else FAIL_HELD_JOB,
        {
            "id": job_id,
            "token": token,
            "error": json.dumps(error),
            "delay": float(delay),
            "dead": bool(dead),
            "channel": _channel(),
        },
    )
    return (rows[0][0], rows[0][1]) if rows else None


# A run that stopped because it was cancelled: the handler raised JobCancelled (through
# ctx.raise_if_cancelled() or of its own accord: then "handler" is recorded as who cancelled
# it), an async handler's task was cancelled, or the worker learned of the cancel before the
# run started and never started it. Fenced like the rest; durable like a failure. SKIP LOCKED
# like FAIL_JOB.
_END_CANCELLED = """
UPDATE dbqueue_job
SET state = 'cancelled', finished_at = now(), leased_until = NULL,
    cancel_requested_at = COALESCE(cancel_requested_at, now()),
    cancelled_by = COALESCE(cancelled_by::text, %(by)s::text)
WHERE id = (SELECT id FROM {FROM})
RETURNING state, cancelled_by,
          CASE WHEN {RESULT_WAITED} THEN pg_notify(%(channel)s::text || '.done', id::text) END
""".replace("{RESULT_WAITED}", RESULT_WAITED)
END_CANCELLED = _one_mine("id") + _END_CANCELLED.replace("{FROM}", "mine")
# On a worker's Session (acks.py), the same without waiting for a dependent (DEPENDENTS_FREE).
END_CANCELLED_HELD = (
    _one_mine("id, dependents")
    + ",\n"
    + dependents_free("true")
    + _END_CANCELLED.replace("{FROM}", "free")
)


def end_cancelled(using, *, job_id, token, by="handler"):
    """End a run that stopped because it was cancelled (or never started for that reason):
    ``cancelled``, fenced. ``by`` is recorded unless a cancel request already named someone.
    Returns who cancelled it, or ``None`` when the write was fenced out. A durable commit."""
    params = {"id": job_id, "token": token, "by": by, "channel": _channel()}
    statement = END_CANCELLED if isinstance(using, str) else END_CANCELLED_HELD
    rows = _execute(using, statement, params)
    return (rows[0][1] or "") if rows else None


# A claimed job whose type this worker has no handler for. During a rolling deploy a worker still
# on the old code can claim a job of a type only the new code knows: it goes back to pending
# without spending the attempt, after %(delay)s seconds, for a worker that knows it. A job that
# has existed for longer than %(grace)s seconds is not waiting for a deploy (its handler was
# removed or renamed): it is dead at once. Either way the error is recorded.
# A job whose cancel was asked for meanwhile ends cancelled.
DEFER_UNKNOWN_TYPE = """
UPDATE dbqueue_job
SET state = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'
                 WHEN created_at < now() - %(grace)s::float8 * interval '1 second'
                 THEN 'dead' ELSE 'pending' END,
    finished_at = CASE WHEN cancel_requested_at IS NOT NULL
                            OR created_at < now() - %(grace)s::float8 * interval '1 second'
                       THEN now() END,
    attempts = CASE WHEN cancel_requested_at IS NOT NULL
                         OR created_at < now() - %(grace)s::float8 * interval '1 second'
                    THEN attempts ELSE GREATEST(attempts - 1, 0) END,
    run_after = CASE WHEN cancel_requested_at IS NOT NULL
                          OR created_at < now() - %(grace)s::float8 * interval '1 second'
                     THEN run_after
                     ELSE now() + %(delay)s::float8 * interval '1 second' END,
    leased_until = NULL,
    errors = errors || pg_catalog.jsonb_build_array(
        %(error)s::jsonb || pg_catalog.jsonb_build_object('at'::text, now()))
WHERE id = %(id)s::bigint AND lease_token = %(token)s::bigint AND state::text = 'running'
RETURNING state, run_after
"""


def defer_unknown_type(using, *, job_id, token, error, delay, grace):
    """A job whose type this worker cannot run: back to pending without spending the attempt, or
    dead when older than ``grace`` seconds. Returns the new state, or ``None`` when fenced."""
    params = {
        "id": job_id,
        "token": token,
        "error": json.dumps(error),
        "delay": float(delay),
        "grace": float(grace),
    }
    rows = _execute(using, DEFER_UNKNOWN_TYPE, params)
    return rows[0][0] if rows else None


# What became of jobs a write did not match: a retried acknowledgement whose first try committed
# but whose reply was lost matches nothing the second time. The token tells whether the row's
# last write was this run's own (the sweeper and releases clear it).
READ_BACK_JOBS = """
SELECT id, state, lease_token FROM dbqueue_job WHERE id = ANY(%(ids)s::bigint[])
"""


def read_back(using, ids):
    """``{id: (state, lease_token)}`` of the jobs that still exist."""
    rows = _execute(using, READ_BACK_JOBS, {"ids": list(ids)})
    return {job_id: (state, token) for job_id, state, token in rows}


# A run that snoozed (``Snooze``) or began a durable wait (ctx.sleep, ctx.wait_for_signal): back
# to pending without spending the attempt, due at %(until)s (a database time) or, for a wait on
# signals, at once when a signal came after the run looked (%(seen)s: the job's signal_seq the
# run saw; signal_job bumps it on the row itself, so this reads the newest value even when it
# waited for that commit). A snooze counts against MAX_SNOOZES (%(counts)s). A wait records
# what it waits for, valid while wait_token = lease_token (the next claim changes the token).
# The lease token stays, as a failure's does. A job whose cancel was asked for ends cancelled.
# A snooze past %(max)s (MAX_SNOOZES) matches nothing: the caller records a failure instead.
SNOOZE_JOB = """
UPDATE dbqueue_job
SET state = CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE 'pending' END,
    finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN now() END,
    attempts = CASE WHEN cancel_requested_at IS NOT NULL THEN attempts
                    ELSE GREATEST(attempts - 1, 0) END,
    run_after = CASE WHEN cancel_requested_at IS NOT NULL THEN run_after
                     WHEN %(seen)s::int IS NOT NULL AND signal_seq <> %(seen)s::int THEN now()
                     ELSE GREATEST(now(), COALESCE(%(until)s::timestamptz,
                                                   now() + %(delay)s::float8 * interval '1 second'))
                END,
    snoozes = snoozes + CASE WHEN %(counts)s::boolean THEN 1 ELSE 0 END,
    wait_reason = %(reason)s::text,
    wait_token = CASE WHEN %(reason)s::text IS NULL THEN NULL ELSE lease_token END,
    leased_until = NULL
WHERE id = %(id)s::bigint AND lease_token = %(token)s::bigint AND state::text = 'running'
  AND (NOT %(counts)s::boolean OR snoozes < %(max)s::int OR cancel_requested_at IS NOT NULL)
RETURNING state, run_after, cancelled_by, EXTRACT(EPOCH FROM run_after - now())::float8
"""


def snooze(using, *, job_id, token, until=None, delay=0.0, counts, limit, reason=None, seen=None):
    """Write a snooze or a durable wait (:data:`SNOOZE_JOB`): ``(state, run_after,
    cancelled_by, seconds until it is due)``, or ``None`` when fenced out or past ``limit``
    snoozes."""
    params = {
        "id": job_id,
        "token": token,
        "until": until,
        "delay": float(delay),
        "max": int(limit),
        "counts": bool(counts),
        "reason": reason,
        "seen": seen,
    }
    rows = _execute(using, SNOOZE_JOB, params)
    return rows[0] if rows else None
