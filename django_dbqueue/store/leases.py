"""Leases: the heartbeat's extension, the release of jobs handed back (shutdown, a lost
connection), and the sweeper's rescue of expired leases."""

from .. import names
from ._db import _commit, _execute, dependents_free, int_array

# Heartbeat: push the lease of every job this worker still runs forward by the job's lease.
# Fenced; a job missing from the answer was taken back by the sweeper and belongs to someone else.
# Each row also says whether a cancel was asked for: the heartbeat is the backstop that tells
# the worker within one HEARTBEAT_INTERVAL when the cancel notification was missed, at no extra
# round trip.
# It never waits for a row lock (docs/concepts/worker.md#callers-transactions): the rows are
# locked first with SKIP LOCKED, so a row that a caller's transaction holds (a
# select_for_update(), a signal or cancel whose deferred trigger ran early, a workflow linking a
# dependent to it) is passed over, and the leases of every other job are renewed at once. Such a
# row comes back with renewed = false ("busy": still this claim's in the statement's snapshot),
# so the worker keeps the job and renews it at a later beat; the sweeper leaves the expired
# lease of a live worker's job alone meanwhile (RESCUE_EXPIRED). A waiting UPDATE would have
# held the worker's only connection, and with it every other lease, until the caller's commit.
EXTEND_LEASES = """
WITH commit_mode AS MATERIALIZED (
    SELECT set_config('synchronous_commit'::text,
                      COALESCE(%(commit)s::text, current_setting('synchronous_commit'::text)),
                      true)
),
held AS MATERIALIZED (
    SELECT j.id
    FROM ROWS FROM (pg_catalog.unnest(%(ids)s::bigint[]), pg_catalog.unnest(%(tokens)s::bigint[])) AS h(id, token)
    JOIN dbqueue_job AS j ON j.id = h.id AND j.lease_token = h.token
    WHERE j.state::text = 'running'
    ORDER BY j.id
    FOR NO KEY UPDATE OF j SKIP LOCKED
),
renewed AS (
    UPDATE dbqueue_job AS j
    SET leased_until = now() + j.lease_seconds * interval '1 second'
    FROM commit_mode
    WHERE j.id = ANY(ARRAY(SELECT id FROM held))
    RETURNING j.id, j.lease_token, j.cancel_requested_at IS NOT NULL AS cancelling
)
SELECT id, lease_token, cancelling, true FROM renewed
UNION ALL
SELECT h.id, h.token, false, false
FROM ROWS FROM (pg_catalog.unnest(%(ids)s::bigint[]), pg_catalog.unnest(%(tokens)s::bigint[])) AS h(id, token)
WHERE NOT (h.id = ANY(ARRAY(SELECT id FROM held)))
  AND EXISTS (SELECT 1 FROM dbqueue_job AS v
              WHERE v.id = h.id AND v.lease_token = h.token AND v.state::text = 'running')
"""


def renew_leases(using, held, *, async_commit=False):
    """Heartbeat ``[(id, token), ...]``: returns ``(kept, busy)``. ``kept``: ``{(id, token):
    True when a cancel was asked for}`` of the leases renewed; ``busy``: the ``(id, token)``
    still held under this claim but locked by another transaction, not renewed this time. A
    key in neither was taken back (the sweeper) or ended. Keyed by (id, token): a worker may
    hold an old run of a job beside a new claim of it (swept back and claimed again while the
    old run's thread still runs), and only the new claim's lease is renewed."""
    if not held:
        return {}, set()
    ids, tokens = zip(*held, strict=True)
    params = {"ids": int_array(ids), "tokens": int_array(tokens), "commit": _commit(async_commit)}
    kept, busy = {}, set()
    for job_id, token, cancelling, renewed in _execute(using, EXTEND_LEASES, params):
        if renewed:
            kept[(job_id, token)] = cancelling
        else:
            busy.add((job_id, token))
    return kept, busy


def extend_leases(using, held, *, async_commit=False, by_token=False):
    """:func:`renew_leases`, returning the renewed ones only, as ``{id: True when a cancel was
    asked for}`` (``{(id, token): ...}`` with ``by_token``)."""
    kept, _busy = renew_leases(using, held, async_commit=async_commit)
    if by_token:
        return kept
    return {job_id: cancelling for (job_id, _token), cancelling in kept.items()}


# The check of a cancel notification, which is only a hint (NOTIFY needs no privilege): of the
# jobs held under these leases, those whose cancel was asked for. A plain read: it waits for no
# row lock and writes nothing.
CANCELS_REQUESTED = """
SELECT j.id
FROM ROWS FROM (pg_catalog.unnest(%(ids)s::bigint[]), pg_catalog.unnest(%(tokens)s::bigint[])) AS h(id, token)
JOIN dbqueue_job AS j ON j.id = h.id AND j.lease_token = h.token
WHERE j.state::text = 'running' AND j.cancel_requested_at IS NOT NULL
ORDER BY j.id
"""


def cancels_requested(using, held):
    """Of the jobs held under ``[(id, token), ...]``, the ids whose cancel was asked for."""
    if not held:
        return []
    ids, tokens = zip(*held, strict=True)
    params = {"ids": int_array(ids), "tokens": int_array(tokens)}
    return [row[0] for row in _execute(using, CANCELS_REQUESTED, params)]


def release(using, held):
    """Return ``[(id, token), ...]`` to pending without spending the attempt; returns the ids.

    A job whose cancel was asked for ends cancelled instead (see :func:`release_ending`)."""
    return set(release_ending(using, held))


# Graceful shutdown: hand jobs back without spending the attempt the claim took (jobs never
# started, and runs still going after the grace: docs/concepts/shutdown.md). Fenced like the
# rest. (The count stops at 0: a running row whose attempts were written 0 by hand would make
# it negative, and the CHECK on attempts would fail the release of every job in the batch.) A job whose cancel was asked for is not handed back: it ends cancelled (the SET
# expressions read the row's old values).
# It never waits for a row lock: the rows are locked first with SKIP LOCKED, and one that a
# caller's transaction holds comes back 'busy' (still this claim's in the statement's snapshot),
# for the worker to try again (shutdown.release) while it writes everything else; so does a job
# ending cancelled whose workflow dependent a caller holds (DEPENDENTS_FREE).
RELEASE_JOBS = """
WITH mine AS MATERIALIZED (
    SELECT j.id, j.dependents, j.cancel_requested_at IS NOT NULL AS ending
    FROM ROWS FROM (pg_catalog.unnest(%(ids)s::bigint[]), pg_catalog.unnest(%(tokens)s::bigint[])) AS r(id, token)
    JOIN dbqueue_job AS j ON j.id = r.id AND j.lease_token = r.token
    WHERE j.state::text = 'running'
    ORDER BY j.id
    FOR NO KEY UPDATE OF j SKIP LOCKED
),
{FREE},
released AS (
    UPDATE dbqueue_job AS j
    SET state = CASE WHEN j.cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
        attempts = CASE WHEN j.cancel_requested_at IS NULL THEN GREATEST(j.attempts - 1, 0)
                        ELSE j.attempts END,
        finished_at = CASE WHEN j.cancel_requested_at IS NULL THEN NULL ELSE now() END,
        leased_until = NULL,
        worker_id = CASE WHEN j.cancel_requested_at IS NULL THEN NULL ELSE j.worker_id END,
        lease_token = CASE WHEN j.cancel_requested_at IS NULL THEN NULL ELSE j.lease_token END
    WHERE j.id = ANY(ARRAY(SELECT id FROM free))
    RETURNING j.id, j.state::text AS state
)
SELECT id, state FROM released
UNION ALL
SELECT r.id, 'busy'
FROM ROWS FROM (pg_catalog.unnest(%(ids)s::bigint[]), pg_catalog.unnest(%(tokens)s::bigint[])) AS r(id, token)
WHERE NOT (r.id = ANY(ARRAY(SELECT id FROM free)))
  AND EXISTS (SELECT 1 FROM dbqueue_job AS v
              WHERE v.id = r.id AND v.lease_token = r.token AND v.state::text = 'running')
""".replace("{FREE}", dependents_free("m.ending"))


def hand_back(using, held):
    """Release ``[(id, token), ...]`` (:data:`RELEASE_JOBS`): returns ``(ended, busy)``,
    ``{id: "pending" or "cancelled"}`` and the ids locked by another transaction (not
    released; try again)."""
    if not held:
        return {}, set()
    ids, tokens = zip(*held, strict=True)
    rows = _execute(using, RELEASE_JOBS, {"ids": int_array(ids), "tokens": int_array(tokens)})
    ended = {job_id: state for job_id, state in rows if state != "busy"}
    return ended, {job_id for job_id, state in rows if state == "busy"}


def release_ending(using, held):
    """:func:`release`, returning ``{id: "pending" or "cancelled"}``."""
    return hand_back(using, held)[0]


# After a lost connection: a claim can commit while its reply is lost, which leaves jobs running
# under this worker that it never heard of (they would sit out their lease and spend an attempt
# that never ran). Hand back every job this worker holds except those it knows. Served by the
# partial index on running jobs. A job whose cancel was asked for ends cancelled instead.
# SKIP LOCKED like RELEASE_JOBS: a row a caller's transaction holds (or, for a job ending
# cancelled, a dependent's) comes back not released (false), for the worker to try again later
# instead of waiting on its only connection.
RELEASE_UNKNOWN_JOBS = """
WITH mine AS MATERIALIZED (
    SELECT id, dependents, cancel_requested_at IS NOT NULL AS ending FROM dbqueue_job
    WHERE state::text = 'running' AND worker_id::text = %(worker)s::text
      AND NOT (lease_token = ANY(%(known)s::bigint[]))
    FOR NO KEY UPDATE SKIP LOCKED
),
{FREE},
released AS (
    UPDATE dbqueue_job
    SET state = CASE WHEN cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
        attempts = CASE WHEN cancel_requested_at IS NULL THEN GREATEST(attempts - 1, 0)
                        ELSE attempts END,
        finished_at = CASE WHEN cancel_requested_at IS NULL THEN NULL ELSE now() END,
        leased_until = NULL, worker_id = NULL, lease_token = NULL
    WHERE id = ANY(ARRAY(SELECT id FROM free))
    RETURNING id
)
SELECT id, true FROM released
UNION ALL
SELECT id, false FROM dbqueue_job
WHERE state::text = 'running' AND worker_id::text = %(worker)s::text
  AND NOT (lease_token = ANY(%(known)s::bigint[]))
  AND NOT (id = ANY(ARRAY(SELECT id FROM free)))
""".replace("{FREE}", dependents_free("m.ending"))


def hand_back_unknown(using, *, worker, known):
    """Release every job running under ``worker`` whose token is not in ``known``: returns
    ``(released ids, busy ids)``, the busy ones locked by another transaction (try again)."""
    params = {"worker": worker, "known": int_array(known)}
    rows = _execute(using, RELEASE_UNKNOWN_JOBS, params)
    return {i for i, done in rows if done}, {i for i, done in rows if not done}


def release_unknown(using, *, worker, known):
    """Release every job running under ``worker`` whose token is not in ``known``; returns ids."""
    return hand_back_unknown(using, worker=worker, known=known)[0]


# The sweeper: jobs whose lease ran out (their worker died or hung) go back to pending, after the
# default backoff with full jitter, or to dead when their attempts are spent. The attempt that
# expired counts and is recorded as an error. (The exponent is clamped so power() cannot
# overflow.) Bounded, and SKIP LOCKED so several workers sweeping at once split the work instead
# of queueing behind each other, and so that a row a caller's transaction holds is passed over.
# A job whose cancel was asked for (its worker died before it learned, or before it wrote the
# end) ends cancelled. A django.tasks job also returns its task's path, for the name it is
# logged under.
# Not the expired lease of a job whose worker is alive (docs/concepts/worker.md#callers-
# transactions): a live worker's heartbeat renews every lease it holds except the rows that a
# caller's transaction locks, which it cannot renew until that commits; the job still runs
# there, and taking it back would run it twice. So a job is taken back when its worker's row in
# the registry (presence.py) is stale or gone (killed, hung, cut off from the database, stopped),
# or when it is this worker's own (%(worker)s) and not one it holds (%(known)s: the lease tokens
# of its runs and unwritten outcomes; a run whose outcome it gave up writing). %(worker)s is NULL
# for a sweeper outside a worker, and while a worker recovers from a lost connection (it does
# not know yet what a lost claim took: it hands those back itself, unspent).
# A job going dead or cancelled whose workflow dependent another transaction holds is left
# for a later sweep (DEPENDENTS_FREE): its trigger would wait for that row, and the session's
# lock_timeout would fail the whole sweep, every other expired lease with it.
RESCUE_EXPIRED = """
WITH mine AS MATERIALIZED (
    SELECT j.id, j.dependents,
           j.cancel_requested_at IS NOT NULL OR j.attempts >= j.max_attempts AS ending
    FROM dbqueue_job AS j
    WHERE j.state::text = 'running' AND j.leased_until < now()
      AND ((j.worker_id::text = %(worker)s::text
            AND NOT (j.lease_token = ANY(%(known)s::bigint[])))
           OR NOT EXISTS (SELECT 1 FROM dbqueue_worker AS w
                          WHERE w.worker_id::text = j.worker_id::text AND w.stale_at > now()))
    ORDER BY j.leased_until
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
),
{FREE}
UPDATE dbqueue_job AS j
SET state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                 WHEN j.attempts >= j.max_attempts THEN 'dead' ELSE 'pending' END,
    finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL
                            OR j.attempts >= j.max_attempts THEN now() END,
    run_after = CASE WHEN j.cancel_requested_at IS NOT NULL OR j.attempts >= j.max_attempts
                     THEN j.run_after
                     ELSE now() + random() * LEAST(
                              %(cap)s::float8,
                              %(base)s::float8 * power(
                                  %(factor)s::float8,
                                  LEAST(GREATEST(j.attempts - 1, 0), 50)::float8))
                                  * interval '1 second' END,
    leased_until = NULL,
    lease_token = NULL,
    errors = j.errors || pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
        'attempt', j.attempts,
        'class', 'LeaseExpired',
        'message', 'lease expired at ' || j.leased_until::text || ' while held by worker '
                   || COALESCE(j.worker_id::text, '?')
                   || '; the worker died, hung or lost the database',
        'traceback', '',
        'worker', j.worker_id,
        'at', now()))
FROM free AS expired
WHERE j.id = expired.id
RETURNING j.id, j.type, j.attempts, j.state, j.worker_id, j.queue, j.cancelled_by,
          CASE WHEN j.type::text = 'django.tasks'
                    AND jsonb_typeof(j.payload -> 'task'::text) = 'string'
               THEN j.payload ->> 'task'::text END
""".replace("{FREE}", dependents_free("m.ending"))


def rescue_expired(using, *, limit, base, factor, cap, worker=None, known=()):
    """Take back up to ``limit`` expired leases; returns ``[(id, type, attempts, state, worker,
    queue, cancelled_by, name)]`` (state ``cancelled`` for a job whose cancel was asked for;
    ``name``: names.label, the type or a known django.tasks task's path). Jobs of live workers
    are left to them, except ``worker``'s own whose tokens are not in ``known``."""
    params = {
        "limit": limit,
        "base": float(base),
        "factor": float(factor),
        "cap": float(cap),
        "worker": worker,
        "known": int_array(known),
    }
    rows = _execute(using, RESCUE_EXPIRED, params)
    return [(*row[:7], names.label(row[1], {"task": row[7]})) for row in rows]
