"""Acknowledgements: outcomes of finished handlers, written back in batches.

Successes are buffered and flushed as one fenced statement every ``ACK_INTERVAL`` seconds or
``ACK_BATCH`` jobs, whichever comes first. A crash before a flush means those jobs run again,
which at-least-once delivery already allows. Failures go through the same thread so that both
survive a lost connection: a flush that fails is kept and retried, fenced, once the database is
back, so a connection blip does not make finished work run again.
"""

import logging
import threading
import time

from django.db import connections

from . import signals, store
from .connections import DB_ERRORS, reset_connection

logger = logging.getLogger("django_dbqueue")


class Acknowledger(threading.Thread):
    def __init__(
        self, using, *, interval, batch, worker_id, stop_event, on_db_error=None, session=None
    ):
        super().__init__(name="dbqueue-acks", daemon=True)
        self.using = using
        self.interval = interval
        self.batch = batch
        self.worker_id = worker_id
        self.stop_event = stop_event
        self.on_db_error = on_db_error or (lambda: None)
        # Completions go through the worker Session (prepared, asynchronous commit: a lost
        # completion only means the job runs again). Failures use the durable Django connection,
        # so an error history or a dead letter is never lost.
        self.session = session if session is not None else using
        self._cond = threading.Condition()
        self._done = []  # (ctx, result_json, duration)
        self._failed = []  # (ctx, error dict, delay, dead, duration)
        self._closing = False
        self.succeeded = 0
        self.failed = 0
        self.fenced = 0
        self.dead = 0

    # -- called by handler threads -------------------------------------------------------------
    def succeed(self, ctx, result_json=None, duration=None):
        """Buffer a success; ``result_json`` is the handler's return value, already encoded;
        ``duration`` (seconds of the run) goes to the ``job_succeeded`` signal."""
        with self._cond:
            self._done.append((ctx, result_json, duration))
            if len(self._done) == 1 or len(self._done) >= self.batch:
                self._cond.notify()

    def fail(self, ctx, error, *, delay, dead=False, duration=None):
        with self._cond:
            self._failed.append((ctx, error, delay, dead, duration))
            self._cond.notify()

    def committed(self, ctx, duration=None):
        """An atomic handler committed its own completion: count it and send the signal."""
        with self._cond:
            self.succeeded += 1
        self._signal(signals.job_succeeded, ctx, duration=duration)

    def _signal(self, signal, ctx, **extra):
        signals.send(
            signal,
            ctx.type,
            job_id=ctx.id,
            queue=ctx.queue,
            attempt=ctx.attempt,
            worker_id=self.worker_id,
            **extra,
        )

    def pending(self):
        with self._cond:
            return len(self._done) + len(self._failed)

    # -- the thread ----------------------------------------------------------------------------
    def run(self):
        while True:
            with self._cond:
                while not (self._done or self._failed or self._closing):
                    self._cond.wait()
                if self._done and not self._failed and not self._closing:
                    # Give a batch a moment to fill; a full batch or a failure cuts it short.
                    deadline = time.monotonic() + self.interval
                    while len(self._done) < self.batch and not self._failed and not self._closing:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._cond.wait(remaining)
                done, self._done = self._done, []
                failed, self._failed = self._failed, []
                closing = self._closing
            self._flush(done, failed)
            if closing and not self.pending():
                if not isinstance(self.session, str):
                    self.session.close()
                connections[self.using].close()
                return

    def close(self, timeout):
        """Flush what is buffered (retrying through connection loss until ``timeout``), stop."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self.join(timeout)
        return not self.is_alive()

    MAX_OTHER_ERRORS = 5  # a write that keeps failing for a reason other than the connection

    def _flush(self, done, failed):
        attempt = other = 0
        while done or failed:
            try:
                if done:
                    self._write_done(done)
                    done = []
                while failed:
                    self._write_failure(*failed[0])
                    failed.pop(0)
            except DB_ERRORS as exc:
                attempt += 1
                self.on_db_error()
                reset_connection(
                    self.using, self.session if not isinstance(self.session, str) else None
                )
                delay = min(5.0, 0.05 * 2**attempt)
                logger.warning(
                    "dbqueue could not write %d acknowledgements (%s); retrying in %.2fs",
                    len(done) + len(failed),
                    exc,
                    delay,
                )
                # Keep retrying while the worker runs; at shutdown the caller's timeout bounds it.
                time.sleep(delay)
            except Exception:
                # Not the connection: a constraint, a value the database refuses, a bug. Narrow
                # it down to the one write that fails and give up only that one, so it never holds
                # back the rest. A job given up here stays running until its lease expires; the
                # sweeper then records that and retries it.
                other += 1
                logger.exception(
                    "dbqueue could not write %d acknowledgements (attempt %d)",
                    len(done) + len(failed),
                    other,
                )
                reset_connection(
                    self.using, self.session if not isinstance(self.session, str) else None
                )
                if len(done) > 1:
                    done = self._write_done_singly(done)
                    continue
                if other >= self.MAX_OTHER_ERRORS:
                    given_up = done[0][0] if done else failed[0][0]
                    logger.error(
                        "dbqueue gave up acknowledging job=%s type=%s attempt=%s; the sweeper "
                        "will take it back when its lease expires",
                        given_up.id,
                        given_up.type,
                        given_up.attempt,
                    )
                    if done:
                        done = []
                    else:
                        failed.pop(0)
                    other = 0
                    continue
                time.sleep(0.1 * other)

    def _write_done_singly(self, done):
        """Write each completion alone; returns those that failed for the connection's sake
        (to retry). Those refused by the database itself are logged and left to the sweeper."""
        retry = []
        for item in done:
            try:
                self._write_done([item])
            except DB_ERRORS:
                retry.append(item)
            except Exception:
                logger.exception(
                    "dbqueue could not acknowledge job=%s type=%s attempt=%s; the sweeper will "
                    "take it back when its lease expires",
                    item[0].id,
                    item[0].type,
                    item[0].attempt,
                )
        return retry

    def _write_done(self, done):
        # In id order, like the heartbeat, so the two never lock the same rows in opposite orders.
        acks = sorted((c.id, c.attempt, r) for c, r, _ in done)
        matched = store.complete(self.session, acks, worker=self.worker_id)
        self.succeeded += len(matched)
        for ctx, _, duration in done:
            if ctx.id not in matched:
                self.fenced += 1
                logger.warning(
                    "dbqueue fenced job=%s type=%s attempt=%s: completion discarded, the lease "
                    "was lost and the job belongs to another attempt",
                    ctx.id,
                    ctx.type,
                    ctx.attempt,
                )
            else:
                self._signal(signals.job_succeeded, ctx, duration=duration)
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "dbqueue succeeded job=%s type=%s attempt=%s", ctx.id, ctx.type, ctx.attempt
                )

    def _write_failure(self, ctx, error, delay, dead, duration=None):
        state = store.fail(
            self.using,
            worker=self.worker_id,
            job_id=ctx.id,
            attempt=ctx.attempt,
            error=error,
            delay=delay,
            dead=dead,
        )
        if state is None:
            self.fenced += 1
            logger.warning(
                "dbqueue fenced job=%s type=%s attempt=%s: failure discarded, the lease was lost",
                ctx.id,
                ctx.type,
                ctx.attempt,
            )
        elif state == "dead":
            self.dead += 1
            logger.error(
                "dbqueue dead job=%s type=%s attempt=%s/%s: %s: %s",
                ctx.id,
                ctx.type,
                ctx.attempt,
                ctx.max_attempts,
                error["class"],
                error["message"],
            )
            self._signal(signals.job_dead, ctx, error=error, duration=duration)
        else:
            self.failed += 1
            logger.warning(
                "dbqueue retried job=%s type=%s attempt=%s/%s in %.1fs: %s: %s",
                ctx.id,
                ctx.type,
                ctx.attempt,
                ctx.max_attempts,
                delay,
                error["class"],
                error["message"],
            )
            self._signal(signals.job_failed, ctx, error=error, retry_in=delay, duration=duration)
