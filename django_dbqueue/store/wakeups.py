"""The statements of the wake-up (docs/wakeups.md): whether an enqueue's job wants one, the
notifications, and a worker's waiting and slots. wakeup.py sends; waiters.py says when a worker
waits. Values are bound parameters; nothing is prepared (a transaction pooler may sit between).
"""

from django.db import connections
from psycopg import pq

from ..conf import get_settings

# Whether an enqueue's job wants a wake-up: two advisory locks per queue, keyed by the queue's
# hashtext(). WAITING ('dbq1') is held shared by every waiting worker; ENQUEUING ('dbq2') shared
# by an enqueue that found nobody waiting, until its transaction ends. The CASE wants a wake-up
# (true) at the first step that fails: 1. WAITING tried exclusively for an instant (a worker
# waits: the common idle case ends here); 2. ENQUEUING taken shared (a worker starting to wait
# now waits for this commit before its claim: AWAIT_ENQUEUERS); 3. WAITING again (a worker that
# started waiting between 1 and 2).
WAITING_LOCK = 0x64627131
ENQUEUING_LOCK = 0x64627132


def _wakeup_wanted(queue):
    key = f"hashtext({queue}::text)"
    look = f"pg_try_advisory_lock({WAITING_LOCK}, {key})"
    done = f"pg_advisory_unlock({WAITING_LOCK}, {key})"
    return (
        f"CASE WHEN NOT {look} THEN true WHEN NOT {done} THEN true"
        f" WHEN NOT pg_try_advisory_xact_lock_shared({ENQUEUING_LOCK}, {key}) THEN true"
        f" WHEN {look} THEN NOT {done} ELSE true END"
    )


# The same once per queue of a batch (enqueue_many, a workflow), from its inserted rows. Each
# queue as text: join it to the rows with ``w.queue = i.queue::text`` (USING (queue) would compare
# a text with a varchar, an operator pg_catalog has no exact one of).
WAKEUPS_WANTED = f"""
SELECT q.queue, {_wakeup_wanted("q.queue")} AS wanted
FROM (SELECT DISTINCT queue::text AS queue FROM inserted) AS q
"""

# One notification per payload, as a transaction of its own after the jobs' commit, with
# synchronous_commit off for it alone: NOTIFY's cluster-wide lock at commit is then held for
# microseconds, not through a WAL flush (a crash loses a wake-up; the poll finds the job). Never
# inside the caller's transaction: it would turn off synchronous commit for their writes.
NOTIFY = """
SELECT pg_notify(%(channel)s::text, payload),
       set_config('synchronous_commit'::text, 'off'::text, true)
FROM pg_catalog.unnest(%(payloads)s::text[]) AS payload
"""

# Inside a transaction the caller commits by hand (no on_commit there): delivered at their commit.
NOTIFY_AT_COMMIT = """
SELECT pg_notify(%(channel)s::text, payload) FROM pg_catalog.unnest(%(payloads)s::text[]) AS payload
"""

# Naming the workers (migration 0014): dbqueue_wake picks held slots at random, one more than the
# jobs, and notifies their channels with "<count>/<slot>.<slot>:<queue>", or the main channel
# when it finds too few. Off with WAKEUP_IF_WAITING = False; never for NOTIFY_AT_COMMIT (the
# slots of the statement's instant are not the commit's).
WAKEUP_SLOTS = 256  # a waiter beyond them holds none and acts on every wake-up
NOTIFY_NAMED = f"""
SELECT dbqueue_wake(%(channel)s::text, payload, {WAKEUP_SLOTS}::int),
       set_config('synchronous_commit'::text, 'off'::text, true)
FROM pg_catalog.unnest(%(payloads)s::text[]) AS payload
"""

# A waiting worker with a free thread takes the lowest free slot of each queue (NULL: all held)
# and LISTENs on its channel instead of the one it listened on (%(listened)s); it gives them back
# when every thread is busy, or with its other locks when it stops waiting.
TAKE_SLOTS = (
    f"SELECT dbqueue_take_slots(%(channel)s::text, %(queues)s::text[], {WAKEUP_SLOTS}::int, "
    "%(listened)s::int[])"
)
GIVE_SLOTS = """
SELECT pg_catalog.count(
           pg_advisory_unlock(hashtextextended(%(channel)s::text || ':' || q, s::bigint))::text)
FROM ROWS FROM (pg_catalog.unnest(%(queues)s::text[]), pg_catalog.unnest(%(slots)s::int[]))
    AS given (q, s)
"""

# A worker starts waiting: WAITING shared at session level, one per queue. lock_timeout (per lock)
# bounds the wait; locks taken before a timeout stay taken, and STOP_WAITING drops every count.
START_WAITING = f"""
WITH timeout AS MATERIALIZED (
    SELECT set_config('lock_timeout'::text, %(timeout)s::text, true)
)
SELECT pg_catalog.count(pg_advisory_lock_shared({WAITING_LOCK}, hashtext(q))::text)
FROM timeout, pg_catalog.unnest(%(queues)s::text[]) AS q
"""

# Then, before its next claim: ENQUEUING exclusively for an instant per queue waits for the
# enqueues that found nobody and have not ended (a finite set: later ones find the worker at
# step 1), so that the claim sees their jobs. lock_timeout bounds it; the worker tries again.
AWAIT_ENQUEUERS = f"""
WITH timeout AS MATERIALIZED (
    SELECT set_config('lock_timeout'::text, %(timeout)s::text, true)
)
SELECT pg_catalog.count(CASE WHEN pg_advisory_lock({ENQUEUING_LOCK}, hashtext(q))::text IS NOT NULL
                             THEN pg_advisory_unlock({ENQUEUING_LOCK}, hashtext(q)) END)
FROM timeout, pg_catalog.unnest(%(queues)s::text[]) AS q
"""

# A worker stops waiting (a full claim): all of its session's advisory locks are these.
STOP_WAITING = "SELECT pg_advisory_unlock_all()"


def _execute(db, statement, params):
    """Run on ``db``: a database alias (this thread's Django connection, through its cursor), a
    worker's Session, or a psycopg connection (a listener's)."""
    if isinstance(db, str):
        with connections[db].cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchall()
    return db.execute(statement, params)


def _sent_after_commit():
    """The statement sent after a commit: naming the workers while WAKEUP_IF_WAITING is on."""
    return NOTIFY if get_settings().WAKEUP_IF_WAITING is False else NOTIFY_NAMED


def notify(db, channel, payloads):
    """Send one notification per payload on ``channel`` (or on the channels of the workers it
    names), as a transaction of its own that does not wait for the WAL flush. Only on a
    connection in autocommit, outside any transaction."""
    _execute(db, _sent_after_commit(), {"channel": channel, "payloads": list(payloads)})


def notify_at_commit(using, channel, payloads):
    """The same inside the caller's open transaction, naming nobody: delivered when they commit
    it, their durability untouched."""
    _execute(using, NOTIFY_AT_COMMIT, {"channel": channel, "payloads": list(payloads)})


def notify_if_idle(connection, channel, payloads):
    """:func:`notify` on ``connection`` (a psycopg connection: Django's underneath, or a
    sender's own) when it is outside any transaction in libpq too (Django's autocommit says
    nothing of a raw BEGIN); else send nothing and return False. Raises what went wrong."""
    with connection.lock:
        if connection.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            return False
    params = {"channel": channel, "payloads": list(payloads)}
    connection.execute(_sent_after_commit(), params, prepare=False)
    return True


def start_waiting(db, queues, *, timeout_ms):
    """Say that this session waits for wake-ups on ``queues``: ``START_WAITING``. Raises
    ``psycopg.errors.LockNotAvailable`` past ``timeout_ms``."""
    _execute(db, START_WAITING, {"queues": list(queues), "timeout": str(timeout_ms)})


def await_enqueuers(db, queues, *, timeout_ms):
    """Wait for the enqueues on ``queues`` that found nobody waiting to end: ``AWAIT_ENQUEUERS``.
    Raises ``psycopg.errors.LockNotAvailable`` past ``timeout_ms``."""
    _execute(db, AWAIT_ENQUEUERS, {"queues": list(queues), "timeout": str(timeout_ms)})


def stop_waiting(db):
    """This session no longer waits for wake-ups: ``STOP_WAITING``."""
    _execute(db, STOP_WAITING, None)


def take_slots(db, queues, *, channel, listened=None):
    """Take a wake-up slot of each of ``queues`` and LISTEN on its channel (``TAKE_SLOTS``):
    ``{queue: slot or None}`` (None: every slot of it is held; this session then acts on every
    wake-up). ``listened``: ``{queue: slot}`` whose channels this session LISTENs on now (it
    stops, where the slot taken is another one)."""
    queues = list(queues)
    listened = listened or {}
    params = {"channel": channel, "queues": queues, "listened": [listened.get(q) for q in queues]}
    slots = _execute(db, TAKE_SLOTS, params)[0][0]
    return dict(zip(queues, slots, strict=True))


def give_slots(db, slots, *, channel):
    """Let go of the wake-up slots ``{queue: slot}`` (``GIVE_SLOTS``) held by ``db``."""
    queues = [queue for queue, slot in slots.items() if slot is not None]
    if queues:
        params = {"channel": channel, "queues": queues, "slots": [slots[q] for q in queues]}
        _execute(db, GIVE_SLOTS, params)
