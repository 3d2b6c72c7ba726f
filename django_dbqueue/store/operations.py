"""Operator actions over explicit ids (requeue, run now, cancel, delete), the dead jobs,
retention's pruning, the status counts per queue and state, and one job's status with its
steps (the admin's job page, ``jobqueue_status --job``)."""

from django.db import IntegrityError, transaction

from ._db import _execute, time_columns, time_or_text
from .jobs import _unique_held

REQUEUE_TRIES = 3  # a holder of a unique key enqueued during the requeue: read again, retry

# Each takes explicit ids and moves only the rows whose state allows it; the caller reports how
# many moved and how many were left alone. Requeue and run-now return each job's queue, for the
# wake-up their callers send after the commit (store/wakeups.py NOTIFY).

# Dead or cancelled -> pending, attempts reset. The error history stays: it is the record of
# what went wrong, and the next failures are appended after it. A "Requeued" entry marks where
# the history starts again at attempt 1 (SET reads the row's old state and attempts); it has
# the shape of an error entry, so that everything listing errors shows it as it is. The cancel
# mark goes (a pending job carries none); who cancelled it stays in that entry's message.
#
# Unique keys: a requeued job would take its unique key again if it is "active" or never
# started. It is left alone (its key is reported by REQUEUE_BLOCKED_BY_UNIQUE) when another job
# holds the key now, or when a newer job of the same selection with the same key is requeued in
# its place: two live jobs with one key would break the promise, and clearing the key would run
# a duplicate silently. A holder enqueued concurrently can still make the unique index refuse the
# UPDATE; store.requeue() then tries again, and this test sees the holder.
REQUEUE_JOBS = (
    """
UPDATE dbqueue_job AS j
SET state = 'pending', attempts = 0, run_after = now(), finished_at = NULL,
    leased_until = NULL, worker_id = NULL, cancel_requested_at = NULL, cancelled_by = NULL,
    snoozes = 0, wait_reason = NULL, wait_token = NULL,
    errors = errors || pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
        'attempt', attempts,
        'class', 'Requeued',
        'message', 'requeued from ' || state::text
                   || COALESCE(' (cancelled by ' || cancelled_by::text || ')', '')
                   || ' after ' || attempts::text || ' attempt(s); attempts start again at 1',
        'traceback', '',
        'worker', NULL,
        'requeued', true,
        'at', now()))
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state::text IN ('dead', 'cancelled')
  AND (j.unique_key IS NULL OR NOT (j.unique_while::text = 'active' OR j.started_at IS NULL)
       OR (NOT EXISTS (SELECT 1 FROM dbqueue_job AS o
                       WHERE o.unique_key::text = j.unique_key::text AND """
    + _unique_held("o.")
    + """)
           AND NOT EXISTS (SELECT 1 FROM dbqueue_job AS p
                           WHERE p.id = ANY(%(ids)s::bigint[]) AND p.id > j.id
                             AND p.unique_key::text = j.unique_key::text
                             AND p.state::text IN ('dead', 'cancelled')
                             AND (p.unique_while::text = 'active' OR p.started_at IS NULL))))
RETURNING j.id, j.queue
"""
)


def requeue(using, ids):
    """Dead or cancelled jobs back to pending with attempts reset; returns ``{id: queue}`` of the
    jobs moved (the caller wakes their queues: ``wakeup.jobs_ready``). A job whose unique key
    another job holds now stays where it is (:func:`requeue_blocked` says which and why)."""
    params = {"ids": list(ids)}
    for tries in range(1, REQUEUE_TRIES + 1):
        try:
            # A savepoint: a unique violation (a holder committed between this statement's
            # snapshot and its write) must not abort the caller's transaction.
            with transaction.atomic(using=using):
                return dict(_execute(using, REQUEUE_JOBS, params))
        except IntegrityError:
            if tries == REQUEUE_TRIES:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


# Which of these dead or cancelled jobs a requeue left alone because another job holds their
# unique key now: (id, key, holder id, holder state), for the operator's message.
REQUEUE_BLOCKED_BY_UNIQUE = (
    """
SELECT j.id, j.unique_key, o.id, o.state
FROM dbqueue_job AS j JOIN dbqueue_job AS o
  ON o.unique_key::text = j.unique_key::text AND o.id <> j.id AND """
    + _unique_held("o.")
    + """
WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state::text IN ('dead', 'cancelled')
  AND j.unique_key IS NOT NULL
ORDER BY j.id
"""
)


def requeue_blocked(using, ids):
    """``[(id, unique_key, holder_id, holder_state), ...]``: which of the dead or cancelled jobs
    among ``ids`` cannot be requeued because another job holds their unique key now."""
    return _execute(using, REQUEUE_BLOCKED_BY_UNIQUE, {"ids": list(ids)})


# Pending but scheduled for later -> due now.
RUN_JOBS_NOW = """
UPDATE dbqueue_job SET run_after = now()
WHERE id = ANY(%(ids)s::bigint[]) AND state::text = 'pending' AND run_after > now()
RETURNING id, queue
"""


def run_now(using, ids):
    """Scheduled pending jobs due now; returns ``{id: queue}`` of the jobs moved."""
    return dict(_execute(using, RUN_JOBS_NOW, {"ids": list(ids)}))


def cancel(using, ids, *, by=None):
    """Pending or waiting jobs to cancelled, running ones marked for cancellation; returns the
    ids cancelled at once (:func:`request_cancel` says what became of each)."""
    return {i for i, state in request_cancel(using, ids, by=by).items() if state == "cancelled"}


# cancel(): pending or waiting -> cancelled at once; running -> marked (cancel_requested_at),
# and it stays running: its handler is under way, on a worker that learns of the mark from the
# cancel notification (sent after the commit, cancel_notices.jobs_cancelled) or its next heartbeat,
# and whatever the run's outcome, the write that ends it ends it cancelled (COMPLETE_JOBS,
# FAIL_JOB, END_CANCELLED, RESCUE_EXPIRED, the releases). Marking again keeps the first request
# and its author. The workflow trigger cancels the jobs waiting for a cancelled one
# (docs/workflows.md); a running job's dependents wait for its end.
# A running job is not written here: this statement writes a row of dbqueue_cancel_at_commit,
# whose deferred trigger (migration 0015) marks the job at the caller's COMMIT, so the caller's
# transaction holds the running row's lock for its commit only (held from here, it stopped the
# job's worker: its heartbeat, completion and claims wait for it). The same goes for a job this
# statement saw pending or waiting and that a worker claimed meanwhile (the UPDATE re-reads it
# and leaves it). At the commit the trigger marks it if it still runs, cancels it if it waits
# again (a retry), and leaves it if it finished meanwhile. An id missing from the result is
# unknown.
CANCEL_JOBS = """
WITH moved AS (
    UPDATE dbqueue_job AS j
    SET state = 'cancelled', finished_at = now(), waiting_on = 0,
        cancel_requested_at = now(), cancelled_by = %(by)s
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state::text IN ('pending', 'waiting')
    RETURNING j.id
),
requested AS (
    INSERT INTO dbqueue_cancel_at_commit (job_id, cancelled_by)
    SELECT j.id, %(by)s FROM dbqueue_job AS j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state::text IN ('pending', 'waiting', 'running')
      AND j.id NOT IN (SELECT id FROM moved)
    ORDER BY j.id
    RETURNING job_id
)
SELECT id, 'cancelled' FROM moved
UNION ALL
SELECT job_id, 'running' FROM requested
UNION ALL
SELECT id, 'finished' FROM dbqueue_job
WHERE id = ANY(%(ids)s::bigint[]) AND id NOT IN (SELECT id FROM moved)
  AND id NOT IN (SELECT job_id FROM requested)
"""


def request_cancel(using, ids, *, by=None):
    """``{id: "cancelled" | "running" | "finished"}`` for the ids that exist: cancelled now,
    marked while it runs, or already done, dead or cancelled. Ids missing are unknown."""
    return dict(_execute(using, CANCEL_JOBS, {"ids": list(ids), "by": by}))


# Deletes finished jobs (done, dead, cancelled) only: the state test sits in the DELETE itself,
# so a job requeued since it was selected is left alone, and so does the optional bound on
# finished_at (the admin's confirmation page's time: a job that finished again after it was
# shown was not confirmed). A deleted job's own dependency edges go
# with it, as do its steps and signals (docs/steps.md) (one index probe per job; a job that others depended on keeps its edges until those
# are deleted, so they can still read its result while it exists). Delivery records keep the job's id (no
# foreign key in the database), as they do when retention prunes a job.
DELETE_FINISHED_JOBS = """
WITH deleted AS (
    DELETE FROM dbqueue_job
    WHERE id = ANY(%(ids)s::bigint[]) AND state::text IN ('done', 'dead', 'cancelled')
      AND (%(before)s::timestamptz IS NULL OR finished_at <= %(before)s::timestamptz)
    RETURNING id
),
edges AS (
    DELETE FROM dbqueue_dependency WHERE job_id IN (SELECT id FROM deleted) RETURNING 1
),
steps AS (
    DELETE FROM dbqueue_step WHERE job_id IN (SELECT id FROM deleted) RETURNING 1
),
signals AS (
    DELETE FROM dbqueue_signal WHERE job_id IN (SELECT id FROM deleted) RETURNING 1
)
SELECT id FROM deleted
"""


def delete_finished(using, ids, *, finished_before=None):
    """Delete the done, dead or cancelled jobs among ``ids`` (that finished at or before
    ``finished_before``, an aware datetime, when given); returns the ids deleted. One
    statement: it commits on its own unless a transaction is open on ``using``."""
    params = {"ids": list(ids), "before": finished_before}
    return {row[0] for row in _execute(using, DELETE_FINISHED_JOBS, params)}


# The ids of dead jobs matching optional filters, in id order after a cursor, for requeueing a
# large set in bounded batches.
SELECT_DEAD_IDS = """
SELECT id FROM dbqueue_job
WHERE state::text = 'dead' AND id > %(after)s::bigint
  AND (%(type)s::text IS NULL OR type::text = %(type)s::text)
  AND (%(queue)s::text IS NULL OR queue::text = %(queue)s::text)
ORDER BY id
LIMIT %(limit)s
"""


def dead_ids(using, *, after=0, job_type=None, queue=None, limit=1000):
    params = {"after": after, "type": job_type, "queue": queue, "limit": limit}
    return [row[0] for row in _execute(using, SELECT_DEAD_IDS, params)]


COUNT_DEAD = """
SELECT count(*) FROM dbqueue_job
WHERE state::text = 'dead'
  AND (%(type)s::text IS NULL OR type::text = %(type)s::text)
  AND (%(queue)s::text IS NULL OR queue::text = %(queue)s::text)
"""


def count_dead(using, *, job_type=None, queue=None):
    return _execute(using, COUNT_DEAD, {"type": job_type, "queue": queue})[0][0]


# Retention: delete finished jobs of one state older than a cutoff, oldest first, bounded, and
# SKIP LOCKED so that workers pruning at once split the rows. Served by dbqueue_job_finished_idx.
# The workflow edges, steps and signals of a deleted job go with it (see DELETE_FINISHED_JOBS).
PRUNE_FINISHED = """
WITH deleted AS (
    DELETE FROM dbqueue_job
    WHERE id IN (
        SELECT id FROM dbqueue_job
        WHERE state::text = %(state)s::text
          AND finished_at < now() - %(age)s::float8 * interval '1 second'
        ORDER BY finished_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    RETURNING id
),
edges AS (
    DELETE FROM dbqueue_dependency WHERE job_id IN (SELECT id FROM deleted) RETURNING 1
),
steps AS (
    DELETE FROM dbqueue_step WHERE job_id IN (SELECT id FROM deleted) RETURNING 1
),
signals AS (
    DELETE FROM dbqueue_signal WHERE job_id IN (SELECT id FROM deleted) RETURNING 1
)
SELECT count(*) FROM deleted
"""


def prune(using, *, state, age, limit):
    """Delete up to ``limit`` ``state`` jobs finished more than ``age`` seconds ago; returns n."""
    params = {"state": state, "age": float(age), "limit": limit}
    return _execute(using, PRUNE_FINISHED, params)[0][0]


def _empty_status():
    return {
        "pending": 0,
        "running": 0,
        "dead": 0,
        "stuck": 0,
        "scheduled": 0,
        "waiting": 0,
        "oldest_due_seconds": None,
    }


# Counts per queue and state of the live states (pending, waiting, running, dead), the oldest due pending
# job's age, and the stuck (lease expired) jobs. One aggregate per state, so each is served by
# that state's partial index (claim, lease, finished) instead of a scan of the whole table.
# Finished rows (done, cancelled) are left out: retention keeps them few, and counting them is
# the one part that grows with history.
STATUS_COUNTS = """
SELECT queue, 'pending' AS state, count(*), 0 AS stuck,
       EXTRACT(EPOCH FROM now() - min(run_after) FILTER (WHERE run_after <= now())) AS oldest_due,
       count(*) FILTER (WHERE run_after > now()) AS scheduled
FROM dbqueue_job WHERE state::text = 'pending' GROUP BY queue
UNION ALL
SELECT queue, 'running', count(*), count(*) FILTER (WHERE leased_until < now()), NULL, 0
FROM dbqueue_job WHERE state::text = 'running' GROUP BY queue
UNION ALL
SELECT queue, 'dead', count(*), 0, NULL, 0
FROM dbqueue_job WHERE state::text = 'dead' GROUP BY queue
UNION ALL
SELECT queue, 'waiting', count(*), 0, NULL, 0
FROM dbqueue_job WHERE state::text = 'waiting' GROUP BY queue
ORDER BY 1, 2
"""


def status(using, queues=()):
    """Per-queue counts: ``{queue: {"pending", "running", "dead", "stuck", "scheduled",
    "oldest_due_seconds"}}``, with a zero entry for each of ``queues`` that has no live job.
    ``pending`` is due now; ``scheduled`` is pending with a future ``run_after``; ``waiting``
    waits for its workflow dependencies; ``stuck`` is running past its lease."""
    result = {queue: _empty_status() for queue in queues}
    for queue, state, count, stuck, oldest_due, scheduled in _execute(using, STATUS_COUNTS, {}):
        entry = result.setdefault(queue, _empty_status())
        # "pending" counts what is due now; pending jobs scheduled for later are "scheduled".
        entry[state] = count - scheduled
        entry["stuck"] += stuck
        entry["scheduled"] += scheduled
        if oldest_due is not None:
            entry["oldest_due_seconds"] = float(oldest_due)
    return result


# One job's status, for jobqueue_status --job: its row's fields, the last entry of its error
# history as JSON text (NULL when it has none; a requeue's marker counts, as in the admin's
# "last error"), and nothing that grows with the job (payload, result, the whole history).
# run_after comes as time_columns() (store/_db.py): a row written by hand may hold one Python
# cannot read, and the command must still print the job.
JOB_STATUS = f"""
SELECT id, type, queue, state, attempts, max_attempts, {time_columns("run_after")}, worker_id,
       (errors -> -1)::text AS last_error, snoozes,
       CASE WHEN state::text = 'pending' AND wait_token = lease_token THEN wait_reason END,
       event_id, (SELECT e.name FROM dbqueue_event AS e WHERE e.id = event_id)
FROM dbqueue_job WHERE id = %(job)s::bigint
"""
JOB_STATUS_FIELDS = (
    "id",
    "type",
    "queue",
    "state",
    "attempts",
    "max_attempts",
    "run_after",
    "run_after_text",
    "worker_id",
    "last_error",
    "snoozes",
    "waiting_for",
    "event_id",
    "event",
)


def job_status(using, job_id):
    """``{"id", "type", "queue", "state", "attempts", "max_attempts", "run_after", "worker_id",
    "last_error", "snoozes", "waiting_for"}`` of the job (``last_error``: the last error entry as
    JSON text, or None; ``waiting_for``: ``"sleep:<name>"`` or ``"signal:<name>"`` while a
    pending job is in a durable wait, else None; ``event_id`` and ``event``: the published
    event that made the job and its name, docs/events.md, else None; ``run_after``: a datetime,
    or PostgreSQL's text of one Python cannot show, time_or_text), or None when there is no
    such job."""
    rows = _execute(using, JOB_STATUS, {"job": job_id})
    if not rows:
        return None
    job = dict(zip(JOB_STATUS_FIELDS, rows[0], strict=True))
    job["run_after"] = time_or_text(job["run_after"], job.pop("run_after_text"))
    return job


# A job's steps (dbqueue_step), bounded for the admin and jobqueue_status --job: how many it has
# in all, and the first %(limit)s in the order they finished (by id), each result as JSON text,
# cut in the database to %(chars)s characters when that is not NULL (so a page of huge results
# never leaves the server whole). Always one row at least: a job without steps gives its count
# (0) and NULLs. Both reads find the job's rows by dbqueue_step_uniq (job_id first); the planner
# walks the table (or its primary key, in id order) instead only for a job that holds a large
# part of it, where that costs about as much.
JOB_STEPS = f"""
SELECT t.total, s.name, s.occurrence, s.attempt, {time_columns("s.finished_at")},
       CASE WHEN %(chars)s::integer IS NULL THEN s.result::text
            ELSE left(s.result::text, %(chars)s::integer) END
FROM (SELECT count(*) AS total FROM dbqueue_step WHERE job_id = %(job)s::bigint) AS t
LEFT JOIN LATERAL (
    SELECT id, name, occurrence, attempt, finished_at, result FROM dbqueue_step
    WHERE job_id = %(job)s::bigint ORDER BY id LIMIT %(limit)s
) AS s ON true
ORDER BY s.id
"""


def job_steps(using, job_id, *, limit, chars=None):
    """``(total, [(name, occurrence, attempt, finished_at, result_text)])``: how many steps the
    job has recorded, and the first ``limit`` of them in the order they finished. Each
    ``result_text`` is the result's JSON text (None for a None result), cut to ``chars``
    characters when ``chars`` is given (the caller cuts it shorter and marks the cut);
    ``finished_at`` a datetime, or PostgreSQL's text of one Python cannot show (a record written
    by hand: time_or_text)."""
    params = {"job": job_id, "limit": limit, "chars": chars}
    rows = _execute(using, JOB_STEPS, params)
    total = rows[0][0]
    return total, [
        (name, occurrence, attempt, time_or_text(at, text), result)
        for _, name, occurrence, attempt, at, text, result in rows
        if name is not None
    ]
