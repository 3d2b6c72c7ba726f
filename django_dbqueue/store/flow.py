"""Flow control (flow.py): pause and resume a queue for the fleet, the admin's queue rows,
and the flow state and rate windows that the status command and the admin show."""

from ._db import _execute, _execute_no_rows

# Pause or resume a queue for the whole fleet: the claims read dbqueue_queue (CLAIM_JOBS,
# dbqueue_claim_within_limits). A resume also wakes the queue's workers, in the same transaction
# (delivered at its commit; an operator action, not a hot path): payload "<count>:<queue>" as
# wakeup.payload builds it, counting the due jobs up to a bound, so a group wakes as many
# workers as there are jobs.
PAUSE_QUEUE = """
INSERT INTO dbqueue_queue (name, paused, changed_at, changed_by)
VALUES (%(name)s, true, now(), %(by)s)
ON CONFLICT (name) DO UPDATE
    SET paused = true, changed_at = now(), changed_by = EXCLUDED.changed_by
RETURNING paused
"""


def pause_queue(using, *, name, by):
    _execute(using, PAUSE_QUEUE, {"name": name, "by": by})


RESUME_QUEUE = """
WITH resumed AS (
    INSERT INTO dbqueue_queue (name, paused, changed_at, changed_by)
    VALUES (%(name)s, false, now(), %(by)s)
    ON CONFLICT (name) DO UPDATE
        SET paused = false, changed_at = now(), changed_by = EXCLUDED.changed_by
    RETURNING name
)
SELECT pg_notify(%(channel)s::text, (
           SELECT count(*) FROM (SELECT 1 FROM dbqueue_job
                                 WHERE state::text = 'pending' AND queue::text = %(name)s::text
                                   AND run_after <= now() LIMIT 1000) AS due
       )::text || ':' || name::text)
FROM resumed
"""


def resume_queue(using, *, name, by, channel):
    """Resume and wake the queue's workers (at the commit of the caller's transaction)."""
    _execute(using, RESUME_QUEUE, {"name": name, "by": by, "channel": channel})


# The admin's queue page lists a row per configured queue: create the missing ones, unpaused.
ENSURE_QUEUES = """
INSERT INTO dbqueue_queue (name, paused, changed_by)
SELECT name, false, '' FROM pg_catalog.unnest(%(names)s::text[]) AS name
ON CONFLICT (name) DO NOTHING
"""


def ensure_queues(using, names):
    _execute_no_rows(using, ENSURE_QUEUES, {"names": list(names)})


# What the status command and the admin show of each queue's flow: paused or not (with who and
# when), jobs running now, and per limiter row its rate window (starts in the period, and
# when the oldest of them leaves it: RATE_WINDOW). Small tables and the running partial index.
FLOW_STATE = """
SELECT 'queue', q.name, q.paused::int, q.changed_at, q.changed_by, NULL::float8
FROM dbqueue_queue AS q
UNION ALL
SELECT 'running-queue', queue, count(*)::int, NULL, NULL, NULL
FROM dbqueue_job WHERE state::text = 'running' GROUP BY queue
UNION ALL
SELECT 'running-type', type, count(*)::int, NULL, NULL, NULL
FROM dbqueue_job WHERE state::text = 'running' GROUP BY type
"""


def flow_state(using):
    """``{"queues": {name: (paused, changed_at, changed_by)}, "running_queue": {queue: n},
    "running_type": {type: n}}``."""
    state = {"queues": {}, "running_queue": {}, "running_type": {}}
    for kind, name, value, changed_at, changed_by, _ in _execute(using, FLOW_STATE, {}):
        if kind == "queue":
            state["queues"][name] = (bool(value), changed_at, changed_by or "")
        elif kind == "running-queue":
            state["running_queue"][name] = value
        elif kind == "running-type":
            state["running_type"][name] = value
    return state


# One rate window: the starts within %(period)s seconds and when the window has room again
# (NULL when it has room now). Served by the limiter's unique key.
RATE_WINDOW = """
SELECT x.room, x.reopen
FROM dbqueue_limiter AS l, dbqueue_rate_room(l.starts, %(limit)s::int, %(period)s::float8) AS x
WHERE l.scope::text = %(scope)s::text AND l.name::text = %(name)s::text
  AND l.part = %(part)s::text
"""


def rate_window(using, *, scope, name, part, limit, period):
    """When the rate window of a limiter row has room again (database time), or ``None`` when
    it has room now (or has no row yet)."""
    params = {"scope": scope, "name": name, "part": part, "limit": limit, "period": period}
    rows = _execute(using, RATE_WINDOW, params)
    return rows[0][1] if rows and rows[0][0] <= 0 else None
