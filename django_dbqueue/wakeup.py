"""Waking the workers after a commit (docs/wakeups.md, section 1, is the design).

The jobs' writers (``enqueue``, ``enqueue_many``, requeue, run now) call :func:`jobs_ready`; the
notification, ``"<count>:<queue>"``, is sent once their transaction has committed, as a statement
of its own that does not wait for the WAL flush (never inside the caller's transaction: a
``pg_notify`` there takes a cluster-wide lock at its commit). Inside ``atomic()`` an
``on_commit`` hook sends it; in autocommit, the statement's return; under manual transaction
management it rides in the caller's transaction. Per process, database and queue at most one is
sent per ``WAKEUP_WINDOW``, carrying the count of every job since the previous one; a sender
thread sends what is left once the window has passed, so the last jobs of a burst are never left
to the poll. A failed wake-up is logged at WARNING and never raised: the poll finds the jobs.
"""

import logging
import math
import os
import threading
import time
from collections import Counter

from django.db import connections, transaction

from .conf import get_settings, setting_valid
from .connections import Session
from .store import wakeups

logger = logging.getLogger("django_dbqueue.wakeup")

DEFAULT_WINDOW = 0.005  # seconds: WAKEUP_WINDOW's default
DEFER = 0.002  # seconds: how long deferred counts wait for their commit's last hook (defer())
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
        transaction.on_commit(_AfterCommit(connection, using, channel, counts), using=using)
    elif connection.get_autocommit():
        _COALESCER.committed(using, channel, counts)
    else:  # manual transaction management: no on_commit; ride in the caller's transaction
        wakeups.notify_at_commit(using, channel, [payload(n, q) for q, n in counts.items()])


class _AfterCommit:
    """The ``on_commit`` hook of one ``jobs_ready`` call, carrying its own counts and its place
    among the connection's hooks: the last one registered sends for all of the commit, the ones
    before it leave their counts with the coalescer (:meth:`_Coalescer.defer`), which sends them
    itself should the last ones have been dropped with a savepoint that rolled back."""

    __slots__ = ("channel", "connection", "counts", "seq", "using")

    def __init__(self, connection, using, channel, counts):
        self.connection, self.using, self.channel, self.counts = connection, using, channel, counts
        self.seq = getattr(connection, "_dbqueue_hooks", 0) + 1
        connection._dbqueue_hooks = self.seq  # our own attribute, not one of Django's

    def __call__(self):
        if self.seq == getattr(self.connection, "_dbqueue_hooks", 0):
            _COALESCER.committed(self.using, self.channel, self.counts)
        else:
            _COALESCER.defer(self.using, self.channel, self.counts)


class _Coalescer:
    """Per process: when each queue was last notified, and what waits for the trailing one."""

    def __init__(self):
        self._cond = threading.Condition()
        self._last = {}  # (using, channel, queue) -> time.monotonic() of the last notification
        self._pending = {}  # (using, channel, queue) -> jobs waiting for the trailing notification
        self._deferred = {}  # (using, channel, queue) -> not before: see defer()
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
        """The payloads to send now for ``counts`` (queue -> jobs) committed at ``now``, with
        the counts deferred by earlier hooks of the same commit; the rest wait for the trailing
        notification (the sender thread is told)."""
        with self._cond:
            counts = dict(counts)
            for key in [k for k in self._deferred if k[:2] == (using, channel)]:
                del self._deferred[key]
                counts.setdefault(key[2], 0)  # its count is in _pending: _split_due adds it
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

    def defer(self, using, channel, counts):
        """Counts of a hook that is not its commit's last: the last one sends them with its own
        (:meth:`take`); should it have been dropped, the sender thread does, after DEFER."""
        with self._cond:
            until = time.monotonic() + DEFER
            for queue, count in counts.items():
                key = (using, channel, queue)
                self._pending[key] = self._pending.get(key, 0) + count
                self._deferred.setdefault(key, until)
            self._start_sender()
            self._cond.notify_all()

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
            # A transaction is open again (an earlier hook opened one): the sender thread sends.
            self.give_back(using, [(channel, payloads)])
            return
        sent = given = False
        try:
            connection.ensure_connection()
            with connection.wrap_database_errors:
                sent = wakeups.notify_if_idle(connection.connection, channel, payloads)
            if not sent:
                # A raw BEGIN behind Django's back, which may hold these very jobs: ride in it
                # (delivered at its commit), and the sender thread sends the counts now too.
                self.give_back(using, [(channel, payloads)])
                given = True
                wakeups.notify_at_commit(using, channel, payloads)
        except Exception as exc:  # the caller's data has committed: never raise into them
            # The sender thread sends the counts on its own connection instead.
            if not sent and not given:
                self.give_back(using, [(channel, payloads)])
            logger.warning(
                "dbqueue could not wake the workers (%s) after a commit on %r: %s; the wake-up "
                "sender tries again on its own connection, and their poll finds the jobs anyway",
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
            # Half a window of grace: a commit after the window carries the count itself.
            at = max(self._last.get(key, -math.inf) + 1.5 * span, self._deferred.get(key, 0.0))
            if at <= now:
                del self._pending[key]
                self._deferred.pop(key, None)
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
                # Counts deferred to their commit's last hook need no connection yet.
                cold = {k[0] for k in self._pending if k not in self._deferred} - set(sessions)
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
            if not wakeups.notify_if_idle(session.connection(), channel, payloads):
                wakeups.notify(session, channel, payloads)
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
        self._last, self._pending, self._deferred, self._sender = {}, {}, {}, None
        self._sending, self._close_requested = 0, False


_COALESCER = _Coalescer()
os.register_at_fork(after_in_child=_COALESCER._after_fork)


def flush(timeout=5.0, *, close=False):
    """Wait until every trailing notification of this process has been sent; with ``close``, also
    until the sender thread closed its connections (tests, before dropping their database).
    Returns False if that took longer than ``timeout`` seconds."""
    return _COALESCER.flush(timeout, close=close)
