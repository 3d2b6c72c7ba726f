"""LISTEN on a dedicated connection; wakes the claim loop when a job is enqueued.

The notification is only a hint: the worker's poll guarantees progress when one is missed (the
listener reconnecting, PgBouncer in transaction mode, ``DBQUEUE["LISTEN"] = False``). So the
listener never needs to be exact, only quick and self-healing.
"""

import logging
import random
import selectors
import threading
import time

import psycopg

from .connections import connect

logger = logging.getLogger("django_dbqueue.notifications")


def parse_wakeup(payload):
    """``(queue, count)`` from a notification's payload ``"<count>:<queue>"`` (wakeup.py).

    The count is how many jobs became ready on that queue, so a group of workers can wake as many
    of them as there are jobs. A payload whose head before the first ``:`` is not a number is an
    older sender's bare queue name, counted as one job.
    """
    head, sep, queue = payload.partition(":")
    if sep and head.isascii() and head.isdigit():  # isdigit() alone takes "²", which int() refuses
        return queue, int(head)
    return payload, 1


class Listener(threading.Thread):
    """A daemon thread that LISTENs on ``channel`` and calls ``on_notify(payload)``.

    After every (re)connection it calls ``on_notify(None)``: notifications sent while it was
    away are lost, so the worker should look for work at once. Reconnects with capped, jittered
    backoff; stops when ``stop_event`` is set.
    """

    IDLE_CHECK = 30.0  # seconds of silence after which the connection is probed

    def __init__(self, using, channel, on_notify, stop_event, *, max_backoff=5.0):
        super().__init__(name="dbqueue-listener", daemon=True)
        self.using = using
        self.channel = channel
        self.on_notify = on_notify
        self.stop_event = stop_event
        self.max_backoff = max_backoff
        self.connected = threading.Event()
        self.reconnects = 0

    def run(self):
        failures = 0
        while not self.stop_event.is_set():
            try:
                with connect(self.using) as conn:
                    conn.execute(
                        psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(self.channel))
                    )
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

    def _listen(self, conn):
        pgconn = conn.pgconn
        with selectors.DefaultSelector() as selector:
            selector.register(conn.fileno(), selectors.EVENT_READ)
            last_traffic = time.monotonic()
            while not self.stop_event.is_set():
                if selector.select(timeout=0.5):
                    pgconn.consume_input()  # raises OperationalError when the server is gone
                    last_traffic = time.monotonic()
                    while (notify := pgconn.notifies()) is not None:
                        self.on_notify(notify.extra.decode())
                elif time.monotonic() - last_traffic > self.IDLE_CHECK:
                    conn.execute("SELECT 1")  # a dead peer shows up here as an error
                    last_traffic = time.monotonic()
