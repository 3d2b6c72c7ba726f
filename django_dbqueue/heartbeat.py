"""The heartbeat: extends the leases of the jobs a worker holds, and gives up runs that passed
their type's timeout. One thread per worker, on its own Session."""

import logging
import threading
import time

from django.db import connections

from . import registry, store
from .connections import DB_ERRORS, OTHER_DB_ERRORS, Session
from .outcomes import error_record

logger = logging.getLogger("django_dbqueue")


class Heartbeat(threading.Thread):
    """Every ``HEARTBEAT_INTERVAL`` seconds, one fenced statement renews every lease the worker
    still holds; a job missing from its answer was taken back by the sweeper and is marked lost,
    so its outcome is discarded. Timeouts are checked every second."""

    def __init__(self, worker):
        super().__init__(name="dbqueue-heartbeat", daemon=True)
        self.worker = worker

    def run(self):
        worker = self.worker
        interval = worker.conf.HEARTBEAT_INTERVAL
        next_beat = time.monotonic() + interval
        failures = 0
        session = Session(
            worker.using, prepare=worker.conf.PREPARE, async_commit=worker.conf.ASYNC_COMMIT
        )
        try:
            while not worker.stopped.wait(min(1.0, interval)):
                self.check_timeouts()
                if time.monotonic() < next_beat:
                    continue
                with worker._lock:
                    held = [e for e in worker._inflight.values() if not (e.timed_out or e.lost)]
                try:
                    pairs = sorted((e.ctx.id, e.ctx.attempt) for e in held)
                    kept = store.extend_leases(session, pairs, worker=worker.worker_id)
                    failures = 0
                except DB_ERRORS as exc:
                    failures += 1
                    worker.note_db_error()
                    session.reset()
                    logger.warning("dbqueue heartbeat failed (%s); retrying", exc)
                    next_beat = time.monotonic() + min(interval, 0.5 * failures)
                    continue
                except OTHER_DB_ERRORS:
                    failures += 1
                    session.reset()
                    logger.exception("dbqueue heartbeat failed; retrying")
                    next_beat = time.monotonic() + min(interval, 0.5 * failures)
                    continue
                for entry in held:
                    if entry.ctx.id not in kept:
                        entry.lost = True
                        logger.warning(
                            "dbqueue lease lost job=%s type=%s attempt=%s: the sweeper took it "
                            "back; this run's outcome will be discarded",
                            entry.ctx.id,
                            entry.ctx.type,
                            entry.ctx.attempt,
                        )
                next_beat = time.monotonic() + interval
        finally:
            session.close()
            connections.close_all()

    def check_timeouts(self):
        """Give up runs past their type's timeout: stop renewing them and record the failure."""
        worker = self.worker
        now = time.monotonic()
        with worker._lock:
            expired = [
                e
                for e in worker._inflight.values()
                if e.timeout
                and e.started is not None
                and not e.timed_out
                and now - e.started > e.timeout
            ]
            for entry in expired:
                entry.timed_out = True
        for entry in expired:
            ctx = entry.ctx
            exc = TimeoutError(
                f"job ran longer than its timeout of {entry.timeout:g}s; given up and retried"
            )
            record = error_record(exc, attempt=ctx.attempt, worker_id=worker.worker_id)
            record["traceback"] = ""
            worker.acks.fail(
                ctx,
                record,
                delay=worker._retry_delay(registry.get(ctx.type), ctx.attempt),
                duration=now - entry.started,  # observability: how long it ran before the timeout
            )
            logger.warning(
                "dbqueue timeout job=%s type=%s attempt=%s after %gs",
                ctx.id,
                ctx.type,
                ctx.attempt,
                entry.timeout,
            )
