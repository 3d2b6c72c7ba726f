"""Awaited results: ``wait_for_result(job_id, timeout=...)`` and ``await await_result(...)``.

The waiter opens a connection of its own (autocommit: it never holds a transaction while it
waits), LISTENs on ``"<NOTIFY_CHANNEL>.done"`` and holds the advisory lock that tells the
statements finishing jobs that somebody waits (store/completion.py, ``RESULT_WAITED``): those
statements then notify the finished ids, delivered at their commit. The waiter reads the job
after it starts listening, again on each notification naming it, and at a poll that backs off
from 50 ms to 1 s: a job finished by a path that does not notify (the sweeper's dead letters, a
cancel while pending) or in the instant before the waiter's lock is found by the poll.
"""

import asyncio
import collections
import contextlib
import select
import time

import psycopg
from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction
from psycopg import sql

from . import decoding, schema, store, validation
from .conf import get_settings
from .connections import connect
from .exceptions import DBQueueError, InvalidArgument, JobCancelled
from .jobspec import EnqueuedJob, database
from .store.completion import RESULT_LOCK

POLL_FIRST, POLL_MAX = 0.05, 1.0  # seconds: the poll's backstop, doubling


class JobNotFound(DBQueueError, LookupError):
    """No such job: it never existed, or retention deleted it."""


class JobFailed(DBQueueError):
    """The awaited job ended in the dead letters. ``error`` is its last error (a dict with
    ``class``, ``message``, ``attempt``...), ``job_id`` its id."""

    def __init__(self, job_id, error):
        self.job_id, self.error = job_id, error or {}
        what = f"{self.error.get('class', '?')}: {self.error.get('message', '')}"
        super().__init__(f"job #{job_id} is dead; its last error: {what}")


def _task_result(value, using):
    """``(job id, database)`` of a ``django.tasks`` ``TaskResult`` of this queue's backend, or
    None when ``value`` is no TaskResult (Django 5.2 has none)."""
    try:
        from django.tasks import TaskResult, task_backends
    except ImportError:
        return None
    if not isinstance(value, TaskResult):
        return None
    from ._django_tasks import DBQueueBackend

    backend = task_backends[value.backend]
    if not isinstance(backend, DBQueueBackend):
        raise InvalidArgument(
            f"wait_for_result(): the TaskResult {value.id!r} belongs to the backend "
            f"{value.backend!r} ({type(backend).__name__}), not to a DBQueueBackend"
        )
    return int(value.id), using or backend.using


def _job_id(value, using=None):
    """``(job id, database alias or None)`` of what wait_for_result() was given."""
    if isinstance(value, EnqueuedJob):
        return value.id, using
    if (task := _task_result(value, using)) is not None:
        return task
    if validation.job_id_problem(value) is not None:
        raise InvalidArgument(
            "wait_for_result(): job_id must be a job id (an int from 1 to 2**63-1), an "
            f"EnqueuedJob or a django.tasks TaskResult, got {validation.shown(value)}"
        )
    return value, using


def _timeout(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e9:
        raise InvalidArgument(
            f"wait_for_result(): timeout must be a number of seconds >= 0 or None, got "
            f"{validation.shown(value)}"
        )
    return float(value)


READ_RESULT = """
SELECT state, result::text, errors -> -1, cancelled_by FROM dbqueue_job WHERE id = %s::bigint
"""


def _outcome(conn, job_id):
    """``(True, result)`` for a finished job (or raises for a dead or cancelled one),
    ``(False, None)`` for one that has not finished. A database without the queue's tables
    raises psycopg's error here; the callers turn it into ``NotMigrated`` (the read runs on the
    waiter's own connection, so a caller's transaction is untouched: ``aborted=False``)."""
    row = conn.execute(READ_RESULT, [job_id]).fetchone()
    if row is None:
        raise JobNotFound(f"no job #{job_id} (it never existed, or retention deleted it)")
    state, result, error, cancelled_by = row
    if state == "done":
        return True, decoding.json_value(result, f"the result of job #{job_id}")
    if state == "dead":
        raise JobFailed(job_id, error)
    if state == "cancelled":
        raise JobCancelled(f"job #{job_id} was cancelled (by {cancelled_by or '?'})")
    return False, None


def _raise_if_uncommitted(job_id, using):
    """The waiter found no job ``job_id``: when the caller's transaction on ``using`` sees it
    (it enqueued the job and has not committed), say so; else return. Asked only then, on the
    caller's connection; an aborted transaction there cannot tell, and the not-found stands."""
    if not connections[using].in_atomic_block:
        return
    try:
        with transaction.atomic(using=using):  # a savepoint: a failure here harms nothing
            seen = store.job_status(using, job_id) is not None
    except DatabaseError:
        return
    if seen:
        raise InvalidArgument(
            f"wait_for_result(): job #{job_id} is not committed yet: it was enqueued in the "
            "transaction open on this connection (transaction.atomic()), which no worker can "
            "see, so it cannot finish inside this transaction. Wait for it after the atomic "
            "block commits (for example from transaction.on_commit())"
        )


def _names(payload, job_id):
    """Whether a notification's payload names ``job_id`` (or says to look again: ``*``)."""
    return payload == "*" or str(job_id) in payload.split(",")


def _open(using):
    conn = connect(using, application_name="dbqueue result waiter")
    # A notification that arrives while a statement runs (the job finished during our read) is
    # taken by psycopg, not left on the socket: a handler keeps its payload for _take_notifies.
    conn.dbqueue_heard = collections.deque()
    conn.add_notify_handler(lambda notify: conn.dbqueue_heard.append(notify.payload))
    try:
        channel = get_settings().NOTIFY_CHANNEL + ".done"
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        conn.execute(f"SELECT pg_advisory_lock_shared({RESULT_LOCK})")
    except BaseException:
        conn.close()
        raise
    return conn


def _take_notifies(conn, job_id):
    """Read what arrived on the socket; True when a notification names ``job_id``."""
    pgconn = conn.pgconn
    pgconn.consume_input()
    named = False
    while (notify := pgconn.notifies()) is not None:
        named = named or _names(notify.extra.decode("utf-8", "replace"), job_id)
    heard = conn.dbqueue_heard
    while heard:
        named = _names(heard.popleft(), job_id) or named
    return named


def wait_for_result(job_id, timeout=None, *, using=None):
    """Wait until the job ``job_id`` (an id, an ``EnqueuedJob`` or a ``django.tasks``
    ``TaskResult``: then ``result.refresh()`` shows what it ended with) finishes and return its
    decoded result; raise ``JobFailed`` (with its last error) for a dead job, ``JobCancelled``
    for a cancelled one, ``JobNotFound`` when there is no such job, and ``TimeoutError`` when
    it has not finished within ``timeout`` seconds (None: no limit). Holds no transaction open;
    call it outside ``transaction.atomic()`` when the job was enqueued there: it can only finish
    after that commit, and inside the block ``InvalidArgument`` says so at once."""
    (job_id, using), timeout = _job_id(job_id, using), _timeout(timeout)
    using = database(using)
    deadline = None if timeout is None else time.monotonic() + timeout
    with _open(using) as conn:
        poll = POLL_FIRST
        while True:
            try:
                finished, result = _outcome(conn, job_id)
            except psycopg.ProgrammingError as exc:
                schema.raise_if_unmigrated(exc, using, aborted=False)
                raise
            except JobNotFound:
                _raise_if_uncommitted(job_id, using)
                raise
            if finished:
                return result
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"job #{job_id} did not finish within {timeout:g}s")
            wait = poll if left is None else min(poll, left)
            end = time.monotonic() + wait
            while True:
                if conn.dbqueue_heard and _take_notifies(conn, job_id):
                    break  # it finished while we read it: read again at once
                left = max(0.0, end - time.monotonic())
                ready, _, _ = select.select([conn.fileno()], [], [], left)
                if not ready:
                    poll = min(POLL_MAX, poll * 2)
                    break
                if _take_notifies(conn, job_id):
                    break
                if time.monotonic() >= end:
                    break


async def await_result(job_id, timeout=None, *, using=None):
    """:func:`wait_for_result` for async code: the waiting is on the event loop (the socket),
    the short reads run in a thread; cancelling the task closes the waiter's connection."""
    (job_id, using), timeout = _job_id(job_id, using), _timeout(timeout)
    using = database(using)
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    conn = await asyncio.to_thread(_open, using)
    try:
        poll = POLL_FIRST
        while True:
            try:
                finished, result = await asyncio.to_thread(_outcome, conn, job_id)
            except psycopg.ProgrammingError as exc:
                # Asked on Django's connection, as async code uses the ORM.
                await sync_to_async(schema.raise_if_unmigrated)(exc, using, aborted=False)
                raise
            if finished:
                return result
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise TimeoutError(f"job #{job_id} did not finish within {timeout:g}s")
            wait = poll if left is None else min(poll, left)
            end = loop.time() + wait
            while True:
                if conn.dbqueue_heard and _take_notifies(conn, job_id):
                    break  # it finished while we read it: read again at once
                readable = loop.create_future()
                loop.add_reader(conn.fileno(), _set, readable)
                try:
                    await asyncio.wait_for(readable, max(0.0, end - loop.time()))
                except TimeoutError:
                    poll = min(POLL_MAX, poll * 2)
                    break
                finally:
                    loop.remove_reader(conn.fileno())
                if _take_notifies(conn, job_id) or loop.time() >= end:
                    break
    finally:
        with contextlib.suppress(psycopg.Error):
            await asyncio.to_thread(conn.close)


def _set(future):
    if not future.done():
        future.set_result(None)
