"""The wake-up at the store level (docs/wakeups.md): whether an enqueue's job wants one (the
advisory locks of waiters.py, which the enqueue's INSERT tests), the notifications sent after a
commit or inside the caller's transaction (named or not), and a worker's waiting (its slots,
START_WAITING, AWAIT_ENQUEUERS, STOP_WAITING). wakeup.py sends; waiters.py says when a worker
waits. Values are bound parameters; nothing is prepared (a transaction pooler may sit in
between).
"""

from django.db import connections
from psycopg import pq

from ..conf import get_settings

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
NOTIFY = """
SELECT pg_notify(%(channel)s, payload), set_config('synchronous_commit', 'off', true)
FROM unnest(%(payloads)s::text[]) AS payload
"""

# The same inside a transaction that the caller commits by hand (Django's manual transaction
# management, where there is no on_commit): delivered at their commit, their durability untouched.
NOTIFY_AT_COMMIT = """
SELECT pg_notify(%(channel)s, payload) FROM unnest(%(payloads)s::text[]) AS payload
"""

# Wake-ups that name their workers (migration 0014, waiters.py): a waiting worker with a free
# thread holds a slot of its queue, one of WAKEUP_SLOTS session advisory locks keyed by
# hashtextextended('<channel>:<queue>', slot), and LISTENs on that slot's own channel. The
# sender's statement (dbqueue_wake) picks held slots at random, one more than its jobs, and
# notifies those channels only, with the payload "<count>/<slot>.<slot>:<queue>": one job does
# not wake every idle worker, nor send it into a claim. Where it finds too few held slots, it
# notifies the main channel, naming nobody. Sent while WAKEUP_IF_WAITING is on (off, every
# waiting worker hears every wake-up, as workers of earlier releases expect). A wake-up that
# rides in the caller's own transaction (NOTIFY_AT_COMMIT) names nobody: the workers it would
# name are the ones of the statement's instant, not of the commit's.
WAKEUP_SLOTS = 256  # a waiter beyond them holds none and acts on every wake-up
NOTIFY_NAMED = f"""
SELECT dbqueue_wake(%(channel)s, payload, {WAKEUP_SLOTS}),
       set_config('synchronous_commit', 'off', true)
FROM unnest(%(payloads)s::text[]) AS payload
"""

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

# A worker starts waiting for wake-ups on its queues: WAITING, shared, at session level, one per
# queue. An enqueue holds WAITING exclusively for an instant only, so the wait is short; the
# statement's own lock_timeout (per lock) bounds it should a session keep it. Locks taken before
# a timeout stay taken (session locks ignore the rollback); taking one twice counts it twice, and
# STOP_WAITING drops every count.
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
