"""The wake-up of workers at the store level: whether an enqueue's job wants one (the
advisory locks of waiters.py), the NOTIFY statements sent after a commit or inside the caller's
transaction (named or not), the pipeline that sends them behind the caller's COMMIT, and a
worker's waiting (slots, START_WAITING, AWAIT_ENQUEUERS, STOP_WAITING).

Moved verbatim from store.py and sql.py (issue 26): the wake-up is being redesigned, and this
module is replaced as one block."""

import logging

from ._db import _execute

logger = logging.getLogger("django_dbqueue")


# Whether an enqueue's job wants a wake-up (waiters.py explains it). Two advisory locks per
# queue, keyed by the queue's hashtext() (computed by the server on both sides: the enqueue binds
# nothing more for them), of two classes: WAITING ('dbq1' in ASCII), held shared at session level
# by every worker that waits for a wake-up on the queue (START_WAITING), and ENQUEUING ('dbq2'),
# held shared by an enqueue that found nobody waiting, until its transaction ends. The CASE fixes
# the order of its steps; a wake-up is wanted (true) at the first that fails:
# 1. WAITING, tried exclusively and let go of at once (a session lock for an instant: concurrent
#    enqueues do not hold it against each other): a worker waits, or is starting to. The common
#    case while workers are idle ends here, holding nothing.
# 2. ENQUEUING, shared, held until this transaction ends: a worker that starts waiting from now
#    on waits for this commit before its claim (AWAIT_ENQUEUERS). Only enqueues that found nobody
#    hold it, so a worker starting to wait waits for those alone, and they are finite: once it
#    waits, later enqueues stop at step 1.
# 3. WAITING again, as in 1, now that ENQUEUING is held: a worker that started waiting between 1
#    and 2 is found here (its AWAIT_ENQUEUERS may have passed before this held ENQUEUING).
WAITING_LOCK = 0x64627131
ENQUEUING_LOCK = 0x64627132


def _wakeup_wanted(queue):
    key = f"hashtext({queue})"
    look = f"pg_try_advisory_lock({WAITING_LOCK}, {key})"
    done = f"pg_advisory_unlock({WAITING_LOCK}, {key})"
    return (
        f"CASE WHEN NOT {look} THEN true WHEN NOT {done} THEN true"
        f" WHEN NOT pg_try_advisory_xact_lock_shared({ENQUEUING_LOCK}, {key}) THEN true"
        f" WHEN {look} THEN NOT {done} ELSE true END"
    )


# The same once per queue of a batch (enqueue_many, a workflow), from its inserted rows.
WAKEUPS_WANTED = f"""
SELECT q.queue, {_wakeup_wanted("q.queue")} AS wanted
FROM (SELECT DISTINCT queue FROM inserted) AS q
"""

# The wake-up: one notification per queue, payload "<count>:<queue>", sent after the jobs'
# transaction committed, as a transaction of its own. NOTIFY takes a cluster-wide lock at commit
# and holds it until the commit is done; synchronous_commit = off for this transaction only
# (set_config's is_local) makes that commit not wait for the WAL flush, so the lock is held for
# microseconds and enqueuing commits never queue behind a flush. Losing it in a crash loses
# nothing but a wake-up (the worker's poll is the backstop). Never run inside a caller's open
# transaction: that would turn off synchronous commit for the caller's own writes.
NOTIFY_WORKERS = """
SELECT pg_notify(%(channel)s, payload), set_config('synchronous_commit', 'off', true)
FROM unnest(%(payloads)s::text[]) AS payload
"""

# One notification, for the pipeline that sends it right behind the caller's COMMIT
# (store.commit_and_notify): the same asynchronous commit of its own, one payload per statement
# (the pipeline binds plain text parameters, $1 and $2, rather than an array).
NOTIFY_ONE = b"SELECT pg_notify($1, $2), set_config('synchronous_commit', 'off', true)"

# The same inside a transaction that the caller commits by hand (Django's manual transaction
# management, where there is no on_commit): delivered at their commit, their durability untouched.
NOTIFY_WORKERS_AT_COMMIT = """
SELECT pg_notify(%(channel)s, payload) FROM unnest(%(payloads)s::text[]) AS payload
"""

# Wake-ups that name their workers (migration 0014, waiters.py): a waiting worker with a free
# thread holds a slot of its queue, one of WAKEUP_SLOTS session advisory locks keyed by
# hashtextextended('<channel>:<queue>', slot), and LISTENs on that slot's own channel. The
# sender's statement (dbqueue_wake) picks held slots at random, one more than its jobs, and
# notifies those channels only, with the payload "<count>/<slot>.<slot>:<queue>": one job does
# not wake every idle worker, nor send it into a claim. Where it finds too few held slots, it
# notifies the main channel, naming nobody. The two statements sent after a commit, naming;
# sent while WAKEUP_IF_WAITING is on (off, every waiting worker hears every wake-up, as workers
# of earlier releases expect). A wake-up that rides in the caller's own transaction
# (NOTIFY_WORKERS_AT_COMMIT) names nobody: the workers it would name are the ones of the
# statement's instant, not of the commit's, and the caller's transaction runs nothing of ours
# that an unapplied migration could fail.
WAKEUP_SLOTS = 256  # a waiter beyond them holds none and acts on every wake-up
NOTIFY_WORKERS_NAMED = f"""
SELECT dbqueue_wake(%(channel)s, payload, {WAKEUP_SLOTS}),
       set_config('synchronous_commit', 'off', true)
FROM unnest(%(payloads)s::text[]) AS payload
"""
NOTIFY_ONE_NAMED = (
    f"SELECT dbqueue_wake($1, $2, {WAKEUP_SLOTS}), set_config('synchronous_commit', 'off', true)"
).encode()

# A waiting worker with a free thread takes a slot of each of its queues: the lowest free one
# (NULL where every slot is held: it then acts on every wake-up), and LISTENs on its channel
# instead of the one of the slot it held before (%(listened)s, per queue). It gives them back
# when every thread is busy (GIVE_SLOTS), or with the rest of its locks when it stops waiting;
# it keeps listening on the channel of the slot it gave back until it takes another one.
TAKE_SLOTS = (
    f"SELECT dbqueue_take_slots(%(channel)s, %(queues)s::text[], {WAKEUP_SLOTS}, "
    "%(listened)s::int[])"
)
GIVE_SLOTS = """
SELECT count(pg_advisory_unlock(hashtextextended(%(channel)s || ':' || q, s))::text)
FROM unnest(%(queues)s::text[], %(slots)s::int[]) AS given (q, s)
"""

# A worker starts waiting for wake-ups on its queues (waiters.py): WAITING, shared, at session
# level, one per queue. An enqueue holds WAITING exclusively for an instant only, so the wait is
# short; the statement's own lock_timeout (per lock) bounds it should a session keep it. Locks
# taken before a timeout stay taken (session locks ignore the rollback); taking one twice counts
# it twice, and STOP_WAITING drops every count.
START_WAITING = f"""
WITH timeout AS MATERIALIZED (SELECT set_config('lock_timeout', %(timeout)s, true))
SELECT count(pg_advisory_lock_shared({WAITING_LOCK}, hashtext(q))::text)
FROM timeout, unnest(%(queues)s::text[]) AS q
"""

# Then, before its next claim: ENQUEUING exclusively, for an instant per queue, waits for the
# enqueues that found nobody waiting and have not ended (they hold it shared), so that the claim
# sees their jobs. The enqueues that look after START_WAITING find the worker at their first
# step and never take ENQUEUING, so this waits for a finite set of transactions. The CASE takes
# each lock and lets go of it before the next. lock_timeout (per lock) bounds the wait for an
# enqueue whose transaction stays open; the worker tries again later.
AWAIT_ENQUEUERS = f"""
WITH timeout AS MATERIALIZED (SELECT set_config('lock_timeout', %(timeout)s, true))
SELECT count(CASE WHEN pg_advisory_lock({ENQUEUING_LOCK}, hashtext(q))::text IS NOT NULL
                  THEN pg_advisory_unlock({ENQUEUING_LOCK}, hashtext(q)) END)
FROM timeout, unnest(%(queues)s::text[]) AS q
"""

# A worker stops waiting (a full claim: it claims again by itself). Every session-level advisory
# lock of the worker's own connection is one of these, so all of them go, every count.
STOP_WAITING = "SELECT pg_advisory_unlock_all()"


_NAMING_MISSING = []  # a named wake-up found migration 0014's function missing (see _missing)


def _naming():
    """Whether wake-ups name the workers that claim (NOTIFY_WORKERS_NAMED): while
    ``DBQUEUE["WAKEUP_IF_WAITING"]`` is on, and the function that names them is there."""
    from ..conf import get_settings

    return not _NAMING_MISSING and get_settings().WAKEUP_IF_WAITING is not False


def _missing(error):
    """Whether ``error`` says that ``dbqueue_wake()`` does not exist: the migration
    that adds it (0014) is not applied yet. This process then stops naming (until it restarts)
    and the caller sends the wake-up again as earlier releases did, so that a deployment whose
    code runs before its migration loses no wake-up."""
    from psycopg import errors

    cause = error.__cause__ if not isinstance(error, errors.Error) else error  # Django wraps
    if not isinstance(cause, errors.UndefinedFunction) or "dbqueue_wake" not in str(cause):
        return False
    if not _NAMING_MISSING:
        _NAMING_MISSING.append(True)
        logger.warning(
            "dbqueue: wake-ups cannot name their workers before migration "
            "django_dbqueue.0014_wakeup_slots is applied (%s); this process wakes every "
            "waiting worker until it restarts",
            error,
        )
    return True


def notify_workers(using, *, channel, payloads):
    """Send one notification per payload on ``channel`` as a transaction of its own that does not
    wait for the WAL flush. Only on a connection in autocommit, outside any transaction."""
    params = {"channel": channel, "payloads": list(payloads)}
    if _naming():
        try:
            _execute(using, NOTIFY_WORKERS_NAMED, params)
            return
        except Exception as exc:  # psycopg's, or Django's wrapping it
            if not _missing(exc):
                raise
    _execute(using, NOTIFY_WORKERS, params)


def commit_and_notify(connection, sends, *, named=None):
    """Commit ``connection``'s open transaction (a psycopg connection, Django's underneath) and
    send the wake-ups ``[(channel, payloads), ...]`` after it, in one round trip: the COMMIT and
    one ``NOTIFY_ONE`` per payload go out in one libpq pipeline. The COMMIT is the caller's
    own (their synchronous_commit); the notifications run after it in an implicit transaction of
    their own, which set_config turns asynchronous for itself alone. Nothing is prepared (a
    transaction pooler may sit in between); values are bound parameters.

    Returns None, or the exception of a wake-up that failed after the COMMIT succeeded (the
    caller's data is committed: that must not be raised as a failed commit). An exception of the
    COMMIT itself, or of a connection lost before its result came back, propagates; the
    wake-ups after it did not run. Returns False, having done nothing, when the connection is
    not in a plain open transaction (the caller then commits the usual way).

    This drives libpq directly (psycopg.pq) rather than through psycopg's ``pipeline()``: with
    psycopg's pure-Python build that costs a few ctypes calls instead of about as much CPU as
    the COMMIT itself (``benchmarks/commit_wakeup.py``).
    """
    from psycopg import errors, pq

    results = _notify_pipeline(connection, sends, commit=True, named=named)
    if results is False:
        return False
    encoding = connection.info.encoding
    commit = results[0] if results else None
    if commit is None or commit.status != pq.ExecStatus.COMMAND_OK:
        if commit is not None and commit.status == pq.ExecStatus.FATAL_ERROR:
            raise errors.error_from_result(commit, encoding=encoding)
        raise errors.OperationalError("the COMMIT's result did not come back")
    error = _first_error(results[1:], encoding)
    if error is not None and _missing(error):
        try:
            return notify_now(connection, sends, named=False) or None
        except Exception as again:
            return again
    return error


def notify_now(connection, sends, *, named=None):
    """Send the wake-ups ``[(channel, payloads), ...]`` on ``connection`` (a psycopg connection
    in autocommit, idle: a wake-up sender's own, or Django's outside a transaction) as one
    transaction of their own that does not wait for the WAL flush, in one round trip, driving
    libpq directly as :func:`commit_and_notify` does. Raises what went wrong; returns False,
    having done nothing, when the connection is not idle (a transaction is open: the caller
    must not turn off synchronous commit for it)."""
    results = _notify_pipeline(connection, sends, commit=False, named=named)
    if results is False:
        return False
    error = _first_error(results, connection.info.encoding)
    if error is not None:
        if named is not False and _missing(error):
            return notify_now(connection, sends, named=False)
        raise error
    return None


def _first_error(results, encoding):
    from psycopg import errors, pq

    for result in results:
        if result.status == pq.ExecStatus.FATAL_ERROR:
            return errors.error_from_result(result, encoding=encoding)
    return None


def _notify_pipeline(connection, sends, *, commit, named):
    """Run [COMMIT,] NOTIFY_ONE per payload in one libpq pipeline; the results in order, or
    False when the connection is not in the state this needs (nothing sent). ``named``: whether
    the payloads name their workers (NOTIFY_ONE_NAMED; None: as the settings say)."""
    from psycopg import pq

    pgconn = connection.pgconn
    wanted = pq.TransactionStatus.INTRANS if commit else pq.TransactionStatus.IDLE
    with connection.lock:
        if pgconn.transaction_status != wanted or pgconn.pipeline_status != pq.PipelineStatus.OFF:
            return False
        encoding = connection.info.encoding
        named = _naming() if named is None else named
        statement = NOTIFY_ONE_NAMED if named else NOTIFY_ONE
        pgconn.enter_pipeline_mode()
        try:
            if commit:
                pgconn.send_query_params(b"COMMIT", None)
            for channel, payloads in sends:
                for item in payloads:
                    pgconn.send_query_params(
                        statement, [channel.encode(encoding), item.encode(encoding)]
                    )
            pgconn.pipeline_sync()
            return _pipeline_results(pgconn)
        finally:
            if pgconn.pipeline_status != pq.PipelineStatus.OFF:
                try:
                    pgconn.exit_pipeline_mode()
                except Exception:
                    # Interrupted with results still in flight, or broken: never hand such a
                    # connection back half-way through a pipeline: closed (the caller closes
                    # Django's wrapper too, which reconnects at its next use).
                    connection.close()


def _pipeline_results(pgconn):
    """Send what is queued and read every result up to the pipeline's sync."""
    import select as select_module

    from psycopg import errors, pq

    poller = select_module.poll()
    fileno = pgconn.socket
    poller.register(fileno, select_module.POLLIN | select_module.POLLOUT)
    while pgconn.flush():  # a full send buffer: read what the server sends meanwhile (libpq)
        if any(events & select_module.POLLIN for _, events in poller.poll()):
            pgconn.consume_input()
    poller.modify(fileno, select_module.POLLIN)
    results = []
    while True:
        while pgconn.is_busy():
            poller.poll()
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:  # the end of one statement's results
            continue
        if result.status == pq.ExecStatus.PIPELINE_SYNC:
            return results
        if result.status == pq.ExecStatus.PIPELINE_ABORTED:
            continue  # skipped after an earlier error: nothing ran
        results.append(result)
        if pgconn.status == pq.ConnStatus.BAD:
            raise errors.OperationalError("the connection was lost during the COMMIT")


def notify_workers_at_commit(using, *, channel, payloads):
    """The same, inside the caller's open transaction: delivered when they commit it."""
    _execute(using, NOTIFY_WORKERS_AT_COMMIT, {"channel": channel, "payloads": list(payloads)})


def start_waiting(db, queues, *, timeout_ms):
    """Say that this session waits for wake-ups on ``queues`` (waiters.py):
    ``START_WAITING``. Raises ``psycopg.errors.LockNotAvailable`` past ``timeout_ms``."""
    _execute(db, START_WAITING, {"queues": list(queues), "timeout": str(timeout_ms)})


def take_slots(db, queues, *, channel, listened=None):
    """Take a wake-up slot of each of ``queues`` and LISTEN on its channel (``TAKE_SLOTS``):
    ``{queue: slot or None}`` (None: every slot of it is held; this session then acts on every
    wake-up). ``listened``: ``{queue: slot}`` whose channels this session LISTENs on now (it
    stops, where the slot taken is another one)."""
    queues = list(queues)
    params = {
        "channel": channel,
        "queues": queues,
        "listened": [(listened or {}).get(queue) for queue in queues],
    }
    slots = _execute(db, TAKE_SLOTS, params)[0][0]
    return dict(zip(queues, slots, strict=True))


def give_slots(db, slots, *, channel):
    """Let go of the wake-up slots ``{queue: slot}`` (``GIVE_SLOTS``) held by ``db``."""
    queues = [queue for queue, slot in slots.items() if slot is not None]
    if queues:
        params = {"channel": channel, "queues": queues, "slots": [slots[q] for q in queues]}
        _execute(db, GIVE_SLOTS, params)


def await_enqueuers(db, queues, *, timeout_ms):
    """Wait for the enqueues on ``queues`` that found nobody waiting to end:
    ``AWAIT_ENQUEUERS``. Raises ``psycopg.errors.LockNotAvailable`` past ``timeout_ms``."""
    _execute(db, AWAIT_ENQUEUERS, {"queues": list(queues), "timeout": str(timeout_ms)})


def stop_waiting(db):
    """This session no longer waits for wake-ups: ``STOP_WAITING``."""
    _execute(db, STOP_WAITING, None)
