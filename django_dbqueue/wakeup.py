"""Waking the workers after a commit: one notification per queue, coalesced, never in the caller's
transaction.

A ``pg_notify`` inside the enqueuing transaction makes PostgreSQL take a cluster-wide lock at its
commit and hold it through the WAL flush, so concurrent enqueuing commits would queue behind one
another. Instead the jobs' writers (``enqueue``, ``enqueue_many``, requeue, run now) call
:func:`jobs_ready`, and the notification is sent once their transaction has committed:

- inside ``transaction.atomic()``: with the commit itself. The transaction's COMMIT and the
  notification go to the server in one pipeline (one round trip): the COMMIT first, with the
  caller's durability, then the notification in an implicit transaction of its own
  (:class:`_CommitWithWakeup`). Where the driver cannot pipeline, or the window below says
  "not now", one ``on_commit`` hook per transaction does it after the outermost block
  committed, on the same connection, now back in autocommit;
- in autocommit: right after the statement (it has committed);
- under manual transaction management (``set_autocommit(False)``, no ``on_commit`` there): inside
  the caller's transaction, delivered at their commit, as before.

The notification is a statement of its own, a transaction that does not wait for the WAL flush
(``sql.NOTIFY_WORKERS``), with the payload ``"<count>:<queue>"``. Per process, per database and
queue, at most one is sent per window (``DBQUEUE["WAKEUP_WINDOW"]``, 5 ms by default), with the
committing thread's commit: the first commit after a window has passed sends it, carrying the
count of every job committed since the previous one. So that the last jobs of a burst are never
left to the poll, a sender thread sends what is still pending half a window after the window
ended, when no commit came to carry it. That thread opens its own connection only when a burst
needs it, and closes it after :data:`IDLE_CLOSE` seconds without one. (Sending everything from
the thread would spare the committing thread its round trip, but was measured to slow a busy
process down more: the thread's Python work competes for the GIL with the requests.)

A wake-up is only a hint. A failed one is logged at WARNING and never raised: the caller's data
has committed. A crash between the commit and the notification costs latency, not the job: the
workers' poll finds it.
"""

import contextlib
import logging
import math
import os
import threading
import time
from collections import Counter

from django.db import connections, transaction
from django.db.backends.utils import debug_transaction

from . import store
from .conf import get_settings, setting_valid
from .connections import Session

logger = logging.getLogger("django_dbqueue.wakeup")

DEFAULT_WINDOW = 0.005  # seconds: WAKEUP_WINDOW's default
IDLE_CLOSE = 10.0  # seconds without a trailing notification before the sender closes its connection


def window():
    """``DBQUEUE["WAKEUP_WINDOW"]``: at most one notification per queue per process in this many
    seconds, plus the trailing one. A bad value (the system checks report it) falls back to the
    default here: a wake-up must never raise into the caller's commit."""
    value = get_settings().WAKEUP_WINDOW
    return value if setting_valid("WAKEUP_WINDOW", value) else DEFAULT_WINDOW


def payload(count, queue):
    """The notification's payload: how many jobs became ready on ``queue``."""
    return f"{count}:{queue}"


def jobs_ready(using, queues):
    """Wake the workers for jobs just written on ``using``'s current transaction.

    ``queues``: one queue name per job that a worker may claim now (scheduled jobs do not count).
    Sends nothing until that transaction commits, and nothing at all if it rolls back.
    """
    counts = Counter(queues)
    if not counts:
        return
    channel = get_settings().NOTIFY_CHANNEL
    connection = connections[using]
    if connection.in_atomic_block:
        _after_commit(connection, using).add(channel, counts)
    elif connection.get_autocommit():
        _COALESCER.committed(using, channel, counts)
    else:  # manual transaction management: no on_commit; ride in the caller's transaction
        store.notify_workers_at_commit(
            using, channel=channel, payloads=[payload(n, q) for q, n in counts.items()]
        )


class _AfterCommit:
    """The ``on_commit`` hook of one transaction: the counts of every ``jobs_ready`` call in it."""

    __slots__ = ("counts", "using")

    def __init__(self, using):
        self.using = using
        self.counts = {}  # channel -> Counter(queue -> jobs)

    def add(self, channel, counts):
        self.counts.setdefault(channel, Counter()).update(counts)

    def __call__(self):
        for channel, counts in self.counts.items():
            _COALESCER.committed(self.using, channel, counts)


def _registered(connection, hook):
    return any(entry[1] is hook for entry in connection.run_on_commit)


def _after_commit(connection, using):
    """This transaction's hook, registered on its first call. A hook that Django dropped (its
    savepoint or transaction rolled back) is no longer in ``run_on_commit``: start a new one.
    Where the driver can, the commit itself is made to carry the wake-up (_CommitWithWakeup);
    the hook then finds nothing left to send."""
    hook = getattr(connection, "_dbqueue_after_commit", None)
    if hook is None or not _registered(connection, hook):
        hook = _AfterCommit(using)
        connection._dbqueue_after_commit = hook
        transaction.on_commit(hook, using=using)
    if "_commit" not in connection.__dict__ and _can_pipeline(connection):
        connection._commit = _CommitWithWakeup(connection)
    return hook


def _can_pipeline(connection):
    global _PIPELINE
    if _PIPELINE is None:
        try:
            import psycopg

            _PIPELINE = psycopg.Pipeline.is_supported()
        except Exception:  # no psycopg 3 (or no libpq pipeline support): the hook sends
            _PIPELINE = False
    return (
        _PIPELINE
        and connection.vendor == "postgresql"
        and hasattr(connection.connection, "pipeline")
    )


_PIPELINE = None  # whether psycopg and its libpq support pipeline mode (looked up once)


def _earlier(sends, own):
    """What ``sends`` carried for earlier commits: the payloads less this transaction's jobs."""
    return [
        (channel, [p for p in (_minus(p, own[channel]) for p in payloads) if p])
        for channel, payloads in sends
    ]


def _minus(item, counts):
    """Payload ``item`` less the jobs of ``counts`` (queue -> jobs) on its queue, or None."""
    count, queue = item.split(":", 1)
    left = int(count) - counts.get(queue, 0)
    return payload(left, queue) if left > 0 else None


class _CommitWithWakeup:
    """The connection's ``_commit`` for one transaction that enqueued: the COMMIT and the
    wake-up in one round trip (``store.commit_and_notify``), instead of the COMMIT's round trip
    and then the ``on_commit`` hook's own.

    Installed as an attribute of the connection object, in front of the backend's method, and
    removed again by the first commit that calls it; a transaction that rolls back leaves it in
    place for the next commit, which finds no hook of its own and commits plainly. It takes the
    same decisions as the hook (the coalescing window, the trailing notification) at the moment
    of the commit. Django's commit bookkeeping is untouched: the same ``debug_transaction`` and
    error wrapping as the backend's own ``_commit``; a failed COMMIT raises as it would have,
    with no wake-up sent (and the coalesced counts of earlier commits that would have ridden on
    it handed to the sender thread); a wake-up that fails after a successful COMMIT is logged,
    never raised.
    """

    __slots__ = ("connection",)

    def __init__(self, connection):
        self.connection = connection

    def __call__(self):
        connection = self.connection
        connection.__dict__.pop("_commit", None)
        hook = getattr(connection, "_dbqueue_after_commit", None)
        plain = type(connection)._commit
        if connection.connection is None or hook is None or not hook.counts:
            return plain(connection)
        if not _registered(connection, hook):  # its transaction rolled back: not this one's
            return plain(connection)
        now = time.monotonic()
        own = hook.counts
        sends, later = [], {}
        for channel, counts in own.items():
            payloads, rest = _COALESCER.take_due(hook.using, channel, counts, now)
            if payloads:
                sends.append((channel, payloads))
            if rest:
                later[channel] = rest
        # Queues still inside their window stay with the on_commit hook, which hands them to
        # the trailing notification after the commit (never before it: a wake-up must not
        # arrive before the jobs it announces are visible).
        hook.counts = later
        if not sends:
            return plain(connection)
        try:
            with debug_transaction(connection, "COMMIT"), connection.wrap_database_errors:
                failed = store.commit_and_notify(connection.connection, sends)
        except BaseException:
            # No wake-up went out. This transaction's own jobs are gone with it; the counts of
            # earlier commits that were to ride on this one are handed to the sender thread.
            _COALESCER.give_back(hook.using, _earlier(sends, own))
            pg = connection.connection
            if pg is not None and pg.closed:  # interrupted mid-pipeline (store closed it)
                with contextlib.suppress(Exception):
                    connection.close()  # Django reconnects at the next use
            raise
        if failed is False:  # not a plain open transaction: the backend's own commit, the hook
            _COALESCER.give_back(hook.using, _earlier(sends, own))
            hook.counts = own
            return plain(connection)
        if failed is not None:
            _COALESCER.give_back(hook.using, sends)
            logger.warning(
                "dbqueue could not wake the workers (%s) after a commit on %r: %s; the sender "
                "thread tries again, and their poll will find the jobs",
                ", ".join(p for _, payloads in sends for p in payloads),
                hook.using,
                failed,
            )
        return None


class _Coalescer:
    """Per process: when each queue was last notified, and what waits for the trailing one."""

    def __init__(self):
        self._cond = threading.Condition()
        self._last = {}  # (using, channel, queue) -> time.monotonic() of the last notification
        self._pending = {}  # (using, channel, queue) -> jobs waiting for the trailing notification
        self._sender = None
        self._sending = 0  # trailing notifications taken off _pending and not yet sent
        self._close_requested = False

    def committed(self, using, channel, counts):
        """Jobs committed on ``using``: notify now on this thread's connection, or add them to
        the trailing notification when their queue was notified less than a window ago."""
        now = time.monotonic()
        send = self.take(using, channel, counts, now)
        if send:
            self._send_here(using, channel, send, now)

    def take(self, using, channel, counts, now):
        """The payloads to send now for ``counts`` (queue -> jobs) committed at ``now``; the rest
        wait for the trailing notification (the sender thread is told)."""
        with self._cond:
            send, rest = self._split_due(using, channel, counts, now)
            for queue, count in rest.items():
                key = (using, channel, queue)
                if key in self._pending:  # the sender already knows when it falls due
                    self._pending[key] += count
                else:
                    self._pending[key] = count
                    self._start_sender()
                    self._cond.notify_all()
        return send

    def take_due(self, using, channel, counts, now):
        """Before a commit: the payloads of the queues whose window has passed (each with the
        count of earlier commits waiting for the trailing notification), and the counts of
        the others, left untouched (they go to take() after the commit)."""
        with self._cond:
            return self._split_due(using, channel, counts, now)

    def _split_due(self, using, channel, counts, now):
        send, rest, span = [], {}, window()
        for queue, count in counts.items():
            key = (using, channel, queue)
            if now - self._last.get(key, -math.inf) >= span:
                self._last[key] = now
                send.append(payload(count + self._pending.pop(key, 0), queue))
            else:
                rest[queue] = count
        return send, rest

    def give_back(self, using, sends):
        """Payloads that were taken but not sent: the sender thread sends them at once."""
        with self._cond:
            now, span = time.monotonic(), window()
            for channel, payloads in sends:
                for item in payloads:
                    count, queue = item.split(":", 1)
                    key = (using, channel, queue)
                    self._pending[key] = self._pending.get(key, 0) + int(count)
                    self._last[key] = now - 2 * span  # due at once
            self._start_sender()
            self._cond.notify_all()

    def _send_here(self, using, channel, payloads, now):
        connection = connections[using]
        if connection.in_atomic_block or not connection.get_autocommit():
            # A transaction is open again (an earlier on_commit hook opened one): sending here
            # would turn off synchronous commit for it. The sender thread sends instead.
            self.give_back(using, [(channel, payloads)])
            return
        try:
            connection.ensure_connection()
            with connection.wrap_database_errors:
                sent = store.notify_now(connection.connection, [(channel, payloads)])
            if sent is False:
                # Not idle after all: a transaction opened behind Django's back (a raw BEGIN),
                # which may hold the very jobs counted here. Their wake-up rides in it, as a
                # plain NOTIFY delivered at its commit (its synchronous commit untouched); the
                # sender thread also sends the counts at once, for jobs of earlier commits
                # coalesced into them (a claim too early for the others costs a claim).
                store.notify_workers_at_commit(using, channel=channel, payloads=payloads)
                self.give_back(using, [(channel, payloads)])
        except Exception as exc:  # the caller's data has committed: never raise into them
            logger.warning(
                "dbqueue could not wake the workers (%s) after a commit on %r: %s; their poll "
                "will find the jobs",
                ", ".join(payloads),
                using,
                exc,
            )

    # The sender thread ----------------------------------------------------------------------
    def _start_sender(self):
        if self._sender is None or not self._sender.is_alive():
            self._sender = threading.Thread(target=self._run, name="dbqueue-wakeup", daemon=True)
            self._sender.start()

    def _take_due(self, now):
        """Pop the trailing notifications that are due: ``{(using, channel): [payload]}``, and
        the time the next one falls due (or None)."""
        due, next_due, span = {}, None, window()
        for key, count in list(self._pending.items()):
            # Half a window of grace: a commit arriving after the window carries the count
            # itself, on its own connection; the thread only covers the end of a burst.
            at = self._last.get(key, -math.inf) + 1.5 * span
            if at <= now:
                del self._pending[key]
                self._last[key] = now
                using, channel, queue = key
                due.setdefault((using, channel), []).append(payload(count, queue))
            else:
                next_due = at if next_due is None else min(next_due, at)
        return due, next_due

    def _run(self):
        sessions = {}  # using -> Session, opened when a burst first needs one
        last_sent = time.monotonic()
        while True:
            with self._cond:
                now = time.monotonic()
                due, next_due = self._take_due(now)
                cold = {key[0] for key in self._pending} - set(sessions)
                idle = self._close_requested or (
                    not due and next_due is None and sessions and now - last_sent >= IDLE_CLOSE
                )
                if not due and not cold and not idle:
                    if next_due is not None:
                        timeout = next_due - now
                    else:
                        timeout = last_sent + IDLE_CLOSE - now if sessions else None
                    self._cond.wait(timeout)
                    continue
                self._sending = len(due)
            for (using, channel), payloads in due.items():
                if using not in sessions:
                    sessions[using] = self._session(using)
                session = sessions[using]
                self._send(session, using, channel, payloads)
                last_sent = time.monotonic()
            for using in cold:  # connect while the window runs, not when it ends
                if using not in sessions:
                    sessions[using] = self._session(using, warm=True)
                    last_sent = time.monotonic()  # its idle time starts now
            if idle:
                for session in sessions.values():
                    session.close()
                sessions = {}
            with self._cond:
                self._sending = 0
                if idle:
                    self._close_requested = False
                self._cond.notify_all()

    @staticmethod
    def _session(using, *, warm=False):
        session = Session(using, prepare=False)
        if warm:
            try:
                session.execute("SELECT 1", None)
            except Exception as exc:  # the send will try again, and warn
                session.reset()
                logger.debug("dbqueue wake-up sender could not connect to %r: %s", using, exc)
        return session

    @staticmethod
    def _send(session, using, channel, payloads):
        try:
            if store.notify_now(session.connection(), [(channel, payloads)]) is False:
                store.notify_workers(session, channel=channel, payloads=payloads)
        except Exception as exc:
            session.reset()
            logger.warning(
                "dbqueue could not wake the workers (%s) on %r: %s; their poll will find the jobs",
                ", ".join(payloads),
                using,
                exc,
            )

    def flush(self, timeout, *, close):
        with self._cond:
            if close and self._sender is not None and self._sender.is_alive():
                self._close_requested = True
                self._cond.notify_all()
            return self._cond.wait_for(
                lambda: not self._pending and not self._sending and not self._close_requested,
                timeout,
            )

    def _after_fork(self):
        """In a forked child: the parent's sender thread and its pending counts stay with it."""
        self._cond = threading.Condition()
        self._last, self._pending, self._sender = {}, {}, None
        self._sending, self._close_requested = 0, False


_COALESCER = _Coalescer()
os.register_at_fork(after_in_child=_COALESCER._after_fork)


def flush(timeout=5.0, *, close=False):
    """Wait until every trailing notification of this process has been sent; with ``close``, also
    until the sender thread closed its connections (tests, before dropping their database).
    Returns False if that took longer than ``timeout`` seconds."""
    return _COALESCER.flush(timeout, close=close)


def jobs_cancelled(using, ids):
    """Tell the workers that the running jobs ``ids`` were marked for cancellation on
    ``using``'s current transaction: one ``"cancel:<ids>"`` notification per 200 jobs, sent
    once that transaction commits (nothing if it rolls back), like :func:`jobs_ready` but not
    coalesced: cancels are rare, and each one must reach its worker within milliseconds. A
    notification that is lost is made up for by the worker's next heartbeat."""
    from .notifications import cancel_payloads

    payloads = cancel_payloads(ids)
    if not payloads:
        return
    channel = get_settings().NOTIFY_CHANNEL
    connection = connections[using]
    if connection.in_atomic_block:
        transaction.on_commit(lambda: _send_cancel(using, channel, payloads), using=using)
    elif connection.get_autocommit():
        _send_cancel(using, channel, payloads)
    else:  # manual transaction management: ride in the caller's transaction
        store.notify_workers_at_commit(using, channel=channel, payloads=payloads)


def _libpq_idle(connection):
    """Whether Django's ``connection`` (connected here if it was not) is outside any transaction
    in libpq too: Django's autocommit says nothing of a raw BEGIN."""
    from psycopg import pq

    connection.ensure_connection()
    return connection.connection.pgconn.transaction_status == pq.TransactionStatus.IDLE


def _send_cancel(using, channel, payloads):
    connection = connections[using]
    try:
        if (
            connection.in_atomic_block
            or not connection.get_autocommit()
            or not _libpq_idle(connection)
        ):
            # A transaction is open: an earlier on_commit hook opened one, or a raw BEGIN did
            # behind Django's back (it may hold the cancel itself). Ride in it, as its commit
            # sends it (its durability untouched).
            store.notify_workers_at_commit(using, channel=channel, payloads=payloads)
        else:
            store.notify_workers(using, channel=channel, payloads=payloads)
    except Exception as exc:  # the cancel has committed: never raise into the caller
        logger.warning(
            "dbqueue could not notify the workers of a cancel (%s) on %r: %s; their next "
            "heartbeat tells them",
            ", ".join(payloads),
            using,
            exc,
        )
