"""The worker registry (presence.py): a worker announces itself, withdraws, the sweeper
forgets expired rows, and the live workers are listed."""

from ._db import _commit, _execute, text_array

# A worker says it is alive: once at start, then once per HEARTBEAT_INTERVAL, on its own
# connection (no extra connection, no session state: fine behind PgBouncer in transaction
# mode). Its own row only, so it never waits on another worker; it waits only on a sweep
# deleting its expired row, which it then inserts again. Written like the heartbeat, with the
# worker's commit mode: losing the last one in a crash costs nothing, the next one rewrites it.
# started_at is kept from the first insert. The deadlines are database time, as the readers
# compare them with now().
ANNOUNCE_WORKER = """
WITH commit_mode AS MATERIALIZED (
    SELECT set_config('synchronous_commit'::text,
                      COALESCE(%(commit)s::text, current_setting('synchronous_commit'::text)),
                      true)
)
INSERT INTO dbqueue_worker AS w (worker_id, host, pid, version, queues, concurrency, execution,
                                 group_pid, state, started_at, heartbeat_at, stale_at,
                                 expires_at, running)
SELECT %(worker)s, %(host)s, %(pid)s, %(version)s, %(queues)s::text[], %(concurrency)s,
       %(execution)s, %(group_pid)s, %(state)s, now(), now(),
       now() + %(stale)s::float8 * interval '1 second',
       now() + %(expire)s::float8 * interval '1 second',
       %(running)s
FROM commit_mode
ON CONFLICT (worker_id) DO UPDATE
SET state = EXCLUDED.state, heartbeat_at = now(), stale_at = EXCLUDED.stale_at,
    expires_at = EXCLUDED.expires_at, running = EXCLUDED.running
RETURNING w.started_at
"""


def announce_worker(
    db,
    *,
    worker,
    host,
    pid,
    version,
    queues,
    concurrency,
    execution,
    group_pid,
    state,
    stale,
    expire,
    running,
    async_commit=False,
):
    """Insert or refresh the row of ``worker`` (its heartbeat, deadlines, state, jobs held)."""
    params = {
        "worker": worker,
        "host": host,
        "pid": pid,
        "version": version,
        "queues": text_array(queues),
        "concurrency": concurrency,
        "execution": execution,
        "group_pid": group_pid,
        "state": state,
        "stale": float(stale),
        "expire": float(expire),
        "running": running,
        "commit": _commit(async_commit),
    }
    _execute(db, ANNOUNCE_WORKER, params)


# A clean stop: the worker is gone at once.
WITHDRAW_WORKER = (
    "DELETE FROM dbqueue_worker WHERE worker_id::text = %(worker)s::text RETURNING worker_id"
)


def withdraw_worker(db, worker):
    _execute(db, WITHDRAW_WORKER, {"worker": worker})


# The sweeper: rows of workers that stopped beating (kill -9, a lost host) past their expiry.
# Every listing already hides them (LIVE_WORKERS); this only keeps the table small. Several
# sweepers at once delete the same few rows; the loser finds them gone, which is harmless. The
# expiry test is the DELETE's own WHERE, so a row that its worker's heartbeat refreshed while
# this waited for its lock is re-checked in its new version and kept (a test of it in a
# subquery or CTE would read the old version and delete a live worker's row:
# tests/integration/test_worker_registry.py).
FORGET_EXPIRED_WORKERS = (
    "DELETE FROM dbqueue_worker WHERE expires_at < now() RETURNING worker_id, heartbeat_at"
)


def forget_expired_workers(db):
    """Delete the rows of workers past their expiry; returns ``[(worker_id, heartbeat_at)]``."""
    return _execute(db, FORGET_EXPIRED_WORKERS, {})


# The registry as shown by jobqueue_status, the admin and the metrics: unexpired rows, each with
# whether it is stale, the seconds since its last heartbeat, and the jobs the job table says it
# runs now (the running rows counted by worker_id, one pass over the running jobs' partial
# index).
LIVE_WORKERS = """
SELECT w.worker_id, w.host, w.pid, w.version, w.queues, w.concurrency, w.execution, w.group_pid,
       w.state, w.started_at, w.heartbeat_at, w.stale_at < now(),
       EXTRACT(EPOCH FROM now() - w.heartbeat_at)::float8, w.running, COALESCE(r.jobs, 0)
FROM dbqueue_worker AS w
LEFT JOIN (SELECT worker_id, count(*) AS jobs FROM dbqueue_job WHERE state::text = 'running'
           GROUP BY worker_id) AS r ON r.worker_id::text = w.worker_id::text
WHERE w.expires_at > now()
ORDER BY w.host, w.started_at, w.worker_id
LIMIT %(limit)s
"""


def live_workers(using, *, limit=1000):
    """``[(worker_id, host, pid, version, [queues], concurrency, execution, group_pid, state,
    started_at, heartbeat_at, stale, heartbeat_age_seconds, running_at_beat, running_now),
    ...]``: the unexpired rows of the registry, by host and start."""
    return _execute(using, LIVE_WORKERS, {"limit": limit})
