"""Thin functions that run the statements of ``sql.py``: the only writers of job state.

Each takes the database alias and plain values and returns plain values; none builds an ORM
instance. They run on the calling thread's Django connection, so inside ``transaction.atomic``
they take part in the caller's transaction.
"""

import contextlib
import dataclasses
import datetime
import json
import logging
import secrets
import time
from dataclasses import dataclass

from django.db import IntegrityError, connections, transaction

from . import names, sql
from .connections import DB_ERRORS, connect, reset_connection, side_execute

logger = logging.getLogger("django_dbqueue")


@dataclass(frozen=True, slots=True)
class ClaimedRow:
    id: int
    type: str
    queue: str
    payload: object  # decoded JSON
    attempt: int
    max_attempts: int
    lease_seconds: float
    idempotency_key: str | None
    priority: int
    created_at: object
    wait: float = 0.0  # seconds from run_after (due) to the claim, in database time
    traceparent: str | None = None  # the enqueuer's W3C trace context, if it had one
    keyed: bool = False  # it has a serial key: its end may let its key's next job be claimed


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


def insert_job(using, **values):
    """Insert one job; returns ``(id, wake)``, or ``None`` when its idempotency key already
    exists. ``wake``: ``None`` when the job is not due yet by the database's clock (scheduled
    for later), else whether a worker waits for a wake-up on its queue (waiters.py)."""
    scheduled = values["run_after"] is not None or values["delay"]
    if values.get("serial_key") is not None:
        keyed = "key" if values["key"] is not None else None
        variant = (bool(scheduled), keyed, values.get("traceparent") is not None, True)
        return _first(_execute(using, sql.INSERT_JOB_VARIANTS[variant], values))
    if values.get("traceparent") is not None:
        statement = _TRACED_INSERTS[(bool(scheduled), values["key"] is not None)]
    elif values["key"] is None:
        statement = sql.INSERT_JOB_SCHEDULED if scheduled else sql.INSERT_JOB
    else:
        statement = sql.INSERT_JOB_SCHEDULED_WITH_KEY if scheduled else sql.INSERT_JOB_WITH_KEY
    return _first(_execute(using, statement, values))


def _first(rows):
    return rows[0] if rows else None


_TRACED_INSERTS = {  # (scheduled, keyed) -> statement
    (False, False): sql.INSERT_JOB_TRACED,
    (True, False): sql.INSERT_JOB_SCHEDULED_TRACED,
    (False, True): sql.INSERT_JOB_WITH_KEY_TRACED,
    (True, True): sql.INSERT_JOB_SCHEDULED_WITH_KEY_TRACED,
}


def insert_unique_job(using, *, debounce=False, **values):
    """Insert one job that holds ``values["unique_key"]`` while pending or active (see
    ``sql.UNIQUE_HELD_SQL``); returns ``(id, wake, created)`` (``wake`` as for
    :func:`insert_job`), or ``None`` when another job holds
    the key (and, with ``debounce``, could not be updated: it started, or is of another type).
    With ``debounce`` a holder still pending and never claimed takes this call's run_after and
    payload: ``created`` is then False and ``id`` is the holder's."""
    scheduled = bool(values["run_after"] is not None or values["delay"])
    variant = (
        scheduled,
        "debounce" if debounce else "unique",
        values.get("traceparent") is not None,
        values.get("serial_key") is not None,
    )
    rows = _execute(using, sql.INSERT_JOB_VARIANTS[variant], values)
    if not rows:
        return None
    row = rows[0]
    return (row[0], row[1], row[2] if debounce else True)


def unique_holder(using, unique_key):
    """``(id, type, queue)`` of the job holding ``unique_key`` now, or ``None``."""
    rows = _execute(using, sql.SELECT_UNIQUE_HOLDER, {"unique_key": unique_key})
    return rows[0] if rows else None


def insert_jobs(using, *, columns, traceparent=None):
    """Insert many jobs in one statement; returns ``(id, key, queue, wake)`` per row inserted
    (``wake`` as for :func:`insert_job`)."""
    if traceparent is not None:
        return _execute(using, sql.INSERT_JOBS_TRACED, {"traceparent": traceparent, **columns})
    return _execute(using, sql.INSERT_JOBS, columns)


def insert_workflow(using, *, columns, edges, existing, traceparent=None):
    """Insert a workflow's jobs and edges in one statement (``sql.INSERT_WORKFLOW``).

    ``edges``: ``(job position, dependency position or None, dependency id or None,
    run_on_failure)`` with 1-based positions in ``columns``; ``existing``: the ids of the
    dependencies already in the table. Returns ``(job ids in order with their state, {existing
    id: state}, [(queue, wake) of each job])`` (``wake``: None for a job created waiting, else as
    for :func:`insert_job`); no job ids when an existing dependency
    is missing, dead or cancelled (then nothing was written).
    """
    job_ords, dep_ords, dep_ids, runs = zip(*edges, strict=True) if edges else ((), (), (), ())
    params = {
        "traceparent": traceparent,
        "existing": list(existing),
        "edge_jobs": list(job_ords),
        "edge_dep_ords": list(dep_ords),
        "edge_dep_ids": list(dep_ids),
        "edge_runs": list(runs),
        **columns,
    }
    rows = _execute(using, sql.INSERT_WORKFLOW, params)
    jobs = sorted((job_id, state) for kind, job_id, state, _, _, _ in rows if kind == "job")
    found = {job_id: state for kind, job_id, state, _, _, _ in rows if kind == "dependency"}
    wakes = [(queue, wake) for kind, _, _, queue, wake, _ in rows if kind == "job"]
    return jobs, found, wakes


def dependency_results(using, job_id):
    """``{dependency id: result JSON text or None}`` of a job's dependencies still stored."""
    return dict(_execute(using, sql.DEPENDENCY_RESULTS, {"id": job_id}))


def workflow_neighbours(using, job_id):
    """``[(relation, id, type, state, run_on_failure), ...]``: relation is ``depends_on`` (this
    job waits on that one) or ``dependent`` (that one waits on this job)."""
    return _execute(using, sql.WORKFLOW_NEIGHBOURS, {"id": job_id})


def ids_by_keys(using, keys):
    return dict(_execute(using, sql.SELECT_IDS_BY_KEYS, {"keys": list(keys)}))


def new_token():
    """A lease token: random, positive, fits PostgreSQL's bigint."""
    return secrets.randbits(63) or 1


def _commit(async_commit):
    return "off" if async_commit else None


def claim(
    using, *, worker_id, queues, limits, limit, token, async_commit=False, flow=None, threads=None
):
    """Claim up to ``limit`` due jobs from ``queues`` (``limits``: the cap of each queue) under
    lease ``token`` (see :func:`new_token`), at most ``threads`` of them with a serial key.
    ``flow``: the fleet-wide limits (``flow.claim_params``), or ``None`` for the plain claim."""
    statement = claim_statement(
        worker_id=worker_id,
        queues=queues,
        limits=limits,
        limit=limit,
        token=token,
        async_commit=async_commit,
        flow=flow,
        threads=threads,
    )
    return claimed_rows(_execute(using, *statement))


def claim_statement(
    *, worker_id, queues, limits, limit, token, async_commit=False, flow=None, threads=None
):
    """:func:`claim`'s statement and parameters, for a Session's ``execute_pipelined``.

    ``threads``: the handler threads free now, the most jobs with a serial key the claim takes
    (a keyed job is never prefetched: it would hold its key while it waits); None: ``limit``.
    """
    params = {
        "worker": worker_id,
        "queues": text_array(queues),
        "limits": int_array(limits),
        "limit": limit,
        "threads": limit if threads is None else threads,
        "token": token,
        "commit": _commit(async_commit),
    }
    if flow is None:
        return sql.CLAIM_JOBS, params
    return sql.CLAIM_LIMITED, {**params, **flow}


class ClaimedRows(list):
    """The claimed jobs, and what held a limited claim back: ``held`` (a concurrency limit is
    full) and ``reopen_in`` (seconds until a rate window has room; ``None``: no rate limit
    held it back)."""

    held = False
    reopen_in = None
    keyed = 0  # how many jobs have a serial key


def claimed_rows(rows):
    """The claimed jobs as ClaimedRows. sql.CLAIM_JOBS returns one value, a JSON array of one
    array per job (or NULL); sql.CLAIM_LIMITED typed rows (the payload as text), then one
    closing row saying what held the claim back."""
    claimed = ClaimedRows()
    if rows and len(rows[0]) == 1:
        batch = rows[0][0]
        for item in json.loads(batch) if batch is not None else ():
            item[6] = float(item[6])  # lease_seconds: JSON writes 60.0 as 60
            item[9] = datetime.datetime.fromisoformat(item[9]).astimezone(datetime.UTC)
            if len(item) > 12 and item[12]:
                claimed.keyed += 1
            claimed.append(ClaimedRow(*item))
        return claimed
    for row in rows:
        if row[0] is None:  # sql.CLAIM_LIMITED's closing row
            claimed.held = row[1] == "held"
            claimed.reopen_in = row[10]
        else:
            row = list(row)
            row[3] = json.loads(row[3])  # payload
            if len(row) > 12 and row[12]:
                claimed.keyed += 1
            claimed.append(ClaimedRow(*row))
    return claimed


def complete(using, acks, *, async_commit=False, channel=None):
    """Mark ``[(id, token, result_json_or_None), ...]`` done; returns the set of ids that matched.

    An id missing from the result was fenced out: its lease was lost and the job claimed again
    (or an earlier try of this same write committed; :func:`read_back` tells). Jobs of a workflow
    that were waiting for these are released in the same statement, and the workers of their
    queues woken on ``channel`` (default ``DBQUEUE["NOTIFY_CHANNEL"]``).
    """
    if not acks:
        return set()
    statement = complete_statement(acks, async_commit=async_commit, channel=channel)
    return completed_ids(_execute(using, *statement))


def complete_ending(using, acks, *, async_commit=False, channel=None):
    """:func:`complete`, returning ``{id: None}`` for a job done and ``{id: who}`` for one that
    ended cancelled (its cancel was asked for while it ran; ``''`` when nobody is recorded)."""
    if not acks:
        return {}
    rows = _execute(using, *complete_statement(acks, async_commit=async_commit, channel=channel))
    return completed_endings(rows)


def complete_statement(acks, *, async_commit=False, channel=None):
    """:func:`complete`'s statement and parameters, for a Session's ``execute_pipelined``."""
    if channel is None:
        from .conf import get_settings

        channel = get_settings().NOTIFY_CHANNEL
    ids, tokens, results = zip(*acks, strict=True)
    params = {
        "ids": int_array(ids),
        "tokens": int_array(tokens),
        "results": text_array(results),
        "running": "running",
        "waiting": "waiting",
        "commit": _commit(async_commit),
        "channel": channel,
    }
    return sql.COMPLETE_JOBS, params


def completed_ids(rows):
    return set(completed_endings(rows))


def completed_endings(rows):
    """``{id: None}`` for each job a completion made done, ``{id: who}`` for each it ended
    ``cancelled`` (its cancel was asked for while it ran; ``''`` when nobody is recorded)."""
    if not rows:
        return {}
    done, cancelled = rows[0][0], rows[0][1]
    endings = dict.fromkeys(json.loads(done)) if done is not None else {}
    if cancelled is not None:
        endings.update((int(job_id), who) for job_id, who in json.loads(cancelled).items())
    return endings


def fail(using, *, job_id, token, error, delay, dead=False):
    """Record a failed attempt: retry after ``delay`` seconds, or dead (spent or ``dead=True``),
    or cancelled when a cancel was asked for while it ran.

    Returns the new state, or ``None`` when the write was fenced out. Always a durable commit.
    """
    ended = fail_job(using, job_id=job_id, token=token, error=error, delay=delay, dead=dead)
    return ended[0] if ended else None


def fail_job(using, *, job_id, token, error, delay, dead=False):
    """:func:`fail`, returning ``(state, cancelled_by)``, or ``None`` when fenced out."""
    rows = _execute(
        using,
        sql.FAIL_JOB,
        {
            "id": job_id,
            "token": token,
            "error": json.dumps(error),
            "delay": float(delay),
            "dead": bool(dead),
        },
    )
    return (rows[0][0], rows[0][2]) if rows else None


def end_cancelled(using, *, job_id, token, by="handler"):
    """End a run that stopped because it was cancelled (or never started for that reason):
    ``cancelled``, fenced. ``by`` is recorded unless a cancel request already named someone.
    Returns who cancelled it, or ``None`` when the write was fenced out. A durable commit."""
    rows = _execute(using, sql.END_CANCELLED, {"id": job_id, "token": token, "by": by})
    return (rows[0][1] or "") if rows else None


def defer_unknown_type(using, *, job_id, token, error, delay, grace):
    """A job whose type this worker cannot run: back to pending without spending the attempt, or
    dead when older than ``grace`` seconds. Returns the new state, or ``None`` when fenced."""
    params = {
        "id": job_id,
        "token": token,
        "error": json.dumps(error),
        "delay": float(delay),
        "grace": float(grace),
    }
    rows = _execute(using, sql.DEFER_UNKNOWN_TYPE, params)
    return rows[0][0] if rows else None


def read_back(using, ids):
    """``{id: (state, lease_token)}`` of the jobs that still exist."""
    rows = _execute(using, sql.READ_BACK_JOBS, {"ids": list(ids)})
    return {job_id: (state, token) for job_id, state, token in rows}


def extend_leases(using, held, *, async_commit=False):
    """Heartbeat ``[(id, token), ...]``; returns the ids whose lease this worker still holds,
    as ``{id: True when a cancel was asked for}`` (so ``id in result`` reads as before)."""
    if not held:
        return {}
    ids, tokens = zip(*held, strict=True)
    params = {"ids": int_array(ids), "tokens": int_array(tokens), "commit": _commit(async_commit)}
    rows = _execute(using, sql.EXTEND_LEASES, params)
    return {job_id: cancelling for job_id, cancelling in rows}


def release(using, held):
    """Return ``[(id, token), ...]`` to pending without spending the attempt; returns the ids.

    A job whose cancel was asked for ends cancelled instead (see :func:`release_ending`)."""
    return set(release_ending(using, held))


def release_ending(using, held):
    """:func:`release`, returning ``{id: "pending" or "cancelled"}``."""
    if not held:
        return {}
    ids, tokens = zip(*held, strict=True)
    rows = _execute(using, sql.RELEASE_JOBS, {"ids": list(ids), "tokens": list(tokens)})
    return dict(rows)


def release_unknown(using, *, worker, known):
    """Release every job running under ``worker`` whose token is not in ``known``; returns ids."""
    rows = _execute(using, sql.RELEASE_UNKNOWN_JOBS, {"worker": worker, "known": list(known)})
    return {row[0] for row in rows}


def rescue_expired(using, *, limit, base, factor, cap):
    """Take back up to ``limit`` expired leases; returns ``[(id, type, attempts, state, worker,
    queue, cancelled_by, name)]`` (state ``cancelled`` for a job whose cancel was asked for;
    ``name``: names.label, the type or a known django.tasks task's path)."""
    rows = _execute(
        using,
        sql.RESCUE_EXPIRED,
        {"limit": limit, "base": float(base), "factor": float(factor), "cap": float(cap)},
    )
    return [(*row[:7], names.label(row[1], {"task": row[7]})) for row in rows]


def count_due(using, queues, bound=10000):
    return _execute(using, sql.COUNT_DUE, {"queues": list(queues), "bound": bound})[0][0]


REQUEUE_TRIES = 3  # a holder of a unique key enqueued during the requeue: read again, retry


def requeue(using, ids):
    """Dead or cancelled jobs back to pending with attempts reset; returns ``{id: queue}`` of the
    jobs moved (the caller wakes their queues: ``wakeup.jobs_ready``). A job whose unique key
    another job holds now stays where it is (:func:`requeue_blocked` says which and why)."""
    params = {"ids": list(ids)}
    for tries in range(1, REQUEUE_TRIES + 1):
        try:
            # A savepoint: a unique violation (a holder committed between this statement's
            # snapshot and its write) must not abort the caller's transaction.
            with transaction.atomic(using=using):
                return dict(_execute(using, sql.REQUEUE_JOBS, params))
        except IntegrityError:
            if tries == REQUEUE_TRIES:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def requeue_blocked(using, ids):
    """``[(id, unique_key, holder_id, holder_state), ...]``: which of the dead or cancelled jobs
    among ``ids`` cannot be requeued because another job holds their unique key now."""
    return _execute(using, sql.REQUEUE_BLOCKED_BY_UNIQUE, {"ids": list(ids)})


def run_now(using, ids):
    """Scheduled pending jobs due now; returns ``{id: queue}`` of the jobs moved."""
    return dict(_execute(using, sql.RUN_JOBS_NOW, {"ids": list(ids)}))


def cancel(using, ids, *, by=None):
    """Pending or waiting jobs to cancelled, running ones marked for cancellation; returns the
    ids cancelled at once (:func:`request_cancel` says what became of each)."""
    return {i for i, state in request_cancel(using, ids, by=by).items() if state == "cancelled"}


def request_cancel(using, ids, *, by=None):
    """``{id: "cancelled" | "running" | "finished"}`` for the ids that exist: cancelled now,
    marked while it runs, or already done, dead or cancelled. Ids missing are unknown."""
    return dict(_execute(using, sql.CANCEL_JOBS, {"ids": list(ids), "by": by}))


def delete_finished(using, ids):
    """Delete the done, dead or cancelled jobs among ``ids``; returns the ids deleted."""
    return {row[0] for row in _execute(using, sql.DELETE_FINISHED_JOBS, {"ids": list(ids)})}


def dead_ids(using, *, after=0, job_type=None, queue=None, limit=1000):
    params = {"after": after, "type": job_type, "queue": queue, "limit": limit}
    return [row[0] for row in _execute(using, sql.SELECT_DEAD_IDS, params)]


def count_dead(using, *, job_type=None, queue=None):
    return _execute(using, sql.COUNT_DEAD, {"type": job_type, "queue": queue})[0][0]


def prune(using, *, state, age, limit):
    """Delete up to ``limit`` ``state`` jobs finished more than ``age`` seconds ago; returns n."""
    params = {"state": state, "age": float(age), "limit": limit}
    return _execute(using, sql.PRUNE_FINISHED, params)[0][0]


def _empty_status():
    return {
        "pending": 0,
        "running": 0,
        "dead": 0,
        "stuck": 0,
        "scheduled": 0,
        "waiting": 0,
        "oldest_due_seconds": None,
    }


def status(using, queues=()):
    """Per-queue counts: ``{queue: {"pending", "running", "dead", "stuck", "scheduled",
    "oldest_due_seconds"}}``, with a zero entry for each of ``queues`` that has no live job.
    ``pending`` is due now; ``scheduled`` is pending with a future ``run_after``; ``waiting``
    waits for its workflow dependencies; ``stuck`` is running past its lease."""
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


def ensure_schedule(using, name):
    """Give a new schedule entry its row, starting from now (nothing if it has one)."""
    _execute_no_rows(using, sql.ENSURE_SCHEDULE, {"name": name})


def metrics_snapshot(db):
    """The table's gauges in one statement: ``[(kind, name, label, value), ...]`` with kind
    ``queue`` (labels due, scheduled, oldest_due_seconds, running, stuck, dead), ``worker``
    (jobs, heartbeat_age_seconds) or ``delivery`` (recorded). ``db``: an alias or a Session."""
    return _execute(db, sql.METRICS_SNAPSHOT, {})


def lock_schedule(using, name):
    """Inside a transaction: ``(last_tick, now)`` of a schedule entry, or ``None`` when another
    worker holds it (or it has no row)."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.LOCK_SCHEDULE, {"name": name})
        return cursor.fetchone()


def advance_schedule(using, name, tick, enqueued=None):
    """Move a settings entry's ``last_tick`` to ``tick``; ``enqueued``: the newest tick that made
    a job (``None``: keep the one recorded)."""
    params = {"name": name, "tick": tick, "enqueued": enqueued}
    _execute_no_rows(using, sql.ADVANCE_SCHEDULE, params)


@dataclass(frozen=True)
class StoredEntry:
    """A ``dbqueue_schedule_entry`` row as the scheduler reads it (``payload`` is JSON text)."""

    id: int
    name: str
    last_tick: datetime.datetime
    job_type: str
    cron: str
    every: float | None
    timezone: str
    payload: str
    queue: str
    priority: int | None
    catch_up: str
    catch_up_window: float | None
    misfire_grace: float

    def definition(self):
        """Everything but the state: what a parsed entry depends on."""
        return (self.name, *dataclasses.astuple(self)[3:])


def schedule_state(using):
    """``({name: last_tick} of the settings entries, [StoredEntry] enabled, now)``."""
    rows = _execute(using, sql.SCHEDULE_STATE, {})
    last = {row[1]: row[2] for row in rows if row[0] is None and row[1] is not None}
    entries = [StoredEntry(*row[:13]) for row in rows if row[0] is not None]
    return last, entries, rows[0][13]


def lock_schedule_entry(using, entry_id):
    """Inside a transaction: ``(StoredEntry, now)`` of an enabled stored entry, or ``None`` when
    another worker or an edit holds it (or it is gone or disabled)."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.LOCK_SCHEDULE_ENTRY, {"id": entry_id})
        row = cursor.fetchone()
    return None if row is None else (StoredEntry(*row[:13]), row[13])


def lock_schedule_entry_for_edit(using, entry_id):
    """Inside a transaction: ``(StoredEntry, now, enabled)``, waiting for a worker ticking it;
    ``None`` when there is no such entry."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.LOCK_SCHEDULE_ENTRY_FOR_EDIT, {"id": entry_id})
        row = cursor.fetchone()
    return None if row is None else (StoredEntry(*row[:13]), row[13], row[14])


def advance_schedule_entry(using, entry_id, tick, enqueued=None):
    params = {"id": entry_id, "tick": tick, "enqueued": enqueued}
    _execute_no_rows(using, sql.ADVANCE_SCHEDULE_ENTRY, params)


def schedule_status(using):
    """``({name: (last_tick, last_enqueued)} of the settings entries, now)``."""
    rows = _execute(using, sql.SCHEDULE_STATUS, {})
    return {name: (last, enqueued) for name, last, enqueued, _ in rows if name}, rows[0][3]


def missing_tables(using, tables, *, after_error=False):
    """Those of ``tables`` that do not exist in database ``using``. ``after_error``: a statement
    just failed there, so a transaction open on the thread's connection is aborted; ask on a
    connection of its own then."""
    run = _execute_after_error if after_error else _execute
    return [row[0] for row in run(using, sql.MISSING_TABLES, {"tables": list(tables)})]


def applied_migrations(using, app):
    """The names of ``app``'s migrations recorded as applied in ``using``, asked as
    :func:`missing_tables` asks after an error."""
    return [row[0] for row in _execute_after_error(using, sql.APPLIED_MIGRATIONS, {"app": app})]


def _execute_after_error(using, statement, params):
    """Run on ``using`` after a statement failed there: on the thread's Django connection when
    no transaction was open (the failed statement ended its own), else on a connection opened
    for this one question and closed (the caller's transaction is aborted)."""
    if not connections[using].in_atomic_block:
        return _execute(using, statement, params)
    with connect(using) as own:
        return own.execute(statement, params).fetchall()


# Delivery records: on a connection that commits on its own (see connections.side_execute). ------

SETTLE_RETRIES = 3  # tries of a settle that met a lost connection


def begin_delivery(using, *, key, job_id, attempt):
    """Record (or re-record a failed) delivery. When this caller now holds it: the recording's
    ``updated_at`` in microseconds since the epoch, which fences its settle
    (sql.SETTLE_DELIVERY); otherwise None."""
    params = {"key": key, "job_id": job_id, "attempt": attempt}
    rows = side_execute(using, sql.BEGIN_DELIVERY, params)
    return rows[0][1] if rows else None


def delivery(using, key):
    """``(id, state, provider_reference, error, job_id, attempt, created_at, updated_at)`` of the
    delivery ``key``, or ``None``."""
    rows = side_execute(using, sql.SELECT_DELIVERY, {"key": key})
    return rows[0] if rows else None


def settle_delivery(
    using, *, key, state, reference, error, holder, job_id, attempt, recorded_at=None
):
    """Move a ``recorded`` delivery to ``state``; True if it moved, False if it did not, None
    when a retry matched nothing after a try whose reply was lost (it may have moved it).

    The effect has already happened when this runs, so a lost connection must not leave the
    record ``recorded`` (an unknown outcome that needs a person): reconnect and try again. That
    is safe because the statement is fenced (only a ``recorded`` row, and for a ``holder`` only
    its own recording: job, attempt and ``recorded_at``, moves); a first try that committed but lost its reply makes the
    retry match nothing, which the caller tells apart by reading the row back.
    """
    params = {
        "key": key,
        "state": state,
        "reference": reference,
        "error": error,
        "holder": holder,
        "job_id": job_id,
        "attempt": attempt,
        "recorded_at": recorded_at,
    }
    for tries in range(1, SETTLE_RETRIES + 1):
        try:
            if side_execute(using, sql.SETTLE_DELIVERY, params):
                return True
            return False if tries == 1 else None
        except DB_ERRORS:
            if tries == SETTLE_RETRIES:
                raise
            logger.warning(
                "dbqueue delivery %r: connection lost while settling it %s; reconnecting "
                "(try %d of %d)",
                key,
                state,
                tries + 1,
                SETTLE_RETRIES,
            )
            if not connections[using].in_atomic_block:
                reset_connection(using)  # the side path drops its own connection itself
            time.sleep(0.05 * tries)  # a short backoff before reconnecting, not a wait
    raise AssertionError("unreachable")  # pragma: no cover


def settle_deliveries(using, ids, *, state, error):
    """A person settles ``recorded`` deliveries by id; returns the number moved."""
    rows = _execute(
        using, sql.SETTLE_DELIVERIES_BY_ID, {"ids": list(ids), "state": state, "error": error}
    )
    return len(rows)


def task_result_row(using, job_id, job_type):
    rows = _execute(using, sql.SELECT_TASK_RESULT, {"id": job_id, "type": job_type})
    return rows[0] if rows else None


def _execute_no_rows(using, statement, params):
    with connections[using].cursor() as cursor:
        cursor.execute(statement, params)


# The dashboard's rollup and reads (rollup.py, dashboard.py). -------------------------------------


def rollup_minute(db, *, queues, bounds, catch_up):
    """Sample this minute's depth of ``queues`` (and of any queue with jobs) and count the jobs
    finished since the previous sample, unless another worker did this minute already.
    Returns ``(queues sampled, finished rows written)``; ``(0, 0)`` when it was done already."""
    if not _execute(db, sql.ROLLUP_DUE, {})[0][0]:
        return 0, 0
    params = {"queues": list(queues), "bounds": list(bounds), "catch_up": float(catch_up)}
    sampled, rolled = _execute(db, sql.ROLLUP_MINUTE, params)[0]
    return sampled, rolled


def prune_rollup(db, *, age, limit):
    """Delete up to ``limit`` rows of each rollup table older than ``age`` seconds; returns n."""
    params = {"age": float(age), "limit": limit}
    return sum(
        _execute(db, statement, params)[0][0]
        for statement in (sql.PRUNE_DEPTH, sql.PRUNE_FINISHED_MINUTES)
    )


def dashboard_clock(using, *, window):
    """``(now, since, split)`` in database time: see ``sql.DASHBOARD_CLOCK``."""
    return _execute(using, sql.DASHBOARD_CLOCK, {"window": float(window)})[0]


def dashboard_finished(using, *, since, split, step):
    """``[(bucket, type, done, dead, cancelled, failed_attempts), ...]``."""
    params = {"since": since, "split": split, "step": float(step)}
    return _execute(using, sql.DASHBOARD_FINISHED, params)


def dashboard_waits(using, *, since, split, step, bounds):
    """``[(bucket, bin, count), ...]``: waits as bins of ``bounds`` (see width_bucket)."""
    params = {"since": since, "split": split, "step": float(step), "bounds": list(bounds)}
    return _execute(using, sql.DASHBOARD_WAITS, params)


def dashboard_depth(using, *, since, step):
    """``[(bucket, queue, due, scheduled, running), ...]``: the largest sample per bucket."""
    return _execute(using, sql.DASHBOARD_DEPTH, {"since": since, "step": float(step)})


def dashboard_workers(using, *, limit=200):
    """``[(worker_id, [queues], jobs, stuck, heartbeat_age_seconds), ...]``, by worker id."""
    return _execute(using, sql.DASHBOARD_WORKERS, {"limit": limit})


# The worker registry (presence.py) ------------------------------------------------------------


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
    _execute(db, sql.ANNOUNCE_WORKER, params)


def withdraw_worker(db, worker):
    _execute(db, sql.WITHDRAW_WORKER, {"worker": worker})


def forget_expired_workers(db):
    """Delete the rows of workers past their expiry; returns ``[(worker_id, heartbeat_at)]``."""
    return _execute(db, sql.FORGET_EXPIRED_WORKERS, {})


def live_workers(using, *, limit=1000):
    """``[(worker_id, host, pid, version, [queues], concurrency, execution, group_pid, state,
    started_at, heartbeat_at, stale, heartbeat_age_seconds, running_at_beat, running_now),
    ...]``: the unexpired rows of the registry, by host and start."""
    return _execute(using, sql.LIVE_WORKERS, {"limit": limit})


# Flow control (flow.py) ---------------------------------------------------------------------------


def pause_queue(using, *, name, by):
    _execute(using, sql.PAUSE_QUEUE, {"name": name, "by": by})


def resume_queue(using, *, name, by, channel):
    """Resume and wake the queue's workers (at the commit of the caller's transaction)."""
    _execute(using, sql.RESUME_QUEUE, {"name": name, "by": by, "channel": channel})


def ensure_queues(using, names):
    _execute_no_rows(using, sql.ENSURE_QUEUES, {"names": list(names)})


def flow_state(using):
    """``{"queues": {name: (paused, changed_at, changed_by)}, "running_queue": {queue: n},
    "running_type": {type: n}}``."""
    state = {"queues": {}, "running_queue": {}, "running_type": {}}
    for kind, name, value, changed_at, changed_by, _ in _execute(using, sql.FLOW_STATE, {}):
        if kind == "queue":
            state["queues"][name] = (bool(value), changed_at, changed_by or "")
        elif kind == "running-queue":
            state["running_queue"][name] = value
        elif kind == "running-type":
            state["running_type"][name] = value
    return state


def rate_window(using, *, scope, name, part, limit, period):
    """When the rate window of a limiter row has room again (database time), or ``None`` when
    it has room now (or has no row yet)."""
    params = {"scope": scope, "name": name, "part": part, "limit": limit, "period": period}
    rows = _execute(using, sql.RATE_WINDOW, params)
    return rows[0][1] if rows and rows[0][0] <= 0 else None
