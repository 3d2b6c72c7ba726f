"""Who waits for a wake-up, so that an enqueue sends one only when a worker waits for it
(docs/wakeups.md, sections 2 and 3, is the design; store/wakeups.py has the statements).

A worker whose last claim came back short holds the queue's ``WAITING`` advisory lock shared, at
session level, and drops it when a claim comes back full; an enqueue tries that lock in its own
INSERT and wakes nobody when it is free. Before the claim that follows, the worker waits for the
enqueues that found nobody (``AWAIT_ENQUEUERS``), so that claim sees their jobs: a false
"nobody waits" cannot happen, a false "somebody waits" costs one wake-up.

A waiting worker with a free thread also holds a wake-up *slot* of each of its queues and
LISTENs on that slot's channel; the sender names held slots at random, one more than it has
jobs, so that one job does not wake a fleet of separate processes. It gives its slots back when
its last free thread takes a job. A ``--processes`` child takes none (its group's listener picks
whom to wake), nor does a worker in mode ``"always"``; those hear only wake-ups naming nobody.
"""

import contextlib
import logging
import time

import psycopg

from .conf import get_settings
from .store import wakeups

logger = logging.getLogger("django_dbqueue")

START_TIMEOUT_MS = 20  # an enqueue holds WAITING for an instant: a longer wait means a stuck one
AWAIT_TIMEOUT_MS = 50  # how long a worker waits at once for an enqueue's open transaction
# (both in all: lock_timeout is per lock, so a worker of N queues gives each lock 1/N of it)
RETRY_BASE, RETRY_CAP = 0.05, 1.0  # seconds between tries while enqueuers keep it waiting
GIVEN_GRACE = 0.1  # seconds after a give in which a wake-up naming the given slot is still its
# (the sender looked before the give; its wake-up is delivered at its commit, within that)
SLOTS_RETRY = 5.0  # seconds before a worker tries its wake-up slots again after an error
STUCK_WARNING = 30.0  # seconds of failed tries before the worker says so at WARNING


def wanted(wake):
    """Whether a job sends a wake-up after its commit, from the ``wake`` its INSERT returned:
    ``None`` (not due yet: no), ``True`` (a worker waits: yes) or ``False`` (nobody waits: no,
    unless ``DBQUEUE["WAKEUP_IF_WAITING"]`` is False, which wakes for every due job)."""
    return wake is True or (wake is False and get_settings().WAKEUP_IF_WAITING is False)


def _lost(db):
    """Whether the error just raised on ``db`` (a Session or a psycopg connection) lost it."""
    conn = getattr(db, "conn", db)
    return conn is None or conn.closed


def _per_lock(total_ms, queues):
    return max(1, total_ms // max(1, len(queues)))


def start(db, queues):
    """Say on ``db`` that it waits for wake-ups on ``queues`` (``wakeups.START_WAITING``). Raises
    ``psycopg.errors.LockNotAvailable`` when a lock held elsewhere kept it past the timeout (the
    locks taken until then stay taken)."""
    wakeups.start_waiting(db, queues, timeout_ms=_per_lock(START_TIMEOUT_MS, queues))


def await_enqueuers(db, queues):
    """Wait for the enqueues on ``queues`` that found nobody waiting to end
    (``wakeups.AWAIT_ENQUEUERS``). Returns False when one's open transaction kept it past the
    timeout; raises what is not a lock timeout."""
    try:
        wakeups.await_enqueuers(db, queues, timeout_ms=_per_lock(AWAIT_TIMEOUT_MS, queues))
    except psycopg.errors.LockNotAvailable:
        return False
    return True


def hold(db, queues):
    """:func:`start`, then :func:`await_enqueuers`: True when both went through, False when a
    lock timeout stopped either (a lock taken twice is counted twice; ``wakeups.STOP_WAITING``
    drops every count)."""
    try:
        start(db, queues)
    except psycopg.errors.LockNotAvailable:
        return False
    return await_enqueuers(db, queues)


class Waiting:
    """A worker's side: whether its Session holds ``WAITING`` for its queues, and the claim that
    must follow. ``mode``: ``"dynamic"`` (waits while its last claim came back short),
    ``"always"`` (waits whenever it is connected: a worker that claims for free threads only,
    under a fleet-wide limit or with a prefetch below its threads, wants every wake-up), or
    ``None`` (it does not say: it does not listen, or its listener holds the locks). With
    ``slots`` (and mode ``"dynamic"``) it also holds a wake-up slot of each queue while it waits
    and has a free thread (:meth:`sync_slots`).

    The loop calls :meth:`before_claim` right before each claim and :meth:`after_claim` after
    it, and claims by :meth:`next_try` at the latest. The locks belong to one connection: when
    the Session's is another one (it was reset, after a fault of any kind), they are gone, and
    the worker says it again before its next claim.
    """

    def __init__(self, session, queues, mode, *, slots=True):
        self.session = session
        self.queues = sorted(set(queues))
        self.mode = mode if self.queues else None
        self.wanted = self.mode is not None  # start waiting before the first claim
        self.held_on = None  # the connection START_WAITING ran on (its locks, whole or in part)
        self.started = False  # ... and went through: WAITING is held for every queue
        self.settled = False  # ... and AWAIT_ENQUEUERS went through: the next claim misses nothing
        self.use_slots = slots  # (and mode "dynamic": see takes_slots)
        self.slots = None  # {queue: slot held on that connection, or None: all were taken}
        self._slots_retry_at = 0.0  # after a failed take or give: not before then
        self.given = None  # the slots it gave back for want of a free thread, until it takes some
        self.given_at = 0.0  # ... and when: a wake-up naming them counts as its for GIVEN_GRACE
        self.listened = {}  # {queue: slot} whose channels the connection LISTENs on
        self.listened_on = None  # ... that connection
        self.retry_at = 0.0
        self._failing_since = None

    def _current(self):
        """The state of the Session's connection: none of it once that connection is gone."""
        conn = self.session.conn
        if self.held_on is not None and (conn is not self.held_on or conn.closed):
            self._forget()
        return conn

    def _forget(self):
        """What the locks of the connection meant: none of it holds any more (they were let go,
        or went with the connection). ``listened`` stays: it says what that connection LISTENs
        on, and ``sync_slots`` knows a new connection by ``listened_on``."""
        self.held_on, self.started, self.settled = None, False, False
        self.slots, self.given = None, None

    def before_claim(self, now=None):
        """Start waiting if the worker should and does not yet, so that the claim about to run
        sees every job whose enqueue found nobody waiting. Costs nothing once settled."""
        self._current()
        if not self.wanted or self.settled:
            return
        now = time.monotonic() if now is None else now
        if now < self.retry_at:
            return
        try:
            if not self.started:
                self.held_on = self.session.connection()
                start(self.session, self.queues)
                self.started = True
            settled = await_enqueuers(self.session, self.queues)
        except psycopg.Error as exc:
            if _lost(self.session):
                raise
            self._failed(now, exc)  # a lock held elsewhere, PostgreSQL's lock table full...
            return
        if settled:
            self.settled = True
            self._failing_since = None
            return
        self._failed(now, "an enqueue's transaction stayed open past the lock timeout")

    def _failed(self, now, why):
        if self._failing_since is None:
            self._failing_since = now
        tries_for = now - self._failing_since
        self.retry_at = now + min(RETRY_CAP, max(RETRY_BASE, tries_for))
        stuck = tries_for >= STUCK_WARNING
        (logger.warning if stuck else logger.debug)(
            "dbqueue worker could not yet say that it waits for wake-ups (%s, for %.1fs); "
            "trying again in %.2fs, its poll finds the jobs meanwhile",
            why,
            tries_for,
            self.retry_at - now,
        )
        if stuck:
            self._failing_since = now  # say it again in STUCK_WARNING seconds, not every try

    def after_claim(self, *, full):
        """After a claim: ``full`` (it came back full, or the slots are full) means the worker
        claims again by itself, so it stops waiting; otherwise it waits, and :meth:`next_try`
        says when to claim again (at once, the first time: the claim just made may have missed
        the jobs of enqueues that found nobody waiting)."""
        if self.mode is None:
            return
        wanted = self.mode == "always" or not full
        if not wanted:
            self._stop()
        self.wanted = wanted

    def _stop(self):
        conn = self._current()
        if self.held_on is not None and conn is not None and not conn.closed:
            wakeups.stop_waiting(self.session)  # on the connection that holds them, never a new one
        self._forget()

    @property
    def takes_slots(self):
        """Whether this worker holds wake-up slots while it waits with a free thread: one that
        waits only while its claims come back short, and that no group listener wakes."""
        return self.use_slots and self.mode == "dynamic"

    def wants_sync(self, free_thread):
        """Whether :meth:`sync_slots` has something to do: take slots (it waits, with a free
        thread, and holds none) or give them back (its last free thread took a job)."""
        if not self.takes_slots or not self.started:
            return False
        if free_thread != (self.slots is not None):
            return self.slots is not None or time.monotonic() >= self._slots_retry_at
        return False

    def sync_slots(self, free_thread):
        """Hold the slots while it waits with a free thread, and only then (the loop, between
        its steps, on the Session's connection). Raises what a lost connection raised. Another
        error leaves it holding none: it acts on every wake-up, as before, and tries again in
        ``SLOTS_RETRY`` seconds."""
        self._current()
        if not self.wants_sync(free_thread):
            return
        channel = get_settings().NOTIFY_CHANNEL
        try:
            if free_thread:
                conn = self.session.connection()
                if conn is not self.listened_on:
                    self.listened, self.listened_on = {}, conn  # a new connection listens on none
                self.slots = wakeups.take_slots(
                    self.session, self.queues, channel=channel, listened=self.listened
                )
                self.listened = dict(self.slots)
                self.given = None
            else:
                wakeups.give_slots(self.session, self.slots, channel=channel)
                self.slots, self.given, self.given_at = None, self.slots, time.monotonic()
        except psycopg.Error as exc:
            if _lost(self.session):
                raise
            self._slots_retry_at = time.monotonic() + SLOTS_RETRY
            logger.warning(
                "dbqueue worker could not %s its wake-up slots (%s); it acts on every wake-up "
                "of its queues meanwhile, and tries again in %gs",
                "take" if free_thread else "give back",
                exc,
                SLOTS_RETRY,
            )
            # Which of them the failed statement took or gave is not known: let go of every
            # lock of the session; it says that it waits again before its next claim.
            with contextlib.suppress(psycopg.Error):
                self._stop()
            self.wanted = True

    def slot_of(self, queue):
        """The wake-up slot this worker holds of ``queue``, or None."""
        return None if self.slots is None else self.slots.get(queue)

    def acts_on(self, queue, named, *, free_thread):
        """What to do about a wake-up for ``queue`` naming the slots ``named`` (None: nobody):
        True, claim now; None, claim once a thread is free (it is this worker's, but every
        thread is busy); False, not this worker's. It is this worker's when it names nobody, or
        names this worker's slot of the queue (or the one it gave back last, had the sender
        looked before), or this worker holds no slot of it (it has not taken one yet, all were
        taken, or it takes none)."""
        if named is not None:
            self._current()
            slot = self.slot_of(queue)
            if slot is not None and slot not in named:
                return False
            if slot is None and not free_thread:
                # Named with the slot it has just given back (the sender looked before): its,
                # for later. Otherwise others, with a free thread, were named.
                given = None if self.given is None else self.given.get(queue)
                recent = time.monotonic() - self.given_at < GIVEN_GRACE
                return None if recent and given is not None and given in named else False
        return True if free_thread else None

    def next_try(self):
        """When the worker should claim next to start waiting (:meth:`before_claim` runs first),
        or None: it waits already, or should not."""
        self._current()
        if self.wanted and not self.settled:
            return self.retry_at
        return None

    def release(self):
        """Stop waiting for good (the worker stops claiming). Opens no connection, and a lost
        one is not raised: its locks went with it."""
        with contextlib.suppress(psycopg.Error):
            self._stop()
        self._forget()
        self.wanted = False

    def reset(self):
        """The connection was lost, and the locks with it."""
        self._forget()
