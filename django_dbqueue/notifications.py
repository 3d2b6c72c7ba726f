"""The receiving side of wake-ups (docs/wakeups.md): LISTEN, the payloads, and a ``--processes``
group's waker; also the cancel notifications that tell a worker to stop a running job.

A worker listens on its own session; a :class:`Listener` thread with a connection of its own
listens where the LISTEN must go elsewhere (``LISTEN_DATABASE`` beside a transaction pooler) and
for a whole group (the supervisor). A notification is only a hint: the poll and the heartbeat
make up for any that is lost, so the listener need only be quick and self-healing.

Payloads: ``"<count>:<queue>"``; ``"<count>/<slot>.<slot>:<queue>"`` naming the workers that are
to claim (waiters.py); a bare queue name (from SQL: workflow releases); and
``"cancel:<id>,<id>,..."``. A worker of an older release reads what it does not know as a queue
it does not serve, so a fleet can be upgraded one worker at a time.
"""

import contextlib
import logging
import os
import random
import select
import selectors
import threading
import time

import psycopg

from .cancel_notices import cancel_payloads, parse_cancel
from .connections import connect, connection_params

logger = logging.getLogger("django_dbqueue.notifications")


MAX_DIGITS = 18  # a count or a slot longer than this is no real one (and int() refuses a str
#                  of more than 4300 digits: a NOTIFY payload holds 8000 bytes)


def _number(text):
    # isdigit() alone takes "²", which int() refuses; the length bounds what int() is given.
    return 0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit()


def _parts(payload):
    """``(queue, count, named)`` of a wake-up's payload, or None for a bare queue name (and for
    anything malformed: a payload is a hint that anyone who can connect may send, and reading it
    never raises)."""
    if not isinstance(payload, str):
        return None
    head, sep, queue = payload.partition(":")
    if not sep:
        return None
    count, slash, named = head.partition("/")
    if not _number(count):
        return None
    if not slash:
        return queue, int(count), None
    slots = named.split(".")
    if not all(_number(slot) for slot in slots):
        return None
    return queue, int(count), frozenset(int(slot) for slot in slots)


def parse_wakeup(payload):
    """``(queue, count)`` from a notification's payload ``"<count>:<queue>"`` or, naming the
    workers that are to claim, ``"<count>/<slot>.<slot>:<queue>"`` (wakeup.py, waiters.py).

    The count is how many jobs became ready on that queue, so a group of workers can wake as many
    of them as there are jobs. A payload whose head before the first ``:`` is neither is an
    older sender's bare queue name, counted as one job.
    """
    parts = _parts(payload)
    return (payload, 1) if parts is None else parts[:2]


def parse_named(payload):
    """The wake-up slots a payload names (a frozenset of ints), or None: it names nobody, and
    every worker waiting on its queue acts on it."""
    parts = _parts(payload)
    return None if parts is None else parts[2]


class Wakeup:
    """The claim loop's wake-up flag: ``threading.Event``'s ``set``/``clear``/``is_set``/``wait``,
    plus :meth:`wait_on`, which also returns when a socket (the session's LISTEN connection)
    becomes readable. The flag is a plain attribute and ``set()`` writes a byte into a pipe that
    the waits poll; nothing here takes a lock, because ``set()`` is also called from the worker's
    signal handler (``stop()``), on the loop's own thread, which may be inside ``clear()`` or a
    wait at that moment (a lock there, or ``threading.Event``'s, could then wait for itself).

    A ``set()`` racing a ``clear()`` may leave a byte in the pipe with the flag down: the next
    wait returns at once, once, and the loop looks again. :meth:`close` only marks the flag
    closed (waits then return at once); both ends stay open until the object is collected, so
    that a late ``set()`` from another thread never writes into a descriptor number the system
    has handed to another file, nor into a pipe without a reader (SIGPIPE).
    """

    def __init__(self):
        self._flag = False
        self._closed = False
        self._read, self._write = os.pipe()  # not inherited by exec'd children (PEP 446)
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def set(self):
        if self._flag:
            return
        self._flag = True
        with contextlib.suppress(OSError):  # full, or closed: a wake-up is pending or moot
            os.write(self._write, b"\0")

    def clear(self):
        self._flag = False
        with contextlib.suppress(OSError):  # empty (BlockingIOError), or closed
            while os.read(self._read, 4096):
                pass

    def is_set(self):
        return self._flag

    def wait(self, timeout=None):
        """Sleep until the flag is set or ``timeout`` seconds passed; returns the flag."""
        if not self._flag:
            self._poll((), timeout)
        return self._flag

    def wait_on(self, fileno, timeout):
        """Sleep until the flag is set, ``fileno`` is readable or ``timeout`` seconds passed;
        True when ``fileno`` is readable."""
        if self._flag:
            return False
        return fileno in self._poll((fileno,), timeout)

    def _poll(self, filenos, timeout):
        if self._closed:  # the loop is over
            return set()
        poller = select.poll()
        poller.register(self._read, select.POLLIN)
        for fileno in filenos:
            poller.register(fileno, select.POLLIN)
        ms = None if timeout is None else max(0.0, timeout) * 1000.0
        return {fd for fd, _ in poller.poll(ms)}

    def close(self):
        self._closed = True

    def __del__(self):
        for name in ("_read", "_write"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


class Listener(threading.Thread):
    """A daemon thread that LISTENs on ``channel`` and calls ``on_notify(payload)``.

    After every (re)connection it calls ``on_notify(None)``: notifications sent while it was
    away are lost, so the worker should look for work at once. Reconnects with capped, jittered
    backoff; stops when ``stop_event`` is set.

    With ``wait_queues`` it also says, on its connection, that its workers wait for wake-ups on
    those queues (waiters.py), for as long as it is connected, before that ``on_notify(None)``:
    where the workers' own connections go through a pooler and cannot hold the lock.
    """

    IDLE_CHECK = 30.0  # seconds of silence after which the connection is probed

    def __init__(
        self,
        using,
        channel,
        on_notify,
        stop_event,
        *,
        max_backoff=5.0,
        on_crash=None,
        wait_queues=None,
    ):
        super().__init__(name="dbqueue-listener", daemon=True)
        self.using = using
        self.channel = channel
        self.wait_queues = list(wait_queues or ())
        self.on_notify = on_notify
        self.stop_event = stop_event
        self.max_backoff = max_backoff
        self.on_crash = on_crash
        self.connected = threading.Event()
        self.reconnects = 0

    def run(self):
        try:
            self._run()
        except BaseException as exc:
            # Not a connection fault (those are retried below): a bug. Without the listener
            # the worker would only poll, silently; stop it instead, so it is restarted.
            logger.exception("dbqueue listener crashed")
            if self.on_crash is not None:
                self.on_crash(f"the listener thread crashed: {exc!r}")

    def _run(self):
        failures = 0
        while not self.stop_event.is_set():
            try:
                with connect(self.using, **self._names()) as conn:
                    # Notifications that arrive while a statement of ours runs (the waiting
                    # statements, the idle probe) come through psycopg, not libpq's queue.
                    conn.add_notify_handler(lambda notify: self.on_notify(notify.payload))
                    conn.execute(
                        psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(self.channel))
                    )
                    if self.wait_queues:
                        self._start_waiting(conn)
                    failures = 0
                    self.connected.set()
                    self.on_notify(None)
                    self._listen(conn)
            except (psycopg.Error, OSError) as exc:
                self.connected.clear()
                if self.stop_event.is_set():
                    break
                failures += 1
                self.reconnects += 1
                delay = min(self.max_backoff, 0.05 * 2**failures) * (0.5 + random.random() / 2)
                logger.warning(
                    "dbqueue listener lost its connection (%s); reconnecting in %.2fs", exc, delay
                )
                self.stop_event.wait(delay)
        self.connected.clear()

    APPLICATION_NAME = "dbqueue listener"  # unless the database's OPTIONS name one

    def _names(self):
        """Its ``application_name`` in pg_stat_activity: ``dbqueue listener (LISTEN <channel>)``,
        unless the database's OPTIONS name one."""
        if "application_name" in connection_params(self.using):
            return {}
        return {"application_name": f"{self.APPLICATION_NAME} (LISTEN {self.channel})"}

    def _start_waiting(self, conn):
        """Say on ``conn`` that the workers wait for wake-ups on ``wait_queues``
        (waiters.start), trying until it goes through or the thread stops. Its second step,
        waiting for the enqueues that found nobody, runs in :meth:`_listen`, so that the
        notifications it is told of meanwhile are delivered."""
        from . import waiters

        delay = waiters.RETRY_BASE
        while not self.stop_event.is_set():
            try:
                waiters.start(conn, self.wait_queues)
                return
            except psycopg.errors.LockNotAvailable:
                self.stop_event.wait(delay)
                delay = min(waiters.RETRY_CAP, delay * 2)

    def _listen(self, conn):
        from . import waiters

        pgconn = conn.pgconn
        settled = not self.wait_queues  # the enqueues that found nobody waiting have ended
        retry_at, delay = 0.0, waiters.RETRY_BASE
        with selectors.DefaultSelector() as selector:
            selector.register(conn.fileno(), selectors.EVENT_READ)
            last_traffic = time.monotonic()
            while not self.stop_event.is_set():
                if not settled and time.monotonic() >= retry_at:
                    if waiters.await_enqueuers(conn, self.wait_queues):
                        settled = True
                        self.on_notify(None)  # their jobs are committed: claim them now
                    else:
                        retry_at = time.monotonic() + delay
                        delay = min(waiters.RETRY_CAP, delay * 2)
                    last_traffic = time.monotonic()
                timeout = 0.5 if settled else max(0.0, min(0.5, retry_at - time.monotonic()))
                if selector.select(timeout=timeout):
                    pgconn.consume_input()  # raises OperationalError when the server is gone
                    last_traffic = time.monotonic()
                    while (notify := pgconn.notifies()) is not None:
                        self.on_notify(notify.extra.decode("utf-8", "replace"))
                elif time.monotonic() - last_traffic > self.IDLE_CHECK:
                    conn.execute("SELECT 1")  # a dead peer shows up here as an error
                    last_traffic = time.monotonic()


# The pipe from a group's listener to one of its workers carries a wake-up as one byte (WAKE) and
# a cancel notification as its payload framed by CANCEL_START and CANCEL_END, in one write
# shorter than PIPE_BUF, so that writes never interleave.
WAKE = b"\x01"
CANCEL_START = b"\x02"
CANCEL_END = b"\x03"


def read_pipe_messages(buffer):
    """Split what a pipe delivered: returns ``(woken, [cancel payloads], rest)``; ``rest`` is an
    unfinished message, to be read again with the next bytes."""
    woken, payloads = False, []
    while buffer:
        if buffer[:1] == CANCEL_START:
            end = buffer.find(CANCEL_END)
            if end < 0:
                break  # the rest of it comes with the next read
            payloads.append(buffer[1:end].decode("ascii", "replace"))
            buffer = buffer[end + 1 :]
        else:
            woken = woken or buffer[:1] == WAKE
            buffer = buffer[1:]
    return woken, payloads, buffer


class PipeWaker:
    """A supervised worker's wake-up source: the supervisor's listener writes a byte into this
    process's pipe when the worker should claim, or a cancel notification's payload. Same
    contract as a Listener's thread."""

    def __init__(self, fd):
        self.fd = fd
        self.thread = None

    def start(self, on_notify, stop_event, *, on_crash=None):
        def run():
            try:
                pending = b""
                with selectors.DefaultSelector() as selector:
                    selector.register(self.fd, selectors.EVENT_READ)
                    while not stop_event.is_set():
                        if selector.select(timeout=0.5):
                            data = os.read(self.fd, 4096)
                            if not data:
                                return  # the supervisor is gone; its parent check stops us
                            woken, payloads, pending = read_pipe_messages(pending + data)
                            for payload in payloads:
                                on_notify(payload)
                            if woken:
                                on_notify(None)
            except BaseException as exc:
                logger.exception("dbqueue wake-up pipe reader crashed")
                if on_crash is not None:
                    on_crash(f"the wake-up pipe reader crashed: {exc!r}")

        self.thread = threading.Thread(target=run, name="dbqueue-waker", daemon=True)
        self.thread.start()

    def join(self, timeout):
        if self.thread is not None:
            self.thread.join(timeout)


class GroupWaker:
    """The listener of a ``--processes`` group: one LISTEN connection for all its workers.

    Each worker reports its free slots in a shared array; a notification for ``count`` jobs
    wakes idle workers, the freest first and in turn, until their free slots cover the count,
    instead of every worker in the group. A (re)connection wakes them all, since notifications
    sent meanwhile were lost.
    """

    def __init__(self, pipes, free_slots, queues):
        self.pipes = pipes  # slot -> write fd
        self.free_slots = free_slots  # multiprocessing Array: slot -> free slots, -1 = busy
        self.queues = set(queues)
        self._turn = 0
        self.woken = 0

    def on_notify(self, payload):
        if payload is None:
            self._wake(list(self.pipes))
            return
        if (ids := parse_cancel(payload)) is not None:
            # Which worker holds the job is not known here: every worker of the group hears
            # it, and those that do not hold the job ignore it (a dict lookup each); one that
            # does asks the database whether the cancel was asked for (Worker._on_notify).
            # Forwarded re-written from the ids read, in payloads of CANCEL_CHUNK ids: each
            # shorter than PIPE_BUF, so written whole or not at all, whatever was sent.
            for message in cancel_payloads(ids):
                self._wake(list(self.pipes), CANCEL_START + message.encode() + CANCEL_END)
            return
        queue, count = parse_wakeup(payload)
        if queue not in self.queues:
            return
        slots = sorted(self.pipes)
        # Rotate the starting point so that equal candidates share the work.
        self._turn = (self._turn + 1) % max(1, len(slots))
        slots = slots[self._turn :] + slots[: self._turn]
        free = {slot: self.free_slots[slot] for slot in slots}
        chosen, covered = [], 0
        for slot in sorted(slots, key=lambda s: -free[s]):
            if covered >= count or free[slot] <= 0:
                break
            chosen.append(slot)
            covered += free[slot]
        self._wake(chosen)

    def _wake(self, slots, message=WAKE):
        for slot in slots:
            try:
                os.write(self.pipes[slot], message)
                self.woken += 1
            except BlockingIOError:
                # Its pipe is full: it has wake-ups waiting already; a cancel lost here is
                # learned from the worker's next heartbeat.
                pass
            except OSError:
                pass
