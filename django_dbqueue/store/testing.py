"""What ``django_dbqueue.testing`` reads and moves, and nothing a worker runs: the jobs a test
looks for, its clock (the stored times, moved into the past), the jobs of other types held back
while a test runs some types only, and what a COMMIT would apply inside a test's transaction.

The claim, the completion and the failure a test runs are the worker's own statements
(store/claiming.py, store/completion.py), run on the test's connection through
:class:`AliasSession`."""

from ._db import _execute, _execute_no_rows, int_array, text_array


class AliasSession:
    """A worker Session's ``execute`` on a database alias: the calling thread's Django
    connection, so that the acknowledger (acks.py) writes a test's outcomes with the very
    statements it writes a worker's with, in whatever transaction the test has open."""

    __slots__ = ("using",)

    def __init__(self, using):
        self.using = using

    def execute(self, statement, params):
        return _execute(self.using, statement, params)


# The jobs a test asks about, oldest first, with what its assertions compare and show. The
# filters are optional (NULL: any); the payload is compared in Python, where a mismatch can be
# explained. %(limit)s bounds the listing an assertion's failure shows (NULL: no bound).
FIND_JOBS = """
SELECT id, type, queue, payload::text, state, priority, run_after, attempts, max_attempts,
       idempotency_key, created_at, errors::text, result::text, wait_reason, event_id,
       worker_id
FROM dbqueue_job
WHERE state::text = ANY(%(states)s::text[])
  AND (%(types)s::text[] IS NULL OR type::text = ANY(%(types)s::text[]))
  AND (%(queues)s::text[] IS NULL OR queue::text = ANY(%(queues)s::text[]))
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
ORDER BY id
LIMIT %(limit)s
"""


def find_jobs(using, *, states, types=None, queues=None, ids=None, limit=None):
    """Rows of :data:`FIND_JOBS` (payload, errors and result as JSON text)."""
    params = {
        "states": text_array(states),
        "types": None if types is None else text_array(types),
        "queues": None if queues is None else text_array(queues),
        "ids": None if ids is None else int_array(ids),
        "limit": limit,
    }
    return _execute(using, FIND_JOBS, params)


# Time in a test moves by moving the stored times into the past by %(seconds)s, never by touching
# the clock the worker's statements read (now()): a retry whose backoff ends within that time,
# a job scheduled for then, a durable sleep or a signal's timeout, a periodic entry's next tick
# and a rate window's starts all come due as they would have if that time had passed. One
# statement, so that nothing sees half a move, even in autocommit. What moves:
# - a job's run_after (not the year-9999 due time of a wait for a signal without a timeout,
#   steps.NEVER, which means "never by itself"), created_at (the unknown-type grace and the
#   retention measure from it), started_at, finished_at, leased_until and cancel_requested_at;
# - the end of a durable sleep and the deadline of a signal's wait, recorded in their step's
#   JSON (steps.py reads them back there), and every step's finished_at; a signal's created_at;
# - the settings entries' and the stored entries' last tick (the scheduler enqueues the ticks
#   after it), their last enqueued tick and updated_at;
# - the start times a rate limit counts (dbqueue_limiter.starts), and an event's published_at.
# Delivery records keep their times: a recording's updated_at is the fence of its settle.
ADVANCE_CLOCK = """
WITH by AS MATERIALIZED (SELECT pg_catalog.make_interval(secs => %(seconds)s::float8) AS d),
jobs AS (
    UPDATE dbqueue_job AS j
    SET run_after = CASE WHEN j.run_after >= '9999-01-01'::timestamptz THEN j.run_after
                         ELSE j.run_after - by.d END,
        created_at = j.created_at - by.d,
        started_at = j.started_at - by.d,
        finished_at = j.finished_at - by.d,
        leased_until = j.leased_until - by.d,
        cancel_requested_at = j.cancel_requested_at - by.d
    FROM by
    RETURNING 1
),
waits AS (
    UPDATE dbqueue_step AS s
    SET finished_at = s.finished_at - by.d,
        result = CASE
            WHEN s.name::text LIKE 'sleep:%%' AND s.result ? 'until'::text
            THEN jsonb_set(s.result, '{until}'::text[],
                           pg_catalog.to_jsonb((s.result->>'until'::text)::timestamptz - by.d))
            WHEN s.name::text LIKE 'signal:%%'
                 AND jsonb_typeof(s.result->'deadline'::text) = 'string'
            THEN jsonb_set(s.result, '{deadline}'::text[],
                           pg_catalog.to_jsonb((s.result->>'deadline'::text)::timestamptz - by.d))
            ELSE s.result END
    FROM by
    RETURNING 1
),
signals AS (
    UPDATE dbqueue_signal AS g SET created_at = g.created_at - by.d FROM by RETURNING 1
),
entries AS (
    UPDATE dbqueue_schedule AS e
    SET last_tick = e.last_tick - by.d, last_enqueued = e.last_enqueued - by.d,
        updated_at = e.updated_at - by.d
    FROM by
    RETURNING 1
),
stored_entries AS (
    UPDATE dbqueue_schedule_entry AS e
    SET last_tick = e.last_tick - by.d, last_enqueued = e.last_enqueued - by.d
    FROM by
    RETURNING 1
),
limiters AS (
    UPDATE dbqueue_limiter AS l
    SET starts = ARRAY(SELECT s - by.d FROM pg_catalog.unnest(l.starts) AS s),
        updated_at = l.updated_at - by.d
    FROM by
    RETURNING 1
),
events AS (
    UPDATE dbqueue_event AS v SET published_at = v.published_at - by.d FROM by RETURNING 1
)
SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM waits), (SELECT count(*) FROM signals),
       (SELECT count(*) FROM entries), (SELECT count(*) FROM stored_entries),
       (SELECT count(*) FROM limiters), (SELECT count(*) FROM events), now()
"""


def advance_clock(using, seconds):
    """Move every stored time ``seconds`` into the past (:data:`ADVANCE_CLOCK`); returns the
    database's ``now()``."""
    return _execute(using, ADVANCE_CLOCK, {"seconds": float(seconds)})[0][-1]


# run_jobs(types=...): the due pending jobs of the other types in the queues it runs are held
# back while it runs, so that the worker's own claim (which knows no types) passes them over:
# their run_after goes 1000 years ahead, and each one's old value comes back to be restored
# (RELEASE_HELD). Only due ones: a job not due yet is passed over anyway. Run again before every
# claim, for the jobs that the runs just made due (enqueued, released by a workflow, signalled).
# A held job of a serial key still holds back the newer jobs of its key, as it would pending.
HOLD_OTHER_TYPES = """
UPDATE dbqueue_job
SET run_after = run_after + interval '1000 years'
WHERE state::text = 'pending' AND queue::text = ANY(%(queues)s::text[])
  AND type::text <> ALL(%(types)s::text[]) AND run_after <= now()
RETURNING id, run_after - interval '1000 years'
"""


def hold_other_types(using, *, queues, types):
    """Hold back the due pending jobs of ``queues`` not of ``types``: ``[(id, run_after)]``."""
    params = {"queues": text_array(queues), "types": text_array(types)}
    return _execute(using, HOLD_OTHER_TYPES, params)


# The held jobs get their run_after back; a job whose run_after something else changed meanwhile
# (a run now, a requeue) keeps the new one.
RELEASE_HELD = """
UPDATE dbqueue_job AS j
SET run_after = h.run_after
FROM ROWS FROM (pg_catalog.unnest(%(ids)s::bigint[]),
                pg_catalog.unnest(%(run_afters)s::timestamptz[])) AS h(id, run_after)
WHERE j.id = h.id AND j.run_after = h.run_after + interval '1000 years'
RETURNING j.id
"""


def release_held(using, held):
    """Give the jobs :func:`hold_other_types` held (``[(id, run_after)]``) their run_after back."""
    if not held:
        return []
    ids, run_afters = zip(*held, strict=True)
    return _execute(using, RELEASE_HELD, {"ids": list(ids), "run_afters": list(run_afters)})


# Inside a test's transaction nothing commits, so what the package applies at a COMMIT has to be
# asked for:
# - a signal's bump of its job (migration 0023), a workflow edge to an existing job and a cancel
#   of a running job (migration 0015) are constraint triggers, DEFERRABLE INITIALLY DEFERRED.
#   SET CONSTRAINTS ... IMMEDIATE fires the ones pending now (in the order their rows were
#   written, as the commit would), and DEFERRED puts them back as they were. Named, so that the
#   project's own deferred constraints are left to the test's end.
# - a claim's transaction ends its serial turns: dbqueue_serial_turn() (migration 0016) notes
#   the job it approved per key in the transaction-local setting dbqueue.serial_turns, so that
#   one claim says yes to one job per key; in one transaction that lasts for ever, the next job
#   of the key would never be approved. (Its advisory lock is this session's, which takes it
#   again.)
# Three statements; nothing to return.
APPLY_AT_COMMIT = (
    "SET CONSTRAINTS dbqueue_apply_signal, dbqueue_apply_link, dbqueue_apply_cancel IMMEDIATE"
)
DEFER_AT_COMMIT = (
    "SET CONSTRAINTS dbqueue_apply_signal, dbqueue_apply_link, dbqueue_apply_cancel DEFERRED"
)
END_SERIAL_TURNS = "SELECT set_config('dbqueue.serial_turns'::text, ''::text, true)"


def apply_at_commit(using):
    """Inside a transaction: apply what its COMMIT would (:data:`APPLY_AT_COMMIT`)."""
    _execute_no_rows(using, APPLY_AT_COMMIT, None)
    _execute_no_rows(using, DEFER_AT_COMMIT, None)
    _execute_no_rows(using, END_SERIAL_TURNS, None)
