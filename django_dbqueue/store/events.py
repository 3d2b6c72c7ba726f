"""Publish and subscribe (docs/events.md): an event and its subscribers' jobs in one statement,
the replay of an event to more subscribers, an event's jobs, and the prune of events that no
job refers to any more."""

from ._db import _execute, int_array, text_array
from .wakeups import WAKEUPS_WANTED

# A subscriber's job is keyed by its event and its type, so that one event never makes two jobs
# of one subscriber: a replay that names a subscriber that has its job inserts nothing.
JOB_KEY = "'dbqueue:event:' || e.id || ':' || u.type"

# The subscribers' jobs of the event ``e``, one per element of the arrays (each subscriber's
# queue, priority, attempts, lease and serial key, from its @job), all due now, each with the
# event's payload and its event_id.
_SUBSCRIBER_JOBS = f"""
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts,
    lease_seconds, idempotency_key, errors, created_at, serial_key, traceparent, event_id
)
SELECT u.type, u.queue, e.payload, 'pending', u.priority, now(), 0, u.max_attempts, u.lease,
       {JOB_KEY}, '[]'::jsonb, now(), u.serial_key, %(traceparent)s, e.id
FROM event AS e CROSS JOIN unnest(
    %(types)s::text[], %(queues)s::text[], %(priorities)s::smallint[], %(max_attempts)s::int[],
    %(leases)s::float8[], %(serial_keys)s::text[]
) WITH ORDINALITY AS u(type, queue, priority, max_attempts, lease, serial_key, ord)
ORDER BY u.ord
"""

# publish(): the event and its subscribers' jobs, one round trip in the caller's transaction,
# so that they commit or roll back together. With an idempotency key, the event's partial
# unique index (name, key) is the ON CONFLICT arbiter: a second publisher of the key waits for
# the first's transaction; if it commits, this inserts no event, hence no job, and returns no
# row (the caller then reads the existing event); if it rolls back, this one inserts. An event
# with no subscriber returns one row with a NULL job. Each queue's ``wanted`` says whether a
# worker waits for its wake-up (store/wakeups.py), as for enqueue_many.
PUBLISH_EVENT = f"""
WITH event AS (
    INSERT INTO dbqueue_event (name, payload, idempotency_key, subscribers, published_at)
    VALUES (%(name)s, %(payload)s::jsonb, %(key)s, %(subscribers)s::jsonb, now())
    ON CONFLICT (name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, payload
),
inserted AS (
{_SUBSCRIBER_JOBS}
RETURNING id, type, queue
),
wanted AS MATERIALIZED ({WAKEUPS_WANTED})
SELECT e.id, i.id, i.type, i.queue, w.wanted
FROM event AS e LEFT JOIN inserted AS i ON true LEFT JOIN wanted AS w USING (queue)
"""


def publish_event(using, **values):
    """Insert an event and its subscribers' jobs; returns ``[(event_id, job_id, type, queue,
    wanted), ...]`` (one row with ``job_id`` None for an event with no subscriber), or ``[]``
    when an event of that name already holds the idempotency key."""
    return _execute(using, PUBLISH_EVENT, _params(values))


def _params(values):
    return {
        **values,
        "types": text_array(values["types"]),
        "queues": text_array(values["queues"]),
        "priorities": int_array(values["priorities"]),
        "max_attempts": int_array(values["max_attempts"]),
        "leases": "{" + ",".join(repr(float(lease)) for lease in values["leases"]) + "}",
        "serial_keys": text_array(values["serial_keys"]),
    }


# An event already published under (name, key), with the jobs that refer to it now.
SELECT_EVENT_BY_KEY = """
SELECT e.id, j.id, j.type, j.queue
FROM dbqueue_event AS e LEFT JOIN dbqueue_job AS j ON j.event_id = e.id
WHERE e.name = %(name)s AND e.idempotency_key = %(key)s
ORDER BY j.id
"""


def event_by_key(using, name, key):
    """``[(event_id, job_id, type, queue), ...]`` of the event ``name`` holding ``key`` (one row
    with ``job_id`` None when no job refers to it), or ``[]``."""
    return _execute(using, SELECT_EVENT_BY_KEY, {"name": name, "key": key})


# replay_event(): jobs for the subscribers named, of an event published before they existed (or
# whose job was pruned). The event's row is locked first, so a concurrent prune (SKIP LOCKED)
# leaves it, and two replays of one event take turns; a subscriber that has its job (the key of
# (event, type)) gets nothing new. The event's subscriber list gains the types that got a job.
REPLAY_EVENT = f"""
WITH event AS (
    SELECT id, payload, subscribers FROM dbqueue_event WHERE id = %(event)s FOR UPDATE
),
inserted AS (
{_SUBSCRIBER_JOBS}
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, type, queue
),
noted AS (
    UPDATE dbqueue_event AS d
    SET subscribers = d.subscribers || COALESCE(
        (SELECT jsonb_agg(i.type ORDER BY i.id) FROM inserted AS i
         WHERE NOT d.subscribers ? i.type),
        '[]'::jsonb)
    WHERE d.id = (SELECT id FROM event)
    RETURNING d.id
),
wanted AS MATERIALIZED ({WAKEUPS_WANTED})
SELECT e.id, i.id, i.type, i.queue, w.wanted
FROM event AS e LEFT JOIN inserted AS i ON true LEFT JOIN wanted AS w USING (queue)
"""


def replay_event(using, **values):
    """Insert the jobs of the subscribers named that have none for the event; returns rows as
    :func:`publish_event` does, or ``[]`` when the event does not exist."""
    return _execute(using, REPLAY_EVENT, _params(values))


# An event's name, payload and the jobs that refer to it (replay, the admin, status).
SELECT_EVENT = """
SELECT e.name, e.payload::text, e.idempotency_key, e.subscribers::text, e.published_at
FROM dbqueue_event AS e WHERE e.id = %(event)s
"""
SELECT_EVENT_JOBS = """
SELECT id, type, queue, state, attempts FROM dbqueue_job WHERE event_id = %(event)s ORDER BY id
"""


def event(using, event_id):
    """``(name, payload JSON text, key, subscribers JSON text, published_at)``, or ``None``."""
    rows = _execute(using, SELECT_EVENT, {"event": event_id})
    return rows[0] if rows else None


def event_jobs(using, event_id):
    """``[(id, type, queue, state, attempts), ...]`` of the jobs that refer to the event."""
    return _execute(using, SELECT_EVENT_JOBS, {"event": event_id})


# The prune: events older than the retention that no job refers to any more (their jobs were
# pruned, or they had no subscriber). SKIP LOCKED leaves an event that a replay holds; a job
# inserted by a transaction not committed yet holds the event's row too (a replay locks it; a
# publish's own event is not visible to this statement before it commits).
PRUNE_EVENTS = """
DELETE FROM dbqueue_event WHERE id IN (
    SELECT e.id FROM dbqueue_event AS e
    WHERE e.published_at < now() - %(age)s * interval '1 second'
      AND NOT EXISTS (SELECT 1 FROM dbqueue_job AS j WHERE j.event_id = e.id)
    ORDER BY e.published_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id
"""


def prune_events(using, *, age, limit):
    """Delete up to ``limit`` events older than ``age`` seconds that no job refers to; returns
    how many."""
    return len(_execute(using, PRUNE_EVENTS, {"age": float(age), "limit": limit}))
