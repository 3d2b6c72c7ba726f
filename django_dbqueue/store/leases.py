"""Leases: the heartbeat's extension, the release of jobs handed back (shutdown, a lost
connection), and the sweeper's rescue of expired leases."""

from .. import names
from ._db import _commit, _execute, int_array

# Heartbeat: push the lease of every job this worker still runs forward by the job's lease.
# Fenced; a job missing from RETURNING was taken back by the sweeper and belongs to someone else.
# Each row also says whether a cancel was asked for: the heartbeat is the backstop that tells
# the worker within one HEARTBEAT_INTERVAL when the cancel notification was missed, at no extra
# round trip.
EXTEND_LEASES = """
WITH commit_mode AS MATERIALIZED (
    SELECT set_config('synchronous_commit',
                      COALESCE(%(commit)s, current_setting('synchronous_commit')), true)
)
UPDATE dbqueue_job AS j
SET leased_until = now() + j.lease_seconds * interval '1 second'
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS h(id, token), commit_mode
WHERE j.id = h.id AND j.lease_token = h.token AND j.state = 'running'
RETURNING j.id, j.lease_token, j.cancel_requested_at IS NOT NULL
"""


def extend_leases(using, held, *, async_commit=False, by_token=False):
    """Heartbeat ``[(id, token), ...]``; returns the ids whose lease this worker still holds,
    as ``{id: True when a cancel was asked for}`` (so ``id in result`` reads as before). With
    ``by_token`` the keys are ``(id, token)``: a worker may hold an old run of a job beside a
    new claim of it (swept back and claimed again while the old run's thread still runs), and
    only the new claim's lease was renewed."""
    if not held:
        return {}
    ids, tokens = zip(*held, strict=True)
    params = {"ids": int_array(ids), "tokens": int_array(tokens), "commit": _commit(async_commit)}
    rows = _execute(using, EXTEND_LEASES, params)
    if by_token:
        return {(job_id, token): cancelling for job_id, token, cancelling in rows}
    return {job_id: cancelling for job_id, _token, cancelling in rows}


def release(using, held):
    """Return ``[(id, token), ...]`` to pending without spending the attempt; returns the ids.

    A job whose cancel was asked for ends cancelled instead (see :func:`release_ending`)."""
    return set(release_ending(using, held))


# Graceful shutdown: hand jobs that never finished back without spending the attempt the claim
# took. Fenced like the rest. A job whose cancel was asked for is not handed back: it ends
# cancelled (the SET expressions read the row's old values).
RELEASE_JOBS = """
UPDATE dbqueue_job AS j
SET state = CASE WHEN j.cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
    attempts = CASE WHEN j.cancel_requested_at IS NULL THEN j.attempts - 1 ELSE j.attempts END,
    finished_at = CASE WHEN j.cancel_requested_at IS NULL THEN NULL ELSE now() END,
    leased_until = NULL,
    worker_id = CASE WHEN j.cancel_requested_at IS NULL THEN NULL ELSE j.worker_id END,
    lease_token = CASE WHEN j.cancel_requested_at IS NULL THEN NULL ELSE j.lease_token END
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS r(id, token)
WHERE j.id = r.id AND j.lease_token = r.token AND j.state = 'running'
RETURNING j.id, j.state
"""


def release_ending(using, held):
    """:func:`release`, returning ``{id: "pending" or "cancelled"}``."""
    if not held:
        return {}
    ids, tokens = zip(*held, strict=True)
    rows = _execute(using, RELEASE_JOBS, {"ids": list(ids), "tokens": list(tokens)})
    return dict(rows)


# After a lost connection: a claim can commit while its reply is lost, which leaves jobs running
# under this worker that it never heard of (they would sit out their lease and spend an attempt
# that never ran). Hand back every job this worker holds except those it knows. Served by the
# partial index on running jobs. A job whose cancel was asked for ends cancelled instead.
RELEASE_UNKNOWN_JOBS = """
UPDATE dbqueue_job
SET state = CASE WHEN cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
    attempts = CASE WHEN cancel_requested_at IS NULL THEN attempts - 1 ELSE attempts END,
    finished_at = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE now() END,
    leased_until = NULL, worker_id = NULL, lease_token = NULL
WHERE state = 'running' AND worker_id = %(worker)s
  AND NOT (lease_token = ANY(%(known)s::bigint[]))
RETURNING id
"""


def release_unknown(using, *, worker, known):
    """Release every job running under ``worker`` whose token is not in ``known``; returns ids."""
    rows = _execute(using, RELEASE_UNKNOWN_JOBS, {"worker": worker, "known": list(known)})
    return {row[0] for row in rows}


# The sweeper: jobs whose lease ran out (their worker died or hung) go back to pending, after the
# default backoff with full jitter, or to dead when their attempts are spent. The attempt that
# expired counts and is recorded as an error. (The exponent is clamped so power() cannot overflow.) Bounded, and SKIP LOCKED so several workers sweeping
# at once split the work instead of queueing behind each other. A job whose cancel was asked
# for (its worker died before it learned, or before it wrote the end) ends cancelled.
# A django.tasks job also returns its task's path, for the name it is logged under.
RESCUE_EXPIRED = """
WITH expired AS MATERIALIZED (
    SELECT id FROM dbqueue_job
    WHERE state = 'running' AND leased_until < now()
    ORDER BY leased_until
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE dbqueue_job AS j
SET state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                 WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'pending' END,
    finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL
                            OR j.attempts >= j.max_attempts THEN now() END,
    run_after = CASE WHEN j.cancel_requested_at IS NOT NULL OR j.attempts >= j.max_attempts
                     THEN j.run_after
                     ELSE now() + random() * LEAST(%(cap)s, %(base)s * power(%(factor)s,
                                                   LEAST(GREATEST(j.attempts - 1, 0), 50)))
                                  * interval '1 second' END,
    leased_until = NULL,
    lease_token = NULL,
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempts,
        'class', 'LeaseExpired',
        'message', 'lease expired at ' || j.leased_until::text || ' while held by worker '
                   || COALESCE(j.worker_id, '?') || '; the worker died, hung or lost the database',
        'traceback', '',
        'worker', j.worker_id,
        'at', now()))
FROM expired
WHERE j.id = expired.id
RETURNING j.id, j.type, j.attempts, j.state, j.worker_id, j.queue, j.cancelled_by,
          CASE WHEN j.type = 'django.tasks' AND jsonb_typeof(j.payload -> 'task') = 'string'
               THEN j.payload ->> 'task' END
"""


def rescue_expired(using, *, limit, base, factor, cap):
    """Take back up to ``limit`` expired leases; returns ``[(id, type, attempts, state, worker,
    queue, cancelled_by, name)]`` (state ``cancelled`` for a job whose cancel was asked for;
    ``name``: names.label, the type or a known django.tasks task's path)."""
    rows = _execute(
        using,
        RESCUE_EXPIRED,
        {"limit": limit, "base": float(base), "factor": float(factor), "cap": float(cap)},
    )
    return [(*row[:7], names.label(row[1], {"task": row[7]})) for row in rows]
