"""The dashboard (dashboard.py) and its rollup (rollup.py): the per-minute samples and counts,
their retention, and the dashboard's reads over them and the job table."""

from ._db import _execute

# The rollup (rollup.py): once a minute one worker samples each queue's depth and counts the jobs
# that finished since the previous sample, per minute, queue and type, into dbqueue_finished, so
# that the dashboard reads a few thousand small rows instead of every finished job, and keeps
# its counts after retention deleted the jobs. One statement, so a crash cannot leave a sample
# without its counts:
# - The NOT EXISTS tests run once (one-time filters): a worker that finds this minute sampled
#   already costs one index probe, not a count of the backlog.
# - Two workers racing for a minute both insert; the unique index makes the second wait for the
#   first and then insert nothing, and "EXISTS (SELECT 1 FROM sample)" stops its counting too.
# - The counted range is [previous sample's minute, this minute): the previous pass counted up to
#   its own minute, exclusive, so ranges chain without overlap. With no sample within
#   %(catch_up)s seconds (a fresh install, or no worker for a day) it starts that far back.
# - Finished rows are read through dbqueue_job_finished_idx (state, finished_at): three range
#   scans of one minute each, in the steady state.
# - The wait of a finished job is its last claim's (started_at - run_after); width_bucket()
#   puts it in a bin of %(bounds)s (seconds), kept as {"bin": count}.
# - Failed attempts are counted once, in the minute each one failed: the error entries whose
#   "at" lies in the counted range (FAILED_ATTEMPTS_SQL), whatever became of the job since (still
#   retrying, running again, requeued, done). Counting a finished job's whole error history at
#   its end counted a requeued job's earlier failures twice, and its "Requeued" marker (not a
#   failed attempt) once more.
# - A django.tasks job is counted under its task's path, as stored (JOB_NAME_SQL).
# ROLLUP_DUE asks first whether the minute is still to do: PostgreSQL JIT-compiles
# ROLLUP_MINUTE's plan (its estimated cost is the backlog's) even when the guards skip every
# scan, which measured ~90 ms a pass against ~1 ms for the probe alone.
ROLLUP_DUE = """
SELECT NOT EXISTS (SELECT 1 FROM dbqueue_depth
                   WHERE minute = date_trunc('minute'::text, now()))
"""

# The name a job is shown and counted under (names.py): its type, or for a ``django.tasks`` job
# the path of its task as stored in the payload (text only: nothing is resolved or imported),
# cut to the 200 characters of a type. ``j`` is the job row.
JOB_NAME_SQL = """CASE WHEN j.type::text = 'django.tasks'
          AND jsonb_typeof(j.payload -> 'task'::text) = 'string'
     THEN left(j.payload ->> 'task'::text, 200) ELSE j.type::text END"""

# The failed attempts of the jobs that may have failed since %(from)s, one row per error entry,
# at the time it failed: (queue, name, at). An entry's "at" is the database's now() when it was
# written (FAIL_JOB, DEFER_UNKNOWN_TYPE, RESCUE_EXPIRED); an entry without one, or with one
# that is no time (written by hand: "2026-13-45T99:99:99"), counts at the job's finish: the
# jsonpath's datetime() reads it, and its silent mode answers NULL where a cast would fail the
# whole statement. A history that is not an array (written by hand: an object, a string)
# counts nothing: jsonb_array_elements() of it would fail the statement, so every minute's
# rollup of every worker and the dashboard (issue 35). The "Requeued" marker (REQUEUE_JOBS) is not a failed
# attempt. A job that failed at or after %(from)s is now, whatever happened to it since:
# - finished (done, dead or cancelled) at or after %(from)s: dbqueue_job_finished_idx;
# - pending with run_after at or after %(from)s: a failure, a requeue and a run-now set
#   run_after to now() or later, and a release keeps it; with an error, so that
#   dbqueue_job_retried_idx (pending rows with an error history) serves it, not a pass over
#   every pending row or, worse, a scan of the table;
# - running: few rows, dbqueue_job_lease_idx.
# Only the rows with an error are unpacked.
FAILED_ATTEMPTS_SQL = (
    """
SELECT j.queue, """
    + JOB_NAME_SQL
    + r""" AS type, f.at
FROM (
    SELECT queue, type, payload, errors, finished_at FROM dbqueue_job
    WHERE state::text IN ('done', 'dead', 'cancelled') AND finished_at >= %(from)s
    UNION ALL
    SELECT queue, type, payload, errors, finished_at FROM dbqueue_job
    WHERE state::text = 'pending' AND NOT (errors = '[]'::jsonb) AND run_after >= %(from)s
    UNION ALL
    SELECT queue, type, payload, errors, finished_at FROM dbqueue_job WHERE state::text = 'running'
) AS j
CROSS JOIN LATERAL (
    SELECT COALESCE(
               CASE WHEN e.value ->> 'at'::text ~ '^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d'::text
                    THEN pg_catalog.jsonb_path_query_first(
                             pg_catalog.to_jsonb(pg_catalog.regexp_replace(
                                 e.value ->> 'at'::text, '[zZ]$'::text, '+00:00'::text)),
                             '$.datetime()'::jsonpath, '{}'::jsonb, true) #>> '{}'::text[]
               END::timestamptz,
               j.finished_at) AS at
    FROM jsonb_array_elements(CASE WHEN jsonb_typeof(j.errors) = 'array'::text
                                   THEN j.errors ELSE '[]'::jsonb END) AS e
    WHERE jsonb_typeof(e.value) = 'object' AND NOT (e.value ? 'requeued'::text)
) AS f
WHERE j.errors <> '[]'::jsonb AND f.at >= %(from)s"""
)

ROLLUP_MINUTE = (
    """
WITH this AS MATERIALIZED (
    SELECT date_trunc('minute'::text, now()) AS minute,
           NOT EXISTS (SELECT 1 FROM dbqueue_depth
                       WHERE minute = date_trunc('minute'::text, now())) AS todo
),
previous AS MATERIALIZED (
    SELECT COALESCE(max(d.minute), t.minute - %(catch_up)s::float8 * interval '1 second')
               AS minute
    FROM this AS t LEFT JOIN dbqueue_depth AS d
      ON d.minute < t.minute AND d.minute >= t.minute - %(catch_up)s::float8 * interval '1 second'
    WHERE t.todo
    GROUP BY t.minute
),
backlog AS MATERIALIZED (
    SELECT queue::text AS queue, count(*) FILTER (WHERE run_after <= now()) AS due,
           count(*) FILTER (WHERE run_after > now()) AS scheduled, 0 AS running
    FROM dbqueue_job WHERE state::text = 'pending' AND (SELECT todo FROM this) GROUP BY queue
    UNION ALL
    SELECT queue::text, 0, 0, count(*)
    FROM dbqueue_job WHERE state::text = 'running' AND (SELECT todo FROM this) GROUP BY queue
),
sample AS (
    INSERT INTO dbqueue_depth (minute, queue, due, scheduled, running)
    SELECT t.minute, q.queue, COALESCE(sum(b.due), 0), COALESCE(sum(b.scheduled), 0),
           COALESCE(sum(b.running), 0)
    FROM this AS t
    CROSS JOIN (SELECT pg_catalog.unnest(%(queues)s::text[]) AS queue
                UNION SELECT queue FROM backlog) AS q
    LEFT JOIN backlog AS b ON b.queue = q.queue
    WHERE t.todo
    GROUP BY t.minute, q.queue
    ON CONFLICT (minute, queue) DO NOTHING
    RETURNING 1
),
finished AS MATERIALIZED (
    SELECT date_trunc('minute'::text, j.finished_at) AS minute, j.queue::text AS queue, """
    + JOB_NAME_SQL
    + """ AS type,
           pg_catalog.width_bucket(EXTRACT(EPOCH FROM j.started_at - j.run_after)::float8,
                                   %(bounds)s::float8[]) AS bin,
           count(*) FILTER (WHERE j.state::text = 'done') AS done,
           count(*) FILTER (WHERE j.state::text = 'dead') AS dead,
           count(*) FILTER (WHERE j.state::text = 'cancelled') AS cancelled,
           0 AS failed
    FROM dbqueue_job AS j, this AS t, previous AS p
    WHERE j.state::text IN ('done', 'dead', 'cancelled')
      AND j.finished_at >= p.minute AND j.finished_at < t.minute
      AND EXISTS (SELECT 1 FROM sample)
    GROUP BY 1, 2, 3, 4
    UNION ALL
    SELECT date_trunc('minute'::text, a.at), a.queue::text, a.type, NULL, 0, 0, 0, count(*)
    FROM ("""
    + FAILED_ATTEMPTS_SQL.replace("%(from)s", "(SELECT minute FROM previous)")
    + """) AS a, this AS t
    WHERE a.at < t.minute AND EXISTS (SELECT 1 FROM sample)
    GROUP BY 1, 2, 3
),
rolled AS (
    INSERT INTO dbqueue_finished (
        minute, queue, type, done, dead, cancelled, failed_attempts, wait_histogram
    )
    SELECT minute, queue, type, sum(done), sum(dead), sum(cancelled), sum(failed),
           COALESCE(pg_catalog.jsonb_object_agg(bin, done + dead)
                        FILTER (WHERE bin IS NOT NULL AND done + dead > 0), '{}'::jsonb)
    FROM finished
    GROUP BY minute, queue, type
    ON CONFLICT (minute, queue, type) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM sample), (SELECT count(*) FROM rolled)
"""
)


def rollup_minute(db, *, queues, bounds, catch_up):
    """Sample this minute's depth of ``queues`` (and of any queue with jobs) and count the jobs
    finished since the previous sample, unless another worker did this minute already.
    Returns ``(queues sampled, finished rows written)``; ``(0, 0)`` when it was done already."""
    if not _execute(db, ROLLUP_DUE, {})[0][0]:
        return 0, 0
    params = {"queues": list(queues), "bounds": list(bounds), "catch_up": float(catch_up)}
    sampled, rolled = _execute(db, ROLLUP_MINUTE, params)[0]
    return sampled, rolled


# The rollup's retention: rows older than the dashboard's longest window (and a margin), oldest
# first, bounded like PRUNE_FINISHED. Served by the unique indexes, which start with the minute.
PRUNE_DEPTH = """
WITH deleted AS (
    DELETE FROM dbqueue_depth WHERE id IN (
        SELECT id FROM dbqueue_depth WHERE minute < now() - %(age)s::float8 * interval '1 second'
        ORDER BY minute LIMIT %(limit)s
    )
    RETURNING 1
)
SELECT count(*) FROM deleted
"""

PRUNE_FINISHED_MINUTES = """
WITH deleted AS (
    DELETE FROM dbqueue_finished WHERE id IN (
        SELECT id FROM dbqueue_finished
        WHERE minute < now() - %(age)s::float8 * interval '1 second'
        ORDER BY minute LIMIT %(limit)s
    )
    RETURNING 1
)
SELECT count(*) FROM deleted
"""


def prune_rollup(db, *, age, limit):
    """Delete up to ``limit`` rows of each rollup table older than ``age`` seconds; returns n."""
    params = {"age": float(age), "limit": limit}
    return sum(
        _execute(db, statement, params)[0][0] for statement in (PRUNE_DEPTH, PRUNE_FINISHED_MINUTES)
    )


# The dashboard's clock: the database's now(), the window's first minute, and the minute up to
# which the rollup has counted finished jobs (the last depth sample's minute; the window's start
# when there is none, so that the dashboard then counts everything from the job table itself).
# A sample's minute in the future (written by hand) is no minute the rollup counted up to.
DASHBOARD_CLOCK = """
SELECT now(), s.since, GREATEST(s.since, (SELECT max(minute) FROM dbqueue_depth
                                          WHERE minute >= s.since AND minute <= now()))
FROM (SELECT date_trunc('minute'::text, now()) - %(window)s::float8 * interval '1 second'
                                              + interval '1 minute' AS since) AS s
"""


def dashboard_clock(using, *, window):
    """``(now, since, split)`` in database time: see ``DASHBOARD_CLOCK``."""
    return _execute(using, DASHBOARD_CLOCK, {"window": float(window)})[0]


# Jobs finished per time bucket and name (JOB_NAME_SQL), and failed attempts in the bucket
# each one failed in (FAILED_ATTEMPTS_SQL): the rollup's minutes before %(split)s, and the job
# table itself from %(split)s on (the minute or so the rollup has not counted yet: a range scan
# of dbqueue_job_finished_idx). Buckets are numbered from %(since)s in steps of %(step)s seconds.
DASHBOARD_FINISHED = (
    """
SELECT floor(EXTRACT(EPOCH FROM r.at - %(since)s::timestamptz)::float8 / %(step)s::float8)::int
           AS bucket, r.type,
       sum(r.done)::bigint, sum(r.dead)::bigint, sum(r.cancelled)::bigint, sum(r.failed)::bigint
FROM (
    SELECT minute AS at, type, done, dead, cancelled, failed_attempts AS failed
    FROM dbqueue_finished
    WHERE minute >= %(since)s::timestamptz AND minute < %(split)s::timestamptz
    UNION ALL
    SELECT j.finished_at, """
    + JOB_NAME_SQL
    + """, (j.state::text = 'done')::int, (j.state::text = 'dead')::int,
           (j.state::text = 'cancelled')::int, 0
    FROM dbqueue_job AS j
    WHERE j.state::text IN ('done', 'dead', 'cancelled')
      AND j.finished_at >= %(split)s::timestamptz
    UNION ALL
    SELECT a.at, a.type, 0, 0, 0, 1
    FROM ("""
    + FAILED_ATTEMPTS_SQL.replace("%(from)s", "%(split)s::timestamptz")
    + """) AS a
) AS r
WHERE r.at <= now()
GROUP BY 1, 2
"""
)


def dashboard_finished(using, *, since, split, step):
    """``[(bucket, type, done, dead, cancelled, failed_attempts), ...]``."""
    params = {"since": since, "split": split, "step": float(step)}
    return _execute(using, DASHBOARD_FINISHED, params)


# Waits per time bucket as histogram bins (see ROLLUP_MINUTE), from the same two sources.
# Both reads stop at now(): a finished_at in the future can only be a row written by hand (year
# 200000), whose bucket would overflow the int and fail the whole dashboard.
DASHBOARD_WAITS = """
SELECT floor(EXTRACT(EPOCH FROM r.at - %(since)s::timestamptz)::float8 / %(step)s::float8)::int
           AS bucket, r.bin,
       sum(r.n)::bigint
FROM (
    SELECT f.minute AS at, h.key::int AS bin, h.value::int AS n
    FROM dbqueue_finished AS f CROSS JOIN LATERAL jsonb_each_text(f.wait_histogram) AS h
    WHERE f.minute >= %(since)s::timestamptz AND f.minute < %(split)s::timestamptz
    UNION ALL
    SELECT finished_at,
           pg_catalog.width_bucket(EXTRACT(EPOCH FROM started_at - run_after)::float8,
                                   %(bounds)s::float8[]),
           1
    FROM dbqueue_job
    WHERE state::text IN ('done', 'dead') AND finished_at >= %(split)s::timestamptz
      AND started_at IS NOT NULL
) AS r
WHERE r.at <= now()
GROUP BY 1, 2
"""


def dashboard_waits(using, *, since, split, step, bounds):
    """``[(bucket, bin, count), ...]``: waits as bins of ``bounds`` (see width_bucket)."""
    params = {"since": since, "split": split, "step": float(step), "bounds": list(bounds)}
    return _execute(using, DASHBOARD_WAITS, params)


# Queue depth per bucket: the largest sample of each queue in it. Up to now(), as the reads
# above: a sample's minute in the future can only be written by hand (the rollup writes this
# minute), and one as far as the table allows (9999-12-30) would overflow the bucket's int.
DASHBOARD_DEPTH = """
SELECT floor(EXTRACT(EPOCH FROM minute - %(since)s::timestamptz)::float8 / %(step)s::float8)::int
           AS bucket, queue,
       max(due), max(scheduled), max(running)
FROM dbqueue_depth
WHERE minute >= %(since)s::timestamptz AND minute <= now()
GROUP BY 1, 2
"""


def dashboard_depth(using, *, since, step):
    """``[(bucket, queue, due, scheduled, running), ...]``: the largest sample per bucket."""
    return _execute(using, DASHBOARD_DEPTH, {"since": since, "step": float(step)})


# The workers holding jobs now (an idle worker holds no row, so it is not seen): running rows
# grouped by worker, through dbqueue_job_lease_idx. The last heartbeat is when the worker last
# extended a lease (leased_until - lease, as in METRICS_SNAPSHOT). Bounded by %(limit)s.
DASHBOARD_WORKERS = """
SELECT worker_id, pg_catalog.array_agg(DISTINCT queue::text ORDER BY queue::text), count(*),
       count(*) FILTER (WHERE leased_until < now()),
       EXTRACT(EPOCH FROM now() - max(leased_until - lease_seconds * interval '1 second'))::float8
FROM dbqueue_job
WHERE state::text = 'running'
GROUP BY worker_id
ORDER BY worker_id
LIMIT %(limit)s
"""


def dashboard_workers(using, *, limit=200):
    """``[(worker_id, [queues], jobs, stuck, heartbeat_age_seconds), ...]``, by worker id."""
    return _execute(using, DASHBOARD_WORKERS, {"limit": limit})
