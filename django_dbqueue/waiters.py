"""Who waits for a wake-up: an enqueue sends one only when a worker waits for it.

A wake-up (wakeup.py) costs the enqueuing process a statement and the server a transaction. It
is worth that only to a worker that would claim when told: one whose last claim found its queue
empty and that now sleeps on LISTEN. A worker draining a backlog claims again by itself, and
nobody needs waking when no worker listens at all. So a worker says that it waits, and an
enqueue looks, in its own INSERT, whether anybody does. Under a backlog (every worker busy) the
enqueuers then pay nothing for wake-ups; with idle workers they pay what they paid before.

The saying and the looking are PostgreSQL advisory locks, because a lock is seen by every
session at once, where a row would only be seen by snapshots taken after its commit. Each queue
has two, keyed by the queue's ``hashtext()`` (computed by the server on both sides), of classes
``WAITING_LOCK`` and ``ENQUEUING_LOCK`` (the statements are in store/wakeups.py):

- A worker that waits holds ``WAITING`` shared, at session level (``START_WAITING``), and lets
  go of it when a claim comes back full (``STOP_WAITING``) or with its connection.
- An enqueue, in the RETURNING of its INSERT (``sql._wakeup_wanted``), tries ``WAITING``
  exclusively for an instant. When that fails, a worker waits (or is starting to), and the
  wake-up is sent after the commit, as before. When it succeeds, nobody waits: the enqueue takes
  ``ENQUEUING`` shared for its transaction and looks once more; no wake-up unless a worker
  started waiting in between.
- A worker that starts waiting would miss the job of an enqueue that found nobody and commits
  just after its claim. So, before that claim, it takes ``ENQUEUING`` exclusively for an instant
  (``AWAIT_ENQUEUERS``): that waits for every such enqueue that has not ended, and they are
  finite, since enqueues that look once the worker waits find it at their first step and never
  take ``ENQUEUING``. Its claim then sees their jobs. A ``lock_timeout`` of the statement's own
  bounds each try for an enqueue whose transaction stays open (50 ms in all); the worker, already
  waiting by then (new enqueues wake it), tries again a little later, and claims once it got
  through.

Enqueues never hold a lock against each other (shared, or exclusive for an instant), so a false
"somebody waits" is rare (two enqueues trying at the same instant, a worker that stopped waiting
after the look) and costs a wake-up, which every enqueue paid before; a false "nobody waits"
cannot happen. Queues whose names hash alike, and projects that share a database and a queue
name, only add wake-ups. A waiting worker holds one advisory lock per queue it serves.

Where a worker's own connection cannot hold a session lock (behind a transaction pooler, with
``LISTEN_DATABASE`` naming a direct connection), its listener holds the lock for as long as it
is connected: enqueues then always wake, as before. ``DBQUEUE["WAKEUP_IF_WAITING"] = False``
makes every enqueue of a due job wake, whoever waits (for a fleet still running workers of a
release that does not say that it waits).

**Slots: wake-ups that name their workers.** Every worker listening on the channel hears
every wake-up of its queue; claiming on each would cost a fleet of separate processes one claim
per worker per job, and waking each costs CPU. So a waiting worker that has a free thread also
holds a *slot* of each of its queues (``wakeups.TAKE_SLOTS``): the lowest free one of
``wakeups.WAKEUP_SLOTS`` session-level advisory locks, slot ``s`` keyed by
``hashtextextended('<channel>:<queue>', s)``, and its session LISTENs on that slot's own
channel (``dbqueue_slot_channel()``, migration 0014) besides the main one. It gives the slots
back when its last free thread takes a job (``wakeups.GIVE_SLOTS``; it keeps listening on their
channels until it takes other ones) and takes them again when a thread frees
(:meth:`Waiting.sync_slots`); ``STOP_WAITING`` drops them with the rest. The sender's statement
(``dbqueue_wake``) tries the slots from the lowest until sixteen free ones in a row (a slot is
free where it can take it shared, and it lets go at once: concurrent senders never take each
other's probes for held slots), picks held ones at random, one more than it
has jobs, and notifies their channels only, with the payload ``"<count>/<slot>.<slot>:<queue>"``
(``wakeups.NOTIFY_NAMED``). Where it found fewer held slots than that, it notifies the main
channel, naming nobody. Picking at random spreads the jobs over the idle workers, and two
senders at the same instant rarely name the same ones.

A worker acts on a wake-up (:meth:`Waiting.acts_on`) when it has a free thread and the
payload names it, or names nobody, or the worker holds no slot of the queue (it has not taken
one yet, or all were taken). A worker whose every thread is busy claims nothing for a wake-up:
a job claimed then would wait in its buffer while idle workers sleep. When the wake-up was for
it (naming nobody, or naming its slot, or the slot it gave back within ``GIVEN_GRACE``: the
sender looked just before), it claims once a thread frees instead (the worker's ``_missed``).

The one more (a spare) covers a named worker frozen with its connection open (SIGSTOP, a
debugger), one that lost its last free thread just after the sender looked, and the backends of
a host that died, which hold their slots until the server notices: ``dbqueue_take_slots``
shortens its session's TCP keepalives and ``tcp_user_timeout`` to a minute. When the spare fails
too, the poll finds the job. Slots stay near the bottom (a worker takes the lowest free one), so
the sender tries few of them. Only workers that wait while they have free threads take slots
(mode ``"dynamic"``, and not a ``--processes`` child, whose group listener picks the workers to
wake, by their free capacity, prefetch included, as before). Workers without a slot (one that
waits always, ``"always"``: a fleet-wide limit, a small prefetch; a 257th waiter; a listener
beside a pooler; a group's listener) hear only the wake-ups that name nobody. A wake-up sent in
a transaction the caller commits by hand names nobody (``wakeups.NOTIFY_AT_COMMIT``).
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
