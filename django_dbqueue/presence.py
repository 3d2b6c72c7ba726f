"""The worker registry: every running worker process keeps a row saying who it is, refreshed at
its heartbeat, so that the admin, ``jobqueue_status`` and the metrics can list the live workers.

A worker writes its own row only, on its own connection (``Worker.session``: no extra
connection, no session state, so PgBouncer in transaction mode is fine): at start, then once per
``HEARTBEAT_INTERVAL`` (``announce_once``, one small UPSERT, never on the claim's or the
completion's round trip), and it deletes it at a clean stop (``withdraw``), except when it gave
up and restarts in place: then it shows ``restarting`` until its new image, under the same id,
refreshes the row (``restarting``). A worker that stops
beating (``kill -9``, a lost host, a hung loop) is shown *stale* once ``stale_after`` seconds
passed since its last heartbeat, is hidden from every listing after ``expire_after`` seconds, and
its row is deleted by the next sweep of any worker (``FORGET_EXPIRED_WORKERS``,
store/workers.py).

Both deadlines are counted in heartbeats, with a floor so that a loaded host's pause of a second
or two never hides a live worker: stale after ``max(2 x HEARTBEAT_INTERVAL, 5 s)``, gone after
``max(3 x HEARTBEAT_INTERVAL, 10 s)`` (20 s and 30 s at the defaults).
"""

import logging
import os
import socket
from dataclasses import dataclass
from datetime import datetime

from . import store
from .conf import get_settings

logger = logging.getLogger("django_dbqueue")

STALE_BEATS, STALE_FLOOR = 2, 5.0  # missed heartbeats, seconds
EXPIRE_BEATS, EXPIRE_FLOOR = 3, 10.0


def stale_after(heartbeat_interval):
    """Seconds without a heartbeat after which a worker is shown stale."""
    return max(STALE_FLOOR, STALE_BEATS * heartbeat_interval)


def expire_after(heartbeat_interval):
    """Seconds without a heartbeat after which a worker is gone from the registry."""
    return max(EXPIRE_FLOOR, EXPIRE_BEATS * heartbeat_interval)


def package_version():
    from . import __version__

    return __version__


class Presence:
    """One worker's row in the registry."""

    def __init__(self, worker):
        self.worker = worker
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.announced = 0  # statements run, for the tests

    def announce_once(self, db):
        """Insert or refresh this worker's row: one statement."""
        w = self.worker
        self._write(
            db,
            state="stopping" if w.stopping.is_set() else "running",
            within=0.0,
            async_commit=w.async_commit,
        )
        self.announced += 1

    def _write(self, db, *, state, within, async_commit):
        w = self.worker
        interval = w.conf.HEARTBEAT_INTERVAL
        store.announce_worker(
            db,
            worker=w.worker_id,
            host=self.host,
            pid=self.pid,
            version=package_version(),
            queues=w.queues,
            concurrency=w.concurrency,
            execution=w.execution,
            group_pid=w.parent_pid,
            state=state,
            stale=within + stale_after(interval),
            expire=within + expire_after(interval),
            running=len(w.inflight),
            async_commit=async_commit,
        )

    def restarting(self, db, within):
        """A worker that gives up and restarts in place (restart.py) keeps its row instead of
        deleting it: shown ``restarting``, stale only ``within`` seconds (the restart's wait
        and the new image's start-up) plus the usual margin from now. The sweeper takes back
        the expired leases of a worker whose row is stale or gone (store RESCUE_EXPIRED): the
        jobs the old image hands to the new one stay theirs until the new image, under the same
        worker id, writes their ends and announces itself. Should the new image never come,
        the row goes stale then and the sweeper takes them back as after a crash. A failure is
        logged: the row then goes stale at its last heartbeat's deadline."""
        w = self.worker
        interval = w.conf.HEARTBEAT_INTERVAL
        try:
            self._write(db, state="restarting", within=within, async_commit=False)
        except Exception as exc:  # the image is being replaced: nothing else to do about it
            logger.warning(
                "dbqueue worker %s could not say in the worker registry that it restarts (%s); "
                "its row goes stale %gs after its last heartbeat",
                w.worker_id,
                exc,
                stale_after(interval),
            )

    def withdraw(self, db):
        """Delete this worker's row (a clean stop). A failure is logged: the row then expires."""
        w = self.worker
        try:
            store.withdraw_worker(db, w.worker_id)
        except Exception as exc:  # the worker is exiting: nothing else to do about it
            logger.warning(
                "dbqueue worker %s could not leave the worker registry (%s); its row expires "
                "%gs after its last heartbeat",
                w.worker_id,
                exc,
                expire_after(w.conf.HEARTBEAT_INTERVAL),
            )


@dataclass(frozen=True)
class LiveWorker:
    """A worker as the registry shows it (``live_workers``)."""

    worker_id: str
    host: str
    pid: int
    version: str
    queues: list
    concurrency: int
    execution: str
    group_pid: int | None
    state: str  # "running", "stopping" or "restarting"
    started_at: datetime
    heartbeat_at: datetime
    stale: bool  # missed its heartbeats: killed, hung or cut off; gone soon
    heartbeat_age: float  # seconds since its last heartbeat
    running: int  # jobs the job table says it runs now

    @property
    def status(self):
        return "stale" if self.stale else self.state

    def as_json(self):
        return {
            "worker_id": self.worker_id,
            "host": self.host,
            "pid": self.pid,
            "version": self.version,
            "queues": list(self.queues),
            "concurrency": self.concurrency,
            "execution": self.execution,
            "group_pid": self.group_pid,
            "status": self.status,
            "started_at": self.started_at.isoformat(),
            "heartbeat_at": self.heartbeat_at.isoformat(),
            "heartbeat_age_seconds": round(self.heartbeat_age, 3),
            "running": self.running,
        }


def live_workers(using=None, *, limit=1000):
    """The workers in the registry (not expired), by host and start time."""
    using = using or get_settings().DATABASE
    return [
        LiveWorker(*row[:13], running=row[14]) for row in store.live_workers(using, limit=limit)
    ]
