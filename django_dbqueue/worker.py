"""The worker: claim loop, handler threads, heartbeats and graceful shutdown. No SQL text here.

One ``Worker`` is one process's worth of work: a claim loop on the calling thread, ``concurrency``
handler threads (each with its own database connection), an acknowledgement thread that writes
outcomes back in batches, a heartbeat thread that extends leases, and a listener thread that
turns NOTIFY into an immediate claim. ``run_once()`` does one claim; ``run()`` loops until
stopped, SIGTERM, ``burst`` drained or ``max_jobs`` reached.
"""

import asyncio
import logging
import os
import queue as queue_module
import secrets
import signal
import socket
import threading
import time
from dataclasses import dataclass, field

from django.db import connections, transaction

from . import registry, store
from .acks import Acknowledger
from .conf import get_settings
from .connections import (
    DB_ERRORS,
    OTHER_DB_ERRORS,
    Session,
    close_side_connections,
    discard_connection,
    reset_connection,
)
from .context import JobContext
from .exceptions import DiscardJob, RetryJob
from .heartbeat import Heartbeat
from .notifications import Listener, parse_wakeup
from .outcomes import clamp_delay, encode_result, error_record
from .scheduler import Scheduler
from .sweeper import Sweeper

logger = logging.getLogger("django_dbqueue")


def make_worker_id():
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class _FencedOut(Exception):
    """An atomic handler's completion matched no row: roll its writes back."""


@dataclass(eq=False)
class _Inflight:
    ctx: JobContext
    timeout: float | None
    started: float | None = None
    timed_out: bool = False
    lost: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class Worker:
    """Runs jobs from ``queues`` (default: every queue in ``DBQUEUE["QUEUES"]``)."""

    def __init__(
        self,
        *,
        queues=None,
        concurrency=None,
        poll_interval=None,
        burst=False,
        max_jobs=None,
        using=None,
        worker_id=None,
        listen=None,
        out=None,
        parent_pid=None,
    ):
        conf = get_settings()
        self.conf = conf
        self.using = using or conf.DATABASE
        self.queues = list(queues or conf.QUEUES)
        self.concurrency = concurrency or conf.CONCURRENCY
        # Jobs claimed ahead of free threads. Fixed when PREFETCH is set; otherwise adaptive:
        # it starts at the concurrency, doubles (up to 4x) while a deep backlog keeps the
        # threads waiting on the next claim, and falls back as soon as a claim comes back short,
        # so slow jobs are never hoarded while other workers sit idle.
        self.adaptive_prefetch = conf.PREFETCH is None
        self.prefetch = self.concurrency if conf.PREFETCH is None else conf.PREFETCH
        self.prefetch_max = 4 * self.concurrency if conf.PREFETCH is None else conf.PREFETCH
        self._starved = 0  # times a handler thread found no job waiting
        self.poll_interval = conf.POLL_INTERVAL if poll_interval is None else poll_interval
        self.burst = burst
        self.max_jobs = max_jobs
        self.listen = conf.LISTEN if listen is None else listen
        self.worker_id = worker_id or make_worker_id()
        self.parent_pid = parent_pid  # under a supervisor: stop if it dies
        self.out = out or logger.info
        self.queue_caps = [
            (conf.QUEUES.get(name) or {}).get("concurrency") or self.concurrency + self.prefetch_max
            for name in self.queues
        ]
        self.stopping = threading.Event()  # no more claims
        self.stopped = threading.Event()  # threads may exit
        self._wakeup = threading.Event()
        self._want_capacity = False
        self._lock = threading.Lock()
        # Keyed by (id, attempt): a job given up here (timeout, lost lease) can be claimed again
        # by this same worker while the old attempt's thread is still running.
        self._inflight: dict[tuple[int, int], _Inflight] = {}
        self._work: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._signals = 0
        self._releasing = False  # set on a stop: unstarted jobs go back instead of running
        # Bumped whenever a worker thread hits a lost connection: handler threads then check
        # their own connection before the next job, instead of failing one job on it each.
        self.db_error_epoch = 0
        self.claimed_total = 0
        # The claim loop's own connection: prepared statements, asynchronous commit (connections.Session).
        self.session = Session(self.using, prepare=conf.PREPARE, async_commit=conf.ASYNC_COMMIT)
        self.sweeper = Sweeper(self.using, conf=conf)
        self.scheduler = Scheduler(self.using, conf=conf)
        self.acks = Acknowledger(
            self.using,
            interval=conf.ACK_INTERVAL,
            batch=conf.ACK_BATCH,
            worker_id=self.worker_id,
            stop_event=self.stopped,
            on_db_error=self.note_db_error,
            session=Session(
                using or conf.DATABASE, prepare=conf.PREPARE, async_commit=conf.ASYNC_COMMIT
            ),
        )
        self.listener = None

    # ---------------------------------------------------------------------------------------
    # The claim
    # ---------------------------------------------------------------------------------------
    def free_slots(self):
        with self._lock:
            return self.concurrency + self.prefetch - len(self._inflight)

    @property
    def _min_batch(self):
        return max(1, (self.concurrency + self.prefetch) // 2)

    def _adapt_prefetch(self, claimed, asked):
        if not self.adaptive_prefetch or not asked:
            return
        if claimed < asked:
            self.prefetch = self.concurrency  # the backlog is gone: hold no more than needed
        elif self._starved:
            self.prefetch = min(self.prefetch_max, self.prefetch * 2)
        self._starved = 0

    def run_once(self):
        """Claim what fits into the free slots and hand it to the handler threads.

        Returns ``(claimed, asked)``.
        """
        asked = self.free_slots()
        if self.max_jobs is not None:
            asked = min(asked, self.max_jobs - self.claimed_total)
        if asked <= 0:
            return 0, 0
        with self._lock:
            running = {}
            for entry in self._inflight.values():
                running[entry.ctx.queue] = running.get(entry.ctx.queue, 0) + 1
        limits = [
            max(0, min(asked, cap - running.get(name, 0)))
            for name, cap in zip(self.queues, self.queue_caps, strict=True)
        ]
        rows = store.claim(
            self.session, worker_id=self.worker_id, queues=self.queues, limits=limits, limit=asked
        )
        self._adapt_prefetch(len(rows), asked)

        self.claimed_total += len(rows)
        for row in rows:
            ctx = JobContext(row, worker_id=self.worker_id, using=self.using)
            job_type = registry.get(ctx.type)
            entry = _Inflight(ctx, job_type.timeout if job_type else None)
            with self._lock:
                self._inflight[(ctx.id, ctx.attempt)] = entry
            self._work.put(entry)
        if rows and logger.isEnabledFor(logging.DEBUG):
            logger.debug("dbqueue claimed %d jobs: %s", len(rows), [r.id for r in rows])
        return len(rows), asked

    # ---------------------------------------------------------------------------------------
    # Handler threads
    # ---------------------------------------------------------------------------------------
    def note_db_error(self):
        self.db_error_epoch += 1

    def _handler_thread(self):
        loop = None
        seen_epoch = self.db_error_epoch
        try:
            while True:
                try:
                    entry = self._work.get_nowait()
                except queue_module.Empty:
                    self._starved += 1  # threads outran the claims: prefetch more
                    entry = self._work.get()
                if entry is None:
                    return
                if seen_epoch != self.db_error_epoch:
                    seen_epoch = self.db_error_epoch
                    self._drop_broken_connections()
                if self._releasing and entry.started is None:
                    # Claimed but not started before shutdown: hand it back untouched.
                    self._finish(entry, released=True)
                    continue
                if (
                    registry.get(entry.ctx.type)
                    and registry.get(entry.ctx.type).is_async
                    and loop is None
                ):
                    loop = asyncio.new_event_loop()
                try:
                    self._run_job(entry, loop)
                except Exception:  # a bug of ours: log it, keep the thread alive
                    logger.exception("dbqueue: internal error running job=%s", entry.ctx.id)
        finally:
            if loop is not None:
                loop.close()
            close_side_connections()
            connections.close_all()

    def _run_job(self, entry, loop):
        ctx = entry.ctx
        entry.started = time.monotonic()
        job_type = registry.get(ctx.type)
        try:
            if job_type is None:
                raise LookupError(
                    f"no handler is registered for job type {ctx.type!r} on worker "
                    f"{self.worker_id} (was its @job removed or renamed?)"
                )
            if job_type.atomic:
                self._run_atomic(job_type, ctx, entry, loop)
                result_json = None
            else:
                result_json = encode_result(self._call(job_type, ctx, loop))
        except _FencedOut:
            logger.warning(
                "dbqueue fenced job=%s type=%s attempt=%s: atomic handler rolled back, "
                "the lease was lost and the job belongs to another attempt",
                ctx.id,
                ctx.type,
                ctx.attempt,
            )
        except RetryJob as exc:
            self._failed(entry, exc, delay=clamp_delay(exc.delay))
        except DiscardJob as exc:
            self._failed(entry, exc, delay=0, dead=True)
        except BaseException as exc:
            # Exception, but also SystemExit from a handler's sys.exit(), an async handler's
            # CancelledError or a KeyboardInterrupt raised into this thread: the job failed, the
            # thread lives on.
            if isinstance(exc, DB_ERRORS):
                self.note_db_error()
            self._failed(entry, exc, delay=self._retry_delay(job_type, ctx.attempt))
        else:
            if job_type.atomic:
                self.acks.committed(ctx)  # its completion committed with its writes
            elif not (entry.timed_out or entry.lost):
                self.acks.succeed(ctx, result_json)
        finally:
            self._cleanup_connections()
            self._finish(entry)

    def _call(self, job_type, ctx, loop):
        if job_type.is_async:
            return loop.run_until_complete(job_type.func(ctx))
        return job_type.func(ctx)

    def _run_atomic(self, job_type, ctx, entry, loop):
        with transaction.atomic(using=self.using):
            result_json = encode_result(self._call(job_type, ctx, loop))
            if entry.timed_out or entry.lost:
                raise _FencedOut
            acks = [(ctx.id, ctx.attempt, result_json)]
            if not store.complete(self.using, acks, worker=self.worker_id):
                raise _FencedOut

    def _retry_delay(self, job_type, attempt):
        try:
            return clamp_delay(registry.retry_delay(job_type, attempt, self.conf))
        except Exception:  # a broken backoff callable must not lose the failure
            logger.exception(
                "dbqueue: the backoff of job type %r failed; retrying in 60s",
                getattr(job_type, "name", "?"),
            )
            return 60.0

    def _failed(self, entry, exc, *, delay, dead=False):
        if entry.timed_out or entry.lost:
            return  # the timeout or the sweeper already recorded this attempt's end
        record = error_record(exc, attempt=entry.ctx.attempt, worker_id=self.worker_id)
        self.acks.fail(entry.ctx, record, delay=delay, dead=dead)

    @staticmethod
    def _drop_broken_connections():
        for connection in connections.all(initialized_only=True):
            if connection.connection is not None and not connection.is_usable():
                connection.close()

    def _cleanup_connections(self):
        # A handler that broke its connection must not pass the breakage to the next job.
        for connection in connections.all(initialized_only=True):
            if connection.connection is not None and connection.errors_occurred:
                if connection.is_usable():
                    connection.errors_occurred = False
                else:
                    connection.close()
            if connection.in_atomic_block or (
                connection.connection is not None and not connection.get_autocommit()
            ):
                logger.error(
                    "dbqueue: a handler left a transaction open on %r; rolling it back",
                    connection.alias,
                )
                discard_connection(connection)

    def _finish(self, entry, released=False):
        with self._lock:
            self._inflight.pop((entry.ctx.id, entry.ctx.attempt), None)
            free = self.concurrency + self.prefetch - len(self._inflight)
            # Wake the claim loop when a real batch fits again (or when the worker went idle,
            # which a burst run waits for); waking on every finish would claim one job at a time.
            want = (self._want_capacity and free >= self._min_batch) or not self._inflight
        if released:
            self._release([entry])
        entry.done.set()
        if want:
            self._wakeup.set()

    # ---------------------------------------------------------------------------------------
    # Notifications
    # ---------------------------------------------------------------------------------------
    def _on_notify(self, payload):
        if payload is None or parse_wakeup(payload)[0] in self.queues:
            self._wakeup.set()

    # ---------------------------------------------------------------------------------------
    # The loop
    # ---------------------------------------------------------------------------------------
    def start(self):
        """Start the helper threads (handlers, acks, heartbeat, listener)."""
        from .apps import DBQueueConfig

        if DBQueueConfig._uses_tasks_backend():
            from .tasks import discover_tasks

            discover_tasks()  # import every app's tasks.py, so @task functions are known
        for index in range(self.concurrency):
            thread = threading.Thread(
                target=self._handler_thread, name=f"dbqueue-handler-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        self.acks.start()
        self._heartbeat = Heartbeat(self)
        self._heartbeat.start()
        if self.listen and not self.burst:
            self.listener = Listener(
                self.using, self.conf.NOTIFY_CHANNEL, self._on_notify, self.stopped
            )
            self.listener.start()

    def install_signal_handlers(self):
        def handle(signum, frame):
            self._signals += 1
            if self._signals > 1:
                logger.warning("dbqueue worker %s: second signal, exiting at once", self.worker_id)
                os._exit(1)
            logger.warning(
                "dbqueue worker %s: %s received, finishing running jobs (grace %gs)",
                self.worker_id,
                signal.Signals(signum).name,
                self.conf.SHUTDOWN_GRACE,
            )
            self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def stop(self):
        """Ask the loop to stop claiming and shut down gracefully. Safe from any thread."""
        self._releasing = True
        self.stopping.set()
        self._wakeup.set()

    def run(self):
        """Run until stopped; returns the process exit code (0 after a graceful stop)."""
        self.start()
        errors = 0
        next_sweep = next_schedule = time.monotonic()
        next_status = time.monotonic() + (self.conf.STATUS_INTERVAL or 0)
        last_counts = (0, 0, 0)
        try:
            while not self.stopping.is_set():
                now = time.monotonic()
                if self.parent_pid is not None and os.getppid() != self.parent_pid:
                    logger.warning(
                        "dbqueue worker %s: its supervisor died; stopping", self.worker_id
                    )
                    self.stop()
                    break
                # Maintenance first, each on its own: a sweep, a schedule or a status line that
                # fails is logged and tried again at its next interval, and never stops claiming.
                if now >= next_sweep:
                    next_sweep = now + self.conf.SWEEP_INTERVAL
                    self._maintenance("sweep", self.sweeper.run_once)
                if self.scheduler.schedules and now >= next_schedule:
                    next_schedule = now + self.conf.SCHEDULE_INTERVAL
                    self._maintenance("scheduler", self.scheduler.run_once)
                if self.conf.STATUS_INTERVAL and now >= next_status:
                    next_status = now + self.conf.STATUS_INTERVAL
                    last_counts = (
                        self._maintenance("status", self._status_line, last_counts) or last_counts
                    )
                try:
                    self._wakeup.clear()
                    claimed, asked = self.run_once()
                    errors = 0
                except DB_ERRORS as exc:
                    errors += 1
                    self.note_db_error()
                    reset_connection(self.using, self.session)
                    delay = min(5.0, 0.1 * 2**errors)
                    logger.warning(
                        "dbqueue worker lost the database (%s); retrying in %.2fs", exc, delay
                    )
                    self.stopping.wait(delay)
                    continue
                except OTHER_DB_ERRORS:
                    # Not a lost connection (a bad row, a broken constraint, a migration not
                    # applied): log it with its traceback and keep going, slowly.
                    errors += 1
                    delay = min(30.0, 0.5 * 2**errors)
                    logger.exception(
                        "dbqueue worker: database error in the claim loop; retrying in %.1fs", delay
                    )
                    # Also drops the session's prepared statements, which a migration can make
                    # invalid ("cached plan must not change result type").
                    reset_connection(self.using, self.session)
                    self.stopping.wait(delay)
                    continue
                if self.max_jobs is not None and self.claimed_total >= self.max_jobs:
                    break
                # A burst run ends when a claim that asked for work found none and nothing is
                # in flight. (A claim that asked for nothing, because every slot was busy, proves
                # nothing about the queue.)
                if (
                    self.burst
                    and asked
                    and claimed == 0
                    and self.free_slots() == self.concurrency + self.prefetch
                ):
                    break
                with self._lock:
                    self._want_capacity = asked == 0 or claimed == asked
                    # Read under the lock that _finish() holds: a handler that finished before
                    # the flag was set did not wake us, so look at the free slots ourselves.
                    free = self.concurrency + self.prefetch - len(self._inflight)
                if asked and claimed == asked:
                    continue  # there may be more: claim again at once
                if asked == 0 or self._want_capacity:
                    # Full: wait for enough capacity to make the next claim a real batch.
                    if free < self._min_batch:
                        self._wakeup.wait(0.5)
                else:
                    idle = self.poll_interval
                    if self.scheduler.schedules:
                        idle = min(idle, max(0.0, next_schedule - time.monotonic()))
                    self._wakeup.wait(idle)
        finally:
            self._shutdown()
        return 0

    def _maintenance(self, what, func, *args):
        try:
            return func(*args)
        except DB_ERRORS as exc:
            self.note_db_error()
            reset_connection(self.using)
            logger.warning("dbqueue %s failed, the database connection was lost (%s)", what, exc)
        except Exception:
            reset_connection(self.using)
            logger.exception("dbqueue %s failed; trying again at its next interval", what)
        return None

    def _status_line(self, last):
        """Print one summary line when anything happened since the last one."""
        counts = (self.acks.succeeded, self.acks.failed + self.acks.dead, self.claimed_total)
        if counts == last:
            return counts
        elapsed = max(1e-6, self.conf.STATUS_INTERVAL)
        depth = store.count_due(self.using, self.queues)
        self.out(
            f"dbqueue worker {self.worker_id}: {(counts[0] - last[0]) / elapsed:.1f} done/s, "
            f"{(counts[1] - last[1]) / elapsed:.1f} failed/s, {depth if depth < 10000 else '10000+'} "
            f"due in {','.join(self.queues)}, {len(self._inflight)} in flight"
        )
        return counts

    def _release(self, entries):
        held = [(e.ctx.id, e.ctx.attempt) for e in entries if not (e.timed_out or e.lost)]
        for attempt in range(5):
            try:
                released = store.release(self.using, held, worker=self.worker_id)
                for entry in entries:
                    if entry.ctx.id in released:
                        logger.info(
                            "dbqueue released job=%s type=%s attempt=%s",
                            entry.ctx.id,
                            entry.ctx.type,
                            entry.ctx.attempt,
                        )
                return released
            except DB_ERRORS as exc:
                reset_connection(self.using)
                logger.warning("dbqueue could not release %d jobs (%s)", len(held), exc)
                time.sleep(0.2 * (attempt + 1))
        return set()

    def _shutdown(self):
        """Stop: after a signal, release unstarted jobs and give running ones the grace period;
        after ``burst`` or ``max_jobs``, let everything claimed finish."""
        # A signal during this wait switches to the graceful stop below (grace, then release).
        while not self._releasing:
            with self._lock:
                remaining = list(self._inflight.values())
            if not remaining:
                break
            remaining[0].done.wait(0.1)
        self.stopping.set()
        grace = self.conf.SHUTDOWN_GRACE
        # Jobs claimed but not started go back at once, in one statement.
        queued = []
        while self._releasing:
            try:
                entry = self._work.get_nowait()
            except queue_module.Empty:
                break
            if entry is not None:
                queued.append(entry)
        if queued:
            self._release(queued)
            for entry in queued:
                self._finish(entry)
        # Jobs claimed but not started: the handler threads release them as they pick them up
        # (stopping is set). Wait for running handlers up to the grace period.
        deadline = time.monotonic() + grace
        while True:
            with self._lock:
                remaining = list(self._inflight.values())
            if not remaining or time.monotonic() >= deadline:
                break
            remaining[0].done.wait(min(0.1, max(0.0, deadline - time.monotonic())))
        if remaining:
            logger.warning(
                "dbqueue worker %s: %d jobs still running after %gs grace; releasing them",
                self.worker_id,
                len(remaining),
                grace,
            )
            self._release(remaining)
            for entry in remaining:
                entry.lost = True  # their outcome, if they ever finish, is discarded
        for _ in self._threads:
            self._work.put(None)
        self.acks.close(timeout=max(5.0, grace))
        self.stopped.set()
        for thread in self._threads:
            thread.join(0.5)
        if self.listener is not None:
            self.listener.join(1.0)
        self.session.close()
        connections[self.using].close()
        logger.info(
            "dbqueue worker %s stopped: %d succeeded, %d retried, %d dead, %d fenced",
            self.worker_id,
            self.acks.succeeded,
            self.acks.failed,
            self.acks.dead,
            self.acks.fenced,
        )
