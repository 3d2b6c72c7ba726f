"""What every module of the store shares: running a statement on a database alias (the
calling thread's Django connection, so inside ``transaction.atomic`` it takes part in the
caller's transaction) or on a worker's Session, the cursor reused inside ``atomic()``, the
array literals of the hot statements, and the commit mode of a worker's writes."""

import contextlib

from django.db import connections, transaction

from ..validation import TIMESTAMP_MAX, TIMESTAMP_MIN


def int_array(values):
    """A PostgreSQL array literal of ``values`` (ints), bound as one text parameter and cast
    by the statement (``::bigint[]``). The hot statements of the claim loop pass their arrays
    this way: psycopg's pure-Python adaptation of a list costs about 2 us per element, which
    for a batch of 50 completions was most of the claim loop's own CPU per round trip."""
    return "{" + ",".join([str(int(value)) for value in values]) + "}"


def _text_element(value):
    if value is None:
        return "NULL"
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def text_array(values):
    """:func:`int_array` for strings or None (``::text[]``): each element double-quoted, its
    backslashes and double quotes escaped, None as NULL (PostgreSQL's array input syntax)."""
    return "{" + ",".join([_text_element(value) for value in values]) + "}"


def _execute(db, statement, params):
    """Run on ``db``: a database alias (this thread's Django connection) or a worker Session."""
    if not isinstance(db, str):
        return db.execute(statement, params)
    connection = connections[db]
    cursor = _transaction_cursor(connection)
    if cursor is None:
        with connection.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchall()
    cursor.execute(statement, params)
    return cursor.fetchall()


def _transaction_cursor(connection):
    """The cursor that the statements of this package reuse inside ``connection``'s
    ``atomic()`` blocks, or ``None`` where each statement must open its own with Django's
    ``cursor()``.

    A new cursor per statement costs more than a small INSERT's own binding on psycopg's pure
    Python build (a fresh cursor starts with empty adapter caches), and an enqueue runs inside
    the caller's request transaction. Inside ``atomic()`` the connection is open and Django has
    already run its health check (``CONN_HEALTH_CHECKS``) when the block began, so reusing a
    cursor skips nothing that Django's ``cursor()`` would do there, apart from making a new
    wrapper: each ``execute()`` still goes through Django's ``CursorWrapper`` (error wrapping,
    ``execute_wrapper()`` hooks, the broken-transaction check). Outside ``atomic()``, and while
    Django logs queries (``DEBUG``, ``force_debug_cursor``: its debug wrapper records each
    statement and tools such as the debug toolbar wrap each cursor), the ordinary path runs. The
    cursor is kept per raw connection: after a reconnect a new one is made."""
    if not connection.in_atomic_block or connection.queries_logged:
        return None
    raw = connection.connection
    kept = connection.__dict__.get("_dbqueue_cursor")
    if kept is None or kept.cursor.connection is not raw or kept.cursor.closed:
        if kept is not None:
            with contextlib.suppress(Exception):  # its connection is gone: nothing to free
                kept.close()
        kept = connection.cursor()
        connection._dbqueue_cursor = kept
    return kept


def atomic(db):
    """A transaction around several statements on ``db``: Django's ``atomic()`` on an alias
    (a savepoint inside the caller's transaction), psycopg's on a worker's Session (whose
    connection is in autocommit otherwise)."""
    if isinstance(db, str):
        return transaction.atomic(using=db)
    return db.connection().transaction()


def _execute_no_rows(using, statement, params):
    with connections[using].cursor() as cursor:
        cursor.execute(statement, params)


def _commit(async_commit):
    return "off" if async_commit else None


# The lease a claim writes on the jobs it chose (the CTE ``chosen``, ids only), under the
# statement's commit mode, and the columns every claim returns (ClaimedRow's, in
# store/claiming.py): the one place a claim takes a job, shared by the plain claim, the fair
# claim and the batch top-up. ``extra``: more columns to return (", j.fair_key"). The wait is a
# difference of epochs, not of timestamps: a run_after of -infinity (a row written by hand) would
# fail ``now() - run_after``, and with it every claim of the queue; this way it comes back as
# "Infinity", which the client reads as a row it cannot read (store/claiming.py).
def claimed_cte(extra=""):
    return f"""claimed AS (
    UPDATE dbqueue_job AS j
    SET state = 'running',
        attempts = j.attempts + 1,
        worker_id = %(worker)s,
        lease_token = %(token)s,
        started_at = now(),
        leased_until = now() + j.lease_seconds * interval '1 second'
    FROM commit_mode
    WHERE j.id = ANY(ARRAY(SELECT id FROM chosen))
    RETURNING j.id, j.type, j.queue, j.payload, j.attempts, j.max_attempts, j.lease_seconds,
              j.idempotency_key, j.priority, j.created_at,
              (EXTRACT(EPOCH FROM now()) - EXTRACT(EPOCH FROM j.run_after))::float8 AS wait,
              j.traceparent, j.run_after, j.serial_key IS NOT NULL AS keyed{extra}
)"""


# A timestamp of a row Python may not read back (one written by hand: year 200000, 4000 BC,
# infinity): psycopg's typed value of it fails the fetch of the whole reply. Read for a person
# (the admin, jobqueue_status) as two columns instead: the value inside validation.TIMESTAMP_MIN
# ..MAX (which any time zone can show), else NULL; PostgreSQL's text of it outside, else NULL.
# time_or_text() merges them back into one value.
def time_columns(column):
    inside = (
        f"{column} BETWEEN '{TIMESTAMP_MIN.isoformat()}'::timestamptz "
        f"AND '{TIMESTAMP_MAX.isoformat()}'::timestamptz"
    )
    return f"CASE WHEN {inside} THEN {column} END, CASE WHEN NOT ({inside}) THEN {column}::text END"


def time_or_text(at, text):
    """The two columns of :func:`time_columns` as one: a datetime, PostgreSQL's text (a str) of
    a time Python cannot show, or None."""
    return at if text is None else text


# Workflow dependents (docs/concepts/worker.md#callers-transactions): a statement that ends a job
# of a workflow changes its dependents' rows too (a completion counts them down; a dead or
# cancelled end fires dbqueue_settle_dependents, migration 0009, which locks them and cancels or
# releases them). A caller's transaction holding one of those rows (a select_for_update(), a
# signal or cancel whose deferred trigger ran early) would make that statement wait, and the
# session's lock_timeout then fail it whole: every other job of the batch with it, at every try.
# So the statements of a worker's Session lock the dependents first, with SKIP LOCKED, in id
# order (as the trigger and the completion lock them: already held, those locks wait for
# nothing), and end only the jobs whose dependents they hold: ``free``. A job with a dependent
# another transaction holds is left out, still running under its claim: the worker reads it back
# and writes it again later (acks.py), the sweeper takes it back on a later sweep, while every
# other job is written now. Appended to a CTE ``mine (id, dependents, ending)``: ``ending`` says
# whether the job's end touches its dependents at all (:func:`dependents_free`'s ``ending``: an
# expression on ``m``).
# Only dependents waiting or cancelled, as the trigger locks; one that a newer transaction
# linked after this statement's snapshot is not seen here, and its lock, taken later, is the
# one wait left (bounded by lock_timeout: rare, and tried again as before).
DEPENDENTS_FREE = """
kin AS MATERIALIZED (
    SELECT d.id FROM dbqueue_job AS d
    WHERE d.id = ANY(ARRAY(SELECT pg_catalog.unnest(m.dependents) FROM mine AS m
                           WHERE {ENDING}))
      AND d.state::text = ANY(ARRAY['waiting', 'cancelled']::text[])
    ORDER BY d.id
    FOR NO KEY UPDATE OF d SKIP LOCKED
),
free AS MATERIALIZED (
    SELECT m.id FROM mine AS m
    WHERE m.dependents IS NULL OR NOT ({ENDING}) OR NOT EXISTS (
        SELECT 1 FROM dbqueue_job AS v
        WHERE v.id = ANY(m.dependents)
          AND v.state::text = ANY(ARRAY['waiting', 'cancelled']::text[])
          AND NOT (v.id = ANY(ARRAY(SELECT k.id FROM kin AS k))))
)"""


def dependents_free(ending):
    """The CTEs ``kin`` and ``free`` (:data:`DEPENDENTS_FREE`), for a statement's text after a
    CTE ``mine``; ``ending``: whether a job's end touches its dependents (SQL on ``m``)."""
    return DEPENDENTS_FREE.replace("{ENDING}", ending)
