"""Thin functions that run the statements of ``sql.py``: the only writers of job state.

Each takes the database alias and plain values and returns plain values; none builds an ORM
instance. They run on the calling thread's Django connection, so inside ``transaction.atomic``
they take part in the caller's transaction.
"""

import json
import logging
from dataclasses import dataclass

from django.db import connections

from . import sql

logger = logging.getLogger("django_dbqueue")


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    id: int
    type: str
    queue: str
    payload_json: str
    attempt: int
    max_attempts: int
    lease_seconds: float
    idempotency_key: str | None
    priority: int
    created_at: object


def _execute(db, statement, params):
    """Run on ``db``: a database alias (this thread's Django connection) or a worker Session."""
    if not isinstance(db, str):
        return db.execute(statement, params)
    with connections[db].cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall()


def insert_job(using, **values):
    """Insert one job; returns ``(id, due)``, or ``None`` when its idempotency key already exists.

    ``due``: the job may run now by the database's clock (it is not scheduled for later)."""
    scheduled = values["run_after"] is not None or values["delay"]
    if values["key"] is None:
        statement = sql.INSERT_JOB_SCHEDULED if scheduled else sql.INSERT_JOB
    else:
        statement = sql.INSERT_JOB_SCHEDULED_WITH_KEY if scheduled else sql.INSERT_JOB_WITH_KEY
    rows = _execute(using, statement, values)
    return rows[0] if rows else None


def insert_jobs(using, *, columns):
    """Insert many jobs in one statement; returns ``(id, key, queue, due)`` per row inserted."""
    return _execute(using, sql.INSERT_JOBS, columns)


def notify_workers(using, *, channel, payloads):
    """Send one notification per payload on ``channel`` as a transaction of its own that does not
    wait for the WAL flush. Only on a connection in autocommit, outside any transaction."""
    _execute(using, sql.NOTIFY_WORKERS, {"channel": channel, "payloads": list(payloads)})


def notify_workers_at_commit(using, *, channel, payloads):
    """The same, inside the caller's open transaction: delivered when they commit it."""
    _execute(using, sql.NOTIFY_WORKERS_AT_COMMIT, {"channel": channel, "payloads": list(payloads)})


def ids_by_keys(using, keys):
    return dict(_execute(using, sql.SELECT_IDS_BY_KEYS, {"keys": list(keys)}))


def claim(using, *, worker_id, queues, limits, limit):
    """Claim up to ``limit`` due jobs from ``queues`` (``limits``: the cap of each queue)."""
    rows = _execute(
        using,
        sql.CLAIM_JOBS,
        {"worker": worker_id, "queues": list(queues), "limits": list(limits), "limit": limit},
    )
    return [ClaimedRow(*row) for row in rows]


def complete(using, acks, *, worker):
    """Mark ``[(id, attempt, result_json_or_None), ...]`` done; returns the set of ids that matched.

    An id missing from the result was fenced out: its lease was lost and the job claimed again.
    """
    if not acks:
        return set()
    ids, attempts, results = zip(*acks, strict=True)
    rows = _execute(
        using,
        sql.COMPLETE_JOBS,
        {"ids": list(ids), "attempts": list(attempts), "results": list(results), "worker": worker},
    )
    return {row[0] for row in rows}


def fail(using, *, job_id, attempt, worker, error, delay, dead=False):
    """Record a failed attempt: retry after ``delay`` seconds, or dead (spent or ``dead=True``).

    Returns the new state, or ``None`` when the write was fenced out.
    """
    rows = _execute(
        using,
        sql.FAIL_JOB,
        {
            "id": job_id,
            "attempt": attempt,
            "worker": worker,
            "error": json.dumps(error),
            "delay": float(delay),
            "dead": bool(dead),
        },
    )
    return rows[0][0] if rows else None


def extend_leases(using, held, *, worker):
    """Heartbeat ``[(id, attempt), ...]``; returns the ids whose lease this worker still holds."""
    if not held:
        return set()
    ids, attempts = zip(*held, strict=True)
    params = {"ids": list(ids), "attempts": list(attempts), "worker": worker}
    rows = _execute(using, sql.EXTEND_LEASES, params)
    return {row[0] for row in rows}


def release(using, held, *, worker):
    """Return ``[(id, attempt), ...]`` to pending without spending the attempt."""
    if not held:
        return set()
    ids, attempts = zip(*held, strict=True)
    params = {"ids": list(ids), "attempts": list(attempts), "worker": worker}
    rows = _execute(using, sql.RELEASE_JOBS, params)
    return {row[0] for row in rows}


def rescue_expired(using, *, limit, base, factor, cap):
    """Take back up to ``limit`` expired leases; returns ``[(id, type, attempts, state, worker,
    queue)]``."""
    return _execute(
        using,
        sql.RESCUE_EXPIRED,
        {"limit": limit, "base": float(base), "factor": float(factor), "cap": float(cap)},
    )


def count_due(using, queues, bound=10000):
    return _execute(using, sql.COUNT_DUE, {"queues": list(queues), "bound": bound})[0][0]


def requeue(using, ids):
    """Dead or cancelled jobs back to pending with attempts reset; returns ``{id: queue}`` of the
    jobs moved (the caller wakes their queues: ``wakeup.jobs_ready``)."""
    return dict(_execute(using, sql.REQUEUE_JOBS, {"ids": list(ids)}))


def run_now(using, ids):
    """Scheduled pending jobs due now; returns ``{id: queue}`` of the jobs moved."""
    return dict(_execute(using, sql.RUN_JOBS_NOW, {"ids": list(ids)}))


def cancel(using, ids):
    """Pending jobs to cancelled; returns the ids moved."""
    return {row[0] for row in _execute(using, sql.CANCEL_JOBS, {"ids": list(ids)})}


def dead_ids(using, *, after=0, job_type=None, queue=None, limit=1000):
    params = {"after": after, "type": job_type, "queue": queue, "limit": limit}
    return [row[0] for row in _execute(using, sql.SELECT_DEAD_IDS, params)]


def count_dead(using, *, job_type=None, queue=None):
    return _execute(using, sql.COUNT_DEAD, {"type": job_type, "queue": queue})[0][0]


def prune(using, *, state, age, limit):
    """Delete up to ``limit`` ``state`` jobs finished more than ``age`` seconds ago; returns n."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.PRUNE_FINISHED, {"state": state, "age": float(age), "limit": limit})
        return cursor.rowcount


def _empty_status():
    return {
        "pending": 0,
        "running": 0,
        "dead": 0,
        "stuck": 0,
        "scheduled": 0,
        "oldest_due_seconds": None,
    }


def status(using, queues=()):
    """Per-queue counts: ``{queue: {"pending", "running", "dead", "stuck", "scheduled",
    "oldest_due_seconds"}}``, with a zero entry for each of ``queues`` that has no live job.
    ``pending`` is due now; ``scheduled`` is pending with a future ``run_after``; ``stuck`` is
    running past its lease."""
    result = {queue: _empty_status() for queue in queues}
    for queue, state, count, stuck, oldest_due, scheduled in _execute(using, sql.STATUS_COUNTS, {}):
        entry = result.setdefault(queue, _empty_status())
        # "pending" counts what is due now; pending jobs scheduled for later are "scheduled".
        entry[state] = count - scheduled
        entry["stuck"] += stuck
        entry["scheduled"] += scheduled
        if oldest_due is not None:
            entry["oldest_due_seconds"] = float(oldest_due)
    return result


def lock_schedule(using, name):
    """Inside a transaction: ``(last_tick, now)`` of a schedule entry, or ``None`` when another
    worker holds it."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.ENSURE_SCHEDULE, {"name": name})
        cursor.execute(sql.LOCK_SCHEDULE, {"name": name})
        return cursor.fetchone()


def advance_schedule(using, name, tick):
    _execute_no_rows(using, sql.ADVANCE_SCHEDULE, {"name": name, "tick": tick})


def schedule_state(using):
    """``({name: last_tick}, now)``."""
    rows = _execute(using, sql.SCHEDULE_STATE, {})
    return {name: last for name, last, _ in rows if name is not None}, rows[0][2]


def task_result_row(using, job_id, job_type):
    rows = _execute(using, sql.SELECT_TASK_RESULT, {"id": job_id, "type": job_type})
    return rows[0] if rows else None


def _execute_no_rows(using, statement, params):
    with connections[using].cursor() as cursor:
        cursor.execute(statement, params)
