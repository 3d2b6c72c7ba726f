"""Enqueue: the INSERT statements of one job and of a batch (idempotency keys, unique and
serial keys, debounce, traced twins), the unique key's live holder, the ids of keys already
taken, and a ``django.tasks`` result row."""

import datetime

from ._db import _execute, int_array, text_array
from .wakeups import WAKEUPS_WANTED, _wakeup_wanted

# Enqueue: one round trip, one statement, and no notification. A NOTIFY inside the caller's
# transaction would make PostgreSQL take a cluster-wide lock at its commit and hold it through the
# WAL flush, so concurrent enqueuing commits would queue behind each other; the wake-up is sent
# after the commit instead (store/wakeups.py NOTIFY, wakeup.py). Four variants (and the flow-control ones
# of INSERT_JOB_VARIANTS below), built here once from one template: with or without an idempotency key (ON CONFLICT makes "at most one job per key" hold
# under a race: the second inserter waits for the first to commit, then inserts nothing and
# returns no row), and due now or scheduled. A scheduled variant also says whether the job is
# already due by the database's clock, so that only a due job wakes a worker: each returns the
# job's id and ``wake``, NULL for a job not due yet, else whether a worker waits for its wake-up
# (_wakeup_wanted). The plain variant
# is what nearly every enqueue runs, and the server parses and plans a statement with fewer
# parameters and no expressions measurably faster. Each has a traced twin (``_TRACED``) that also
# stores the enqueuer's W3C traceparent; the untraced ones leave the column out, so an enqueue
# outside a trace binds nothing more than it did before tracing existed.
_INSERT_JOB = """
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts,
    lease_seconds, idempotency_key, errors, created_at{trace_column}{unique_columns}{serial_column}
)
VALUES (
    %(type)s, %(queue)s, %(payload)s::jsonb, 'pending', %(priority)s, {run_after},
    0, %(max_attempts)s, %(lease)s, {key}, '[]'::jsonb, now(){trace_value}{unique_values}{serial_value}
)
{conflict}RETURNING id, {wake}{created}
"""
_SCHEDULED = "COALESCE(%(run_after)s::timestamptz, now() + %(delay)s::float8 * interval '1 second')"
_ON_CONFLICT = "ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING\n"
_DUE = "run_after <= now()"
_WANTED = _wakeup_wanted("queue")
_UNTRACED = {"trace_column": "", "trace_value": ""}
_TRACED = {"trace_column": ", traceparent", "trace_value": ", %(traceparent)s"}


# When a job holds its unique key: the predicate of the partial unique index
# dbqueue_job_unique_key_live_uniq (models.UNIQUE_HELD), written out for ON CONFLICT's inference
# (PostgreSQL picks a partial index as the arbiter only when the statement's WHERE implies the
# index's predicate) and for the lookup of the live holder. "active": pending, waiting or
# running. "pending": not claimed yet (started_at is set by the first claim and never cleared),
# so a retry, a release or a rescue back to pending never takes the key again, and no statement
# that moves a started job back to pending can collide with a newer holder.
def _unique_held(alias=""):
    return (
        f"{alias}unique_key IS NOT NULL AND {alias}state::text IN ('pending', 'waiting', 'running')"
        f" AND ({alias}unique_while::text = 'active' OR {alias}started_at IS NULL)"
    )


UNIQUE_HELD_SQL = _unique_held()

# Unique while pending/active (enqueue(unique_key=..., unique_while=...)): the conflict target is
# the partial unique index, so "at most one live job per key" holds under concurrent enqueuers:
# the second inserter waits for the first to commit, then inserts nothing and returns no row,
# and the caller reads the holder (SELECT_UNIQUE_HOLDER). The debounce form updates the holder
# instead, in the same statement, while it is still pending and never claimed, and of the same
# type: its run_after and payload become this call's (the last call's payload is the one that
# runs). A holder being claimed meanwhile is locked: the update waits, and finds a row version
# that left the index (a "pending" holder: PostgreSQL then retries the insert, which succeeds) or
# that fails the WHERE (an "active" one: no row, and the caller returns the holder untouched).
# xmax = 0 tells an inserted row from an updated one in RETURNING (the updated row version
# carries this transaction's id there; a common idiom, not a documented guarantee).
_ON_UNIQUE_CONFLICT = "ON CONFLICT (unique_key) WHERE " + UNIQUE_HELD_SQL + "\n"
_UNIQUE_DO_NOTHING = _ON_UNIQUE_CONFLICT + "DO NOTHING\n"
_UNIQUE_DEBOUNCE = (
    _ON_UNIQUE_CONFLICT
    + """DO UPDATE SET run_after = EXCLUDED.run_after, payload = EXCLUDED.payload
    WHERE dbqueue_job.state::text = 'pending' AND dbqueue_job.started_at IS NULL
      AND dbqueue_job.type::text = EXCLUDED.type::text
"""
)
_CONFLICTS = {
    None: ("NULL", "", ""),
    "key": ("%(key)s", _ON_CONFLICT, ""),
    "unique": ("NULL", _UNIQUE_DO_NOTHING, ""),
    "debounce": ("NULL", _UNIQUE_DEBOUNCE, ", xmax = 0"),
}


def _insert_job(scheduled, conflict, trace, serial=False):
    key, clause, created = _CONFLICTS[conflict]
    unique = conflict in ("unique", "debounce")
    return _INSERT_JOB.format(
        run_after=_SCHEDULED if scheduled else "now()",
        key=key,
        conflict=clause,
        # NULL: not due yet (a scheduled job looks only when it is due already); else whether a
        # worker waits for its wake-up.
        wake=f"CASE WHEN {_DUE} THEN {_WANTED} END" if scheduled else _WANTED,
        created=created,
        unique_columns=", unique_key, unique_while" if unique else "",
        unique_values=", %(unique_key)s, %(unique_while)s" if unique else "",
        # A job with a serial or a fair key (docs/fairness.md) writes both columns.
        serial_column=", serial_key, fair_key" if serial else "",
        serial_value=", %(serial_key)s, %(fair_key)s" if serial else "",
        **trace,
    )


INSERT_JOB = _insert_job(False, None, _UNTRACED)
INSERT_JOB_SCHEDULED = _insert_job(True, None, _UNTRACED)
INSERT_JOB_WITH_KEY = _insert_job(False, "key", _UNTRACED)
INSERT_JOB_SCHEDULED_WITH_KEY = _insert_job(True, "key", _UNTRACED)
INSERT_JOB_TRACED = _insert_job(False, None, _TRACED)
INSERT_JOB_SCHEDULED_TRACED = _insert_job(True, None, _TRACED)
INSERT_JOB_WITH_KEY_TRACED = _insert_job(False, "key", _TRACED)
INSERT_JOB_SCHEDULED_WITH_KEY_TRACED = _insert_job(True, "key", _TRACED)

# Every other combination (a unique key, a debounce, a serial key, with the others), built
# once here, named by (scheduled, conflict, traced, serial): conflict is None, "key" (the
# idempotency key), "unique" or "debounce". The plain ones above are the same texts.
INSERT_JOB_VARIANTS = {
    (scheduled, conflict, traced, serial): _insert_job(
        scheduled, conflict, _TRACED if traced else _UNTRACED, serial
    )
    for scheduled in (False, True)
    for conflict in _CONFLICTS
    for traced in (False, True)
    for serial in (False, True)
}


def insert_job(using, **values):
    """Insert one job; returns ``(id, wake)``, or ``None`` when its idempotency key already
    exists. ``wake``: ``None`` when the job is not due yet by the database's clock (scheduled
    for later), else whether a worker waits for a wake-up on its queue (waiters.py)."""
    scheduled = values["run_after"] is not None or values["delay"]
    if values.get("serial_key") is not None or values.get("fair_key") is not None:
        keyed = "key" if values["key"] is not None else None
        variant = (bool(scheduled), keyed, values.get("traceparent") is not None, True)
        return _first(_execute(using, INSERT_JOB_VARIANTS[variant], values))
    if values.get("traceparent") is not None:
        statement = _TRACED_INSERTS[(bool(scheduled), values["key"] is not None)]
    elif values["key"] is None:
        statement = INSERT_JOB_SCHEDULED if scheduled else INSERT_JOB
    else:
        statement = INSERT_JOB_SCHEDULED_WITH_KEY if scheduled else INSERT_JOB_WITH_KEY
    return _first(_execute(using, statement, values))


def _first(rows):
    return rows[0] if rows else None


_TRACED_INSERTS = {  # (scheduled, keyed) -> statement
    (False, False): INSERT_JOB_TRACED,
    (True, False): INSERT_JOB_SCHEDULED_TRACED,
    (False, True): INSERT_JOB_WITH_KEY_TRACED,
    (True, True): INSERT_JOB_SCHEDULED_WITH_KEY_TRACED,
}


def insert_unique_job(using, *, debounce=False, **values):
    """Insert one job that holds ``values["unique_key"]`` while pending or active (see
    ``UNIQUE_HELD_SQL``); returns ``(id, wake, created)`` (``wake`` as for
    :func:`insert_job`), or ``None`` when another job holds
    the key (and, with ``debounce``, could not be updated: it started, or is of another type).
    With ``debounce`` a holder still pending and never claimed takes this call's run_after and
    payload: ``created`` is then False and ``id`` is the holder's."""
    scheduled = bool(values["run_after"] is not None or values["delay"])
    variant = (
        scheduled,
        "debounce" if debounce else "unique",
        values.get("traceparent") is not None,
        values.get("serial_key") is not None or values.get("fair_key") is not None,
    )
    rows = _execute(using, INSERT_JOB_VARIANTS[variant], values)
    if not rows:
        return None
    row = rows[0]
    return (row[0], row[1], row[2] if debounce else True)


# The job holding a unique key now (the one an enqueue that inserted nothing must return).
# Served by the unique index itself.
SELECT_UNIQUE_HOLDER = (
    "SELECT id, type, queue FROM dbqueue_job WHERE unique_key::text = %(unique_key)s::text AND "
    + UNIQUE_HELD_SQL
)


def unique_holder(using, unique_key):
    """``(id, type, queue)`` of the job holding ``unique_key`` now, or ``None``."""
    rows = _execute(using, SELECT_UNIQUE_HOLDER, {"unique_key": unique_key})
    return rows[0] if rows else None


# The batch variant: one INSERT ... SELECT FROM unnest(...) for any number of jobs; each row
# inserted comes back with its queue and its ``wake``, as for one job (WAKEUPS_WANTED looks once
# per queue of the batch).
# Every job of one batch shares the enqueuer's trace context; the traced twin binds it once.
_INSERT_JOBS = """
WITH inserted AS (
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts,
    lease_seconds, idempotency_key, errors, created_at, serial_key, fair_key{trace_column}
)
SELECT u.type, u.queue, u.payload::jsonb, 'pending', u.priority,
       COALESCE(u.run_after, now() + u.delay * interval '1 second'),
       0, u.max_attempts, u.lease, u.key, '[]'::jsonb, now(), u.serial_key, u.fair_key{trace_value}
FROM ROWS FROM (
    pg_catalog.unnest(%(types)s::text[]), pg_catalog.unnest(%(queues)s::text[]),
    pg_catalog.unnest(%(payloads)s::text[]), pg_catalog.unnest(%(priorities)s::smallint[]),
    pg_catalog.unnest(%(run_afters)s::timestamptz[]), pg_catalog.unnest(%(delays)s::float8[]),
    pg_catalog.unnest(%(max_attempts)s::int[]), pg_catalog.unnest(%(leases)s::float8[]),
    pg_catalog.unnest(%(keys)s::text[]), pg_catalog.unnest(%(serial_keys)s::text[]),
    pg_catalog.unnest(%(fair_keys)s::text[])
) WITH ORDINALITY AS u(type, queue, payload, priority, run_after, delay, max_attempts, lease,
                       key, serial_key, fair_key, ord)
ORDER BY u.ord
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, idempotency_key, queue, run_after <= now() AS due
),
wanted AS MATERIALIZED ({wanted})
SELECT i.id, i.idempotency_key, i.queue, CASE WHEN i.due THEN w.wanted END
FROM inserted AS i LEFT JOIN wanted AS w ON w.queue = i.queue::text
"""
INSERT_JOBS = _INSERT_JOBS.format(wanted=WAKEUPS_WANTED, **_UNTRACED)
INSERT_JOBS_TRACED = _INSERT_JOBS.format(wanted=WAKEUPS_WANTED, **_TRACED)


def insert_jobs(using, *, columns, traceparent=None):
    """Insert many jobs in one statement; returns ``(id, key, queue, wake)`` per row inserted
    (``wake`` as for :func:`insert_job`)."""
    params = _array_literals(columns)
    if traceparent is not None:
        return _execute(using, INSERT_JOBS_TRACED, {"traceparent": traceparent, **params})
    return _execute(using, INSERT_JOBS, params)


def _float_array(values):
    """:func:`int_array` for floats (``::float8[]``): ``repr`` is the shortest text that reads
    back as the same double (validation lets no NaN or infinity through)."""
    return "{" + ",".join([repr(float(value)) for value in values]) + "}"


def _array_literals(columns):
    """The batch INSERT's ten arrays as PostgreSQL array literals, each bound as one text
    parameter and cast by the statement, as the claim loop's arrays are (``int_array``): for
    10,000 jobs psycopg's pure-Python adaptation of ten lists element by element took about a
    quarter of ``enqueue_many``'s time (benchmarks/results/2026-12-05-enqueue-many.md). The values are
    the same: strings escaped as array elements, ``run_after`` as ISO 8601 in UTC with every
    microsecond (an instant the caller gave; every time of the database's own is still its
    ``now()`` in the statement), floats by ``repr``."""
    utc = datetime.UTC
    return {
        "types": text_array(columns["types"]),
        "queues": text_array(columns["queues"]),
        "payloads": text_array(columns["payloads"]),
        "priorities": int_array(columns["priorities"]),
        "run_afters": text_array(
            [None if at is None else at.astimezone(utc).isoformat() for at in columns["run_afters"]]
        ),
        "delays": _float_array(columns["delays"]),
        "max_attempts": int_array(columns["max_attempts"]),
        "leases": _float_array(columns["leases"]),
        "keys": text_array(columns["keys"]),
        "serial_keys": text_array(columns["serial_keys"]),
        "fair_keys": text_array(columns.get("fair_keys") or [None] * len(columns["types"])),
    }


# Which jobs already hold these idempotency keys (the ones ON CONFLICT skipped).
SELECT_IDS_BY_KEYS = """
SELECT idempotency_key, id FROM dbqueue_job
WHERE idempotency_key::text = ANY(%(keys)s::text[])
"""


def ids_by_keys(using, keys):
    return dict(_execute(using, SELECT_IDS_BY_KEYS, {"keys": list(keys)}))


# A task's result is its job row; the type check keeps a result id from reading other jobs.
SELECT_TASK_RESULT = """
SELECT payload::text, state, created_at, started_at, finished_at, errors::text, result::text,
       worker_id, priority, queue
FROM dbqueue_job WHERE id = %(id)s::bigint AND type::text = %(type)s::text
"""


def task_result_row(using, job_id, job_type):
    rows = _execute(using, SELECT_TASK_RESULT, {"id": job_id, "type": job_type})
    return rows[0] if rows else None
