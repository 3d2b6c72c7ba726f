"""Metrics (metrics.py): every gauge of the job table and the registry in one statement."""

from ._db import _execute

# Every gauge of the table in one statement, as (kind, name, label, value) rows: per queue the due,
# scheduled, suspended (in a durable wait, docs/steps.md: not due until its time or its signal),
# waiting (on workflow dependencies), running, stuck and dead jobs and the oldest due
# job's age; per worker in the registry (dbqueue_worker, unexpired) the jobs it holds and the
# seconds since its last heartbeat; per queue and host the workers serving it that are not
# stale; the unconfirmed delivery records. Like
# STATUS_COUNTS, each part reads one state through that state's partial index (claim, lease,
# dead-per-queue, unconfirmed deliveries), never the finished rows, so the cost follows the live
# backlog and not the history. Done, sent and failed rows are left out for that reason: counting
# them would scan what retention keeps; the workers' counters say how many finished. Paused
# queues (a few rows of dbqueue_queue) give the seconds since each was paused.
METRICS_SNAPSHOT = """
SELECT 'queue', p.queue, v.label, v.value
FROM (
    SELECT queue,
           count(*) FILTER (WHERE run_after <= now()) AS due,
           count(*) FILTER (WHERE run_after > now() AND NOT suspended) AS scheduled,
           count(*) FILTER (WHERE run_after > now() AND suspended) AS suspended,
           EXTRACT(EPOCH FROM now() - min(run_after) FILTER (WHERE run_after <= now())) AS oldest
    FROM (SELECT queue, run_after,
                 COALESCE(wait_reason IS NOT NULL AND wait_token = lease_token, false) AS suspended
          FROM dbqueue_job WHERE state::text = 'pending') AS pending
    GROUP BY queue
) AS p
CROSS JOIN LATERAL (VALUES ('due', p.due::float8), ('scheduled', p.scheduled::float8),
                           ('suspended', p.suspended::float8),
                           ('oldest_due_seconds', p.oldest::float8)) AS v(label, value)
UNION ALL
SELECT 'queue', r.queue, v.label, v.value
FROM (
    SELECT queue, count(*) AS running, count(*) FILTER (WHERE leased_until < now()) AS stuck
    FROM dbqueue_job WHERE state::text = 'running' GROUP BY queue
) AS r
CROSS JOIN LATERAL (VALUES ('running', r.running::float8), ('stuck', r.stuck::float8))
    AS v(label, value)
UNION ALL
SELECT 'queue', queue, 'dead', count(*)::float8
FROM dbqueue_job WHERE state::text = 'dead' GROUP BY queue
UNION ALL
SELECT 'queue', queue, 'waiting', count(*)::float8
FROM dbqueue_job WHERE state::text = 'waiting' GROUP BY queue
UNION ALL
SELECT 'worker', w.worker_id, v.label, v.value
FROM (
    SELECT w.worker_id, COALESCE(r.jobs, 0) AS jobs,
           EXTRACT(EPOCH FROM now() - w.heartbeat_at) AS heartbeat_age
    FROM dbqueue_worker AS w
    LEFT JOIN (SELECT worker_id, count(*) AS jobs FROM dbqueue_job WHERE state::text = 'running'
               GROUP BY worker_id) AS r ON r.worker_id::text = w.worker_id::text
    WHERE w.expires_at > now()
) AS w
CROSS JOIN LATERAL (VALUES ('jobs', w.jobs::float8), ('heartbeat_age_seconds',
                                                       w.heartbeat_age::float8)) AS v(label, value)
UNION ALL
SELECT 'workers', q.queue, w.host, (count(*) FILTER (WHERE w.stale_at > now()))::float8
FROM dbqueue_worker AS w CROSS JOIN LATERAL pg_catalog.unnest(w.queues) AS q(queue)
WHERE w.expires_at > now()
GROUP BY q.queue, w.host
UNION ALL
SELECT 'delivery', 'recorded', 'count', count(*)::float8
FROM dbqueue_delivery WHERE state::text = 'recorded'
UNION ALL
SELECT 'queue', name, 'paused_seconds',
       GREATEST(EXTRACT(EPOCH FROM now() - COALESCE(changed_at, now())), 0)::float8
FROM dbqueue_queue WHERE paused
"""


def metrics_snapshot(db):
    """The table's gauges in one statement: ``[(kind, name, label, value), ...]`` with kind
    ``queue`` (labels due, scheduled, oldest_due_seconds, running, stuck, dead), ``worker``
    (jobs, heartbeat_age_seconds) or ``delivery`` (recorded). ``db``: an alias or a Session."""
    return _execute(db, METRICS_SNAPSHOT, {})
