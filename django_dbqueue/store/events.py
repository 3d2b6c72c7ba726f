"""Publish and subscribe (docs/events.md): an event and its subscribers' jobs in one statement,
the replay of an event to more subscribers, an event's jobs, and the prune of events that no
job refers to any more."""

from ._db import _execute, atomic, int_array, text_array
from .wakeups import WAKEUPS_WANTED

# A subscriber's job is keyed by its event and its type, so that one event never makes two jobs
# of one subscriber while the first exists; the event's subscriber list keeps that true after
# retention deleted it (REPLAY_EVENT).
JOB_KEY = "'dbqueue:event:' || e.id::text || ':' || u.type"

# The subscribers' jobs of the event ``e``, one per element of the arrays (each subscriber's
# queue, priority, attempts, lease, serial key and fair key, from its @job and the payload, as
# enqueue() computes them), all due now, each with the event's payload and its event_id.
# ``{only}``: a WHERE clause on ``e`` and ``u`` (the replay's), or nothing (publish's).
_SUBSCRIBER_JOBS = f"""
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts,
    lease_seconds, idempotency_key, errors, created_at, serial_key, fair_key, traceparent,
    event_id
)
SELECT u.type, u.queue, e.payload, 'pending', u.priority, now(), 0, u.max_attempts, u.lease,
       {JOB_KEY}, '[]'::jsonb, now(), u.serial_key, u.fair_key, %(traceparent)s, e.id
FROM event AS e CROSS JOIN ROWS FROM (
    pg_catalog.unnest(%(types)s::text[]), pg_catalog.unnest(%(queues)s::text[]),
    pg_catalog.unnest(%(priorities)s::smallint[]), pg_catalog.unnest(%(max_attempts)s::int[]),
    pg_catalog.unnest(%(leases)s::float8[]), pg_catalog.unnest(%(serial_keys)s::text[]),
    pg_catalog.unnest(%(fair_keys)s::text[])
) WITH ORDINALITY AS u(type, queue, priority, max_attempts, lease, serial_key, fair_key, ord)
{{only}}ORDER BY u.ord
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
{_SUBSCRIBER_JOBS.format(only="")}
RETURNING id, type, queue
),
wanted AS MATERIALIZED ({WAKEUPS_WANTED})
SELECT e.id, i.id, i.type, i.queue, w.wanted
FROM event AS e LEFT JOIN inserted AS i ON true LEFT JOIN wanted AS w ON w.queue = i.queue::text
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
        "fair_keys": text_array(values["fair_keys"]),
    }


# An event already published under (name, key), with the jobs that refer to it now. Its row is
# locked FOR KEY SHARE until the caller's commit, so the prune (SKIP LOCKED) leaves the event
# that publish() returns, and a replay_event() of it in the same transaction finds it. An event
# that the prune holds is waited for; if the prune deletes it, no row is returned.
SELECT_EVENT_BY_KEY = """
SELECT e.id, j.id, j.type, j.queue
FROM dbqueue_event AS e LEFT JOIN dbqueue_job AS j ON j.event_id = e.id
WHERE e.name::text = %(name)s::text AND e.idempotency_key::text = %(key)s::text
ORDER BY j.id
FOR KEY SHARE OF e
"""


def event_by_key(using, name, key):
    """``[(event_id, job_id, type, queue), ...]`` of the event ``name`` holding ``key`` (one row
    with ``job_id`` None when no job refers to it), locked until the transaction ends, or
    ``[]``."""
    return _execute(using, SELECT_EVENT_BY_KEY, {"name": name, "key": key})


# The replay's: only the subscribers that the event's list does not name yet.
_NEW_SUBSCRIBERS_JOBS = _SUBSCRIBER_JOBS.format(only="WHERE NOT e.subscribers ? u.type\n")

# replay_event(): jobs for the subscribers named, of an event published before they existed.
# The event's row is locked first, so a concurrent prune (SKIP LOCKED) leaves it, and two
# replays of one event take turns. A subscriber that ever got a job for the event gets nothing
# new: the event's ``subscribers`` list is that record (publish() writes it with the jobs, each
# replay adds the types that got one), so the test reads the list, not the jobs. The jobs are
# no record: retention deletes a done or cancelled one, and a job deleted by a prune that has
# not committed yet, or committed after this statement's snapshot, would be invisible here
# while its subscriber did get it. The list is read under the event's lock, so a replay that
# waited for another reads the list that one committed (READ COMMITTED re-reads a row it
# waited to lock). The key of (event, type) stays as a second guard: a job of the key that
# exists refuses a duplicate whatever the list says. The event's list gains the types that got
# a job.
# FOR NO KEY UPDATE, not FOR UPDATE: it conflicts with the prune's FOR UPDATE and with another
# replay, but not with the FOR KEY SHARE of a repeated publish (SELECT_EVENT_BY_KEY), so two
# transactions that each repeat a key and then replay its event take turns instead of each
# waiting for the other's share lock (a deadlock, test_event_prune_race.py).
REPLAY_EVENT = f"""
WITH event AS (
    SELECT id, payload, subscribers FROM dbqueue_event WHERE id = %(event)s::bigint
    FOR NO KEY UPDATE
),
inserted AS (
{_NEW_SUBSCRIBERS_JOBS}
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, type, queue
),
noted AS (
    UPDATE dbqueue_event AS d
    SET subscribers = d.subscribers || COALESCE(
        (SELECT pg_catalog.jsonb_agg(i.type::text ORDER BY i.id) FROM inserted AS i
         WHERE NOT d.subscribers ? i.type::text),
        '[]'::jsonb)
    WHERE d.id = (SELECT id FROM event)
    RETURNING d.id
),
wanted AS MATERIALIZED ({WAKEUPS_WANTED})
SELECT e.id, i.id, i.type, i.queue, w.wanted
FROM event AS e LEFT JOIN inserted AS i ON true LEFT JOIN wanted AS w ON w.queue = i.queue::text
"""


def replay_event(using, **values):
    """Insert the jobs of the subscribers named that have none for the event; returns rows as
    :func:`publish_event` does, or ``[]`` when the event does not exist."""
    return _execute(using, REPLAY_EVENT, _params(values))


# An event's name, payload and the jobs that refer to it (replay, the admin, status).
SELECT_EVENT = """
SELECT e.name, e.payload::text, e.idempotency_key, e.subscribers::text, e.published_at
FROM dbqueue_event AS e WHERE e.id = %(event)s::bigint
"""
SELECT_EVENT_JOBS = """
SELECT id, type, queue, state, attempts FROM dbqueue_job WHERE event_id = %(event)s::bigint
ORDER BY id
"""


def event(using, event_id):
    """``(name, payload JSON text, key, subscribers JSON text, published_at)``, or ``None``."""
    rows = _execute(using, SELECT_EVENT, {"event": event_id})
    return rows[0] if rows else None


def event_jobs(using, event_id):
    """``[(id, type, queue, state, attempts), ...]`` of the jobs that refer to the event."""
    return _execute(using, SELECT_EVENT_JOBS, {"event": event_id})


# The prune, in two statements of one transaction. The first locks events older than the
# retention that no job refers to (SKIP LOCKED: an event that a replay or a repeated publish
# holds is left for a later pass). The second deletes those of them that no job refers to
# still, reading the jobs with a snapshot taken after the locks were granted. One statement
# cannot do it: in READ COMMITTED its NOT EXISTS reads the jobs with the snapshot the statement
# began with, also when it locks an event after a replay that held it committed a job for it
# meanwhile (the lock then re-checks the event's row, not the jobs), and would delete the
# event under that job; there is no foreign key to refuse it. Every writer of an event_id locks
# its event first, until its commit (a replay FOR NO KEY UPDATE, publish() inserts it in the
# same statement), so a job that the second statement cannot see does not exist.
LOCK_PRUNABLE_EVENTS = """
SELECT e.id FROM dbqueue_event AS e
WHERE e.published_at < now() - %(age)s::float8 * interval '1 second'
  AND NOT EXISTS (SELECT 1 FROM dbqueue_job AS j WHERE j.event_id = e.id)
ORDER BY e.published_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""
DELETE_UNREFERENCED_EVENTS = """
DELETE FROM dbqueue_event AS e
WHERE e.id = ANY(%(ids)s::bigint[])
  AND NOT EXISTS (SELECT 1 FROM dbqueue_job AS j WHERE j.event_id = e.id)
RETURNING e.id
"""


def lock_prunable_events(db, *, age, limit):
    """Lock up to ``limit`` events older than ``age`` seconds that no job refers to (skipping
    those locked elsewhere); returns their ids. The prune's first statement."""
    rows = _execute(db, LOCK_PRUNABLE_EVENTS, {"age": float(age), "limit": limit})
    return [event_id for (event_id,) in rows]


def delete_unreferenced_events(db, ids):
    """Delete the events ``ids`` (locked by :func:`lock_prunable_events` in this transaction)
    that no job refers to; returns how many. The prune's second statement."""
    return len(_execute(db, DELETE_UNREFERENCED_EVENTS, {"ids": int_array(ids)}))


def prune_events(db, *, age, limit):
    """Delete up to ``limit`` events older than ``age`` seconds that no job refers to, in one
    transaction of two statements on ``db`` (an alias or a worker's Session); returns how
    many."""
    with atomic(db):
        ids = lock_prunable_events(db, age=age, limit=limit)
        return delete_unreferenced_events(db, ids) if ids else 0
