"""The handler pool: runs claimed jobs' handlers, in threads or in child processes.

``run_handler()`` is one run of one handler, the same in both modes: sync, async (with its
timeout really cancelling it) or atomic (its writes and its completion commit together, fenced by
the lease token); it returns an ``Outcome`` and never raises.

``ThreadPool`` (``EXECUTION = "thread"``, the default) runs handlers on ``concurrency`` threads.
A thread cannot be stopped: when a run passes its timeout, the watchdog records the attempt as
failed and the pool starts a replacement thread, so jobs waiting behind the hung one still run.
(A job that a fleet-wide concurrency limit counts, or that has a serial key, stays ``running``
until its thread returns: its failure is written then; heartbeat.py.) With more than
``HUNG_THREAD_LIMIT`` threads stuck at once (a stuck thread that returns counts no more) the
worker stops claiming, hands back what it has not started and exits non-zero, so that its
supervisor restarts it.

``ProcessPool`` (``EXECUTION = "process"``) runs each slot's handlers in a child process of its
own. A run past its timeout is ended for real: the child is killed and replaced. That is the
hard time limit; it costs a process per slot and a pipe round trip per job.
"""

import asyncio
import contextlib
import logging
import queue as queue_module
import select
import threading
import time
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.db import DatabaseError, connections, transaction

from . import registry, store, tracing
from .batches import Batch
from .connections import close_side_connections, discard_connection
from .exceptions import DiscardJob, JobCancelled, RetryJob, Snooze, UnreadableJob
from .inflight import BatchRun
from .outcomes import ResultError, clamp_delay, encode_result, error_record
from .steps import Suspend, suspension

logger = logging.getLogger("django_dbqueue")


@dataclass
class Outcome:
    """What one run came to. ``kind``: success, committed (an atomic run wrote its own
    completion), fenced (an atomic run lost its lease and rolled back), retry, dead, unknown
    (no handler for the type on this worker), crashed (a child process died under it),
    cancelled (the run stopped because the job was cancelled: ``JobCancelled``, or an async
    handler's task cancelled), snooze (``Snooze``) or wait (a durable wait, steps.py)."""

    kind: str
    result: str | None = None
    error: dict | None = None
    delay: float = 0.0
    duration: float | None = None  # seconds the run took, measured by the pool
    # An atomic run's completion that ended the job cancelled (its cancel was asked for while
    # it ran): who asked ('' when nobody is recorded); None when it ended done.
    cancelled_by: str | None = None
    # A snooze (kind "snooze": Snooze, counts against MAX_SNOOZES; delay in seconds) or a
    # durable wait (until: a database time; reason: what it waits for; seen: the signal_seq the
    # wait saw).
    until: object = None
    reason: str | None = None
    seen: int | None = None


class _FencedOut(Exception):
    """An atomic handler's completion matched no row: roll its writes back."""


def retry_delay(job_type, attempt, conf):
    try:
        return clamp_delay(registry.retry_delay(job_type, attempt, conf))
    except Exception:  # a broken backoff callable must not lose the failure
        logger.exception(
            "dbqueue: the backoff of job type %r failed; retrying in 60s",
            getattr(job_type, "name", "?"),
        )
        return 60.0


def _call(job_type, ctx, loop, timeout):
    with tracing.job_span(ctx):  # a no-op without OpenTelemetry
        return _call_handler(job_type, ctx, loop, timeout)


def _call_handler(job_type, ctx, loop, timeout):
    if not job_type.is_async:
        return job_type.func(ctx)
    coroutine = job_type.func(ctx)
    if timeout:
        coroutine = asyncio.wait_for(coroutine, timeout)
    task = loop.create_task(coroutine)
    # A cancel learned while it runs cancels the task from the thread that learned it (the
    # listener or the claim loop); one learned before this line is seen by the test below.
    ctx._on_cancel = lambda: loop.call_soon_threadsafe(task.cancel)
    if ctx.cancelled:
        task.cancel()
    try:
        return loop.run_until_complete(task)
    except TimeoutError:
        raise TimeoutError(
            f"job ran longer than its timeout of {timeout:g}s; the coroutine was cancelled"
        ) from None
    except asyncio.CancelledError:
        if ctx.cancelled:
            raise JobCancelled(f"job #{ctx.id} was cancelled; its task was cancelled") from None
        raise
    finally:
        ctx._on_cancel = None


def run_handler(ctx, token, *, conf, worker_id, loop=None, given_up=lambda: False):
    """Run ``ctx``'s handler once; returns an :class:`Outcome`. Never raises."""
    job_type = registry.get(ctx.type)
    ctx._token = token  # fences the run's step records (ctx.step)

    def failure(exc, **kwargs):
        return Outcome(error=error_record(exc, attempt=ctx.attempt, worker_id=worker_id), **kwargs)

    if job_type is not None and job_type.batch_size:
        # A batch type's job run on its own (process mode, or a pool that does not batch): a
        # batch of one.
        return run_batch(job_type, [ctx], conf=conf, worker_id=worker_id)[0]
    if job_type is None:
        exc = LookupError(
            f"no handler is registered for job type {ctx.type!r} on worker {worker_id} "
            "(was its @job removed or renamed, or is this worker older than the code that "
            "enqueued it?)"
        )
        return failure(exc, kind="unknown")
    try:
        if job_type.atomic:
            with transaction.atomic(using=ctx.using):
                result = _call(job_type, ctx, loop, job_type.timeout)
                if isinstance(result, Snooze):
                    raise result  # its writes roll back, as for a raised one
                result_json = encode_result(result)
                ended = (
                    {}
                    if given_up()
                    else store.complete_ending(ctx.using, [(ctx.id, token, result_json)])
                )
                if ctx.id not in ended:
                    raise _FencedOut
            return Outcome("committed", cancelled_by=ended[ctx.id])
        result = _call(job_type, ctx, loop, job_type.timeout)
        if (suspended := suspension(ctx)) is not None:
            raise suspended  # the handler caught its durable wait: the run still ended there
        if isinstance(result, Snooze):
            return Outcome("snooze", delay=result.seconds)
        return Outcome("success", result=encode_result(result))
    except _FencedOut:
        return Outcome("fenced")
    except BaseException as exc:
        exc = suspension(ctx) or exc  # whatever the handler raised after a swallowed wait
        return exception_outcome(exc, ctx, job_type, conf=conf, worker_id=worker_id)


def exception_outcome(exc, ctx, job_type, *, conf, worker_id):
    """The outcome of ``ctx``'s run that raised ``exc`` (or a batch handler's mark of it)."""

    def failure(exc, **kwargs):
        return Outcome(error=error_record(exc, attempt=ctx.attempt, worker_id=worker_id), **kwargs)

    if isinstance(exc, Snooze):
        return Outcome("snooze", delay=exc.seconds)
    if isinstance(exc, Suspend):
        # As text: a process-mode child sends its outcome as JSON.
        return Outcome("wait", until=exc.until.isoformat(), reason=exc.reason, seen=exc.seen)
    if isinstance(exc, JobCancelled):
        # Not a failure: the job ends cancelled (an atomic run's writes rolled back above).
        return Outcome("cancelled")
    if isinstance(exc, ResultError | UnreadableJob):
        # Deterministic: a result found unstorable after the handler's effects, or a record the
        # job reads (a step, a signal, a dependency's result) that Python cannot read. Running it
        # again would fail the same way (and repeat the effects). Dead at once, with the reason.
        return failure(exc, kind="dead")
    if isinstance(exc, RetryJob):
        return failure(exc, kind="retry", delay=clamp_delay(exc.delay))
    if isinstance(exc, DiscardJob):
        return failure(exc, kind="dead")
    # Exception, but also SystemExit from a handler's sys.exit(), an async handler's
    # CancelledError or a KeyboardInterrupt raised into this thread: the job failed, the
    # thread lives on.
    return failure(exc, kind="retry", delay=retry_delay(job_type, ctx.attempt, conf))


def run_batch(job_type, ctxs, *, conf, worker_id, run=None):
    """One call of a batch handler over ``ctxs`` (docs/batches.md); returns one Outcome per
    job, in order. Never raises. A handler that raises fails every job with that exception.
    ``run``: the BatchRun, which holds the Batch while the call runs (its marks are read at the
    batch's timeout: ``marked_outcome``)."""
    batch = Batch(ctxs)
    if run is not None:
        run.batch = batch
    try:
        with tracing.job_span(ctxs[0]):  # a no-op without OpenTelemetry
            job_type.func(batch)
    except BaseException as exc:
        if isinstance(exc, Suspend):  # ctx.sleep() and the waits end one job's run, not N
            exc = RuntimeError("durable sleeps and waits are not available in batch handlers")
        return [exception_outcome(exc, c, job_type, conf=conf, worker_id=worker_id) for c in ctxs]
    return [
        Outcome("success", result=value)
        if kind == "ok"
        else exception_outcome(value, ctx, job_type, conf=conf, worker_id=worker_id)
        for ctx, kind, value in batch.outcomes()
    ]


def marked_outcome(entry, *, conf, worker_id):
    """The Outcome of the mark its batch handler made for ``entry``'s job so far (the watchdog
    asks at the batch's timeout), or None: not a batch's job, or not marked yet."""
    batch = getattr(entry.batch, "batch", None) if entry.batch is not None else None
    mark = batch.mark_of(entry.ctx.id) if batch is not None else None
    if mark is None:
        return None
    kind, value = mark
    if kind == "ok":
        return Outcome("success", result=value)
    return exception_outcome(
        value, entry.ctx, registry.get(entry.ctx.type), conf=conf, worker_id=worker_id
    )


def _has_input(connection):
    """True when an idle connection's socket has something to read: between queries that is a
    server gone (terminated, restarted) or a notice. Costs no round trip."""
    try:
        fileno = connection.connection.fileno()
        return bool(select.select([fileno], [], [], 0)[0])
    except (OSError, ValueError, AttributeError, DatabaseError):
        return True


class ConnectionHygiene:
    """Connection hygiene of one handler thread (or child process) between jobs."""

    has_connections = True  # until after() has looked

    def before(self):
        # Django's own per-request rule (close_old_connections()): CONN_MAX_AGE and
        # CONN_HEALTH_CHECKS are honoured. Then a kept connection whose server went away while it
        # was idle (restart, a terminated backend, an idle timeout) has already said so on its
        # socket: check those, and only those, so that the next job does not fail its attempt on
        # a dead connection. A thread whose handlers never touched the database pays nothing:
        # after() saw it has no connection, and none can appear between two jobs.
        if not self.has_connections:
            return
        for connection in connections.all(initialized_only=True):
            if connection.connection is None:
                continue
            connection.close_if_unusable_or_obsolete()
            if (
                connection.connection is not None
                and _has_input(connection)
                and not connection.is_usable()
            ):
                connection.close()

    def after(self):
        # A handler that broke its connection must not pass the breakage to the next job.
        initialized = connections.all(initialized_only=True)
        self.has_connections = bool(initialized)
        for connection in initialized:
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


class ThreadPool:
    """``size`` handler threads fed from one local queue; hung threads are replaced."""

    # A run past its timeout goes on in its thread (ProcessPool kills its child instead).
    kills_at_timeout = False
    runs_batches = True  # a batch type's jobs of one claim run in one call (submit BatchRuns)

    def __init__(self, worker, size, *, hung_limit):
        self.worker = worker
        self.size = size
        self.hung_limit = hung_limit
        self.hung = 0  # threads stuck right now in runs given up past their timeout
        self._work = queue_module.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._serial = 0
        # The watchdog (abandon) and a late thread's return (_left) meet here, in either order.
        self._hung_lock = threading.Lock()
        self._stuck: set = set()  # entries given up whose thread has not returned yet
        self._left: set = set()  # entries whose thread returned before abandon() saw them

    def start(self):
        for _ in range(self.size):
            self._spawn()

    def _spawn(self):
        self._serial += 1
        thread = threading.Thread(
            target=self._thread_main, name=f"dbqueue-handler-{self._serial}", daemon=True
        )
        thread.start()
        self._threads.append(thread)

    def submit(self, entries):
        for entry in entries:
            self._work.put(entry)

    def abandon(self, entry):
        """The watchdog gave up ``entry``'s run: replace its thread. Past ``hung_limit`` threads
        stuck at once, the worker gives up instead."""
        if (batch := getattr(entry, "batch", None)) is not None:
            # A batch's jobs time out together: its one thread is replaced once.
            if batch.abandoned:
                return
            batch.abandoned = True
            entry = batch
        with self._hung_lock:
            if entry in self._left:
                # Its thread returned in the meantime (and left, as one given up does).
                self._left.discard(entry)
                stuck = None
            else:
                self._stuck.add(entry)
                self.hung += 1
                stuck = self.hung
        if stuck is not None and stuck > self.hung_limit:
            self.worker.fatal(
                f"{stuck} handler threads are stuck in runs past their timeout (more than "
                f"HUNG_THREAD_LIMIT={self.hung_limit}); exiting so that the supervisor starts "
                "a fresh process"
            )
            return
        if stuck is not None:
            logger.warning(
                "dbqueue: handler thread stuck in job=%s type=%s past its timeout; starting a "
                "replacement (%d stuck now, at most %d)",
                entry.ctx.id,
                entry.ctx.name,
                stuck,
                self.hung_limit,
            )
        self._spawn()

    def _returned_late(self, entry):
        """The thread of ``entry``, given up past its timeout, returned: it is stuck no more
        (and leaves: a replacement took its place)."""
        with self._hung_lock:
            if entry in self._stuck:
                self._stuck.discard(entry)
                self.hung -= 1
                logger.info(
                    "dbqueue: the handler thread of job=%s returned %.1fs after its start "
                    "(past its timeout); %d stuck now",
                    entry.ctx.id,
                    time.monotonic() - entry.started,
                    self.hung,
                )
            else:
                self._left.add(entry)
            with contextlib.suppress(ValueError):
                self._threads.remove(threading.current_thread())

    def cancel(self, entry):
        """``entry``'s cancel was asked for while it runs: tell its handler (any thread)."""
        entry.ctx._cancel()

    def end_runs(self, entries):
        """Before ``entries`` are handed back after the shutdown grace: a thread cannot be
        ended, so nothing here (ProcessPool kills their handler processes)."""

    def stop(self, timeout):
        for _ in self._threads:
            self._work.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run_batch(self, run, hygiene):
        """Run a batch type's claimed jobs in one call; settle each job on its own."""
        worker = self.worker
        entries = []
        for entry in run.entries:
            if worker.inflight.start(entry):
                entries.append(entry)
            else:  # lost, handed back, or cancelled before it started
                worker.finished(entry)
        if not entries:
            return
        job_type = registry.get(entries[0].ctx.type)
        try:
            hygiene.before()
            for entry in entries:
                entry.ctx._token = entry.token  # fences each job's step records
                worker.started(entry)
            if job_type is None or not job_type.batch_size:  # unregistered since the claim
                outcomes = [
                    run_handler(e.ctx, e.token, conf=worker.conf, worker_id=worker.worker_id)
                    for e in entries
                ]
            else:
                ctxs = [e.ctx for e in entries]
                outcomes = run_batch(
                    job_type, ctxs, conf=worker.conf, worker_id=worker.worker_id, run=run
                )
            for entry, outcome in zip(entries, outcomes, strict=True):
                outcome.duration = time.monotonic() - entry.started
                worker.settle(entry, outcome)
        except Exception:  # a bug of ours: log it, keep the thread alive
            logger.exception("dbqueue: internal error running a batch of job=%s", run.ctx.id)
        finally:
            with contextlib.suppress(Exception):
                hygiene.after()
            for entry in entries:
                worker.finished(entry)

    def _thread_main(self):
        worker = self.worker
        hygiene = ConnectionHygiene()
        loop = None
        try:
            while True:
                try:
                    entry = self._work.get_nowait()
                except queue_module.Empty:
                    worker._starved += 1  # threads outran the claims: prefetch more
                    entry = self._work.get()
                if entry is None:
                    return
                if isinstance(entry, BatchRun):
                    self._run_batch(entry, hygiene)
                    if entry.abandoned:
                        self._returned_late(entry)
                        return
                    continue
                if not worker.inflight.start(entry):
                    # Lost, handed back, or cancelled before it started (the worker wrote that).
                    worker.finished(entry)
                    continue
                job_type = registry.get(entry.ctx.type)
                if loop is None and job_type is not None and job_type.is_async:
                    loop = asyncio.new_event_loop()
                try:
                    hygiene.before()
                    worker.started(entry)
                    outcome = run_handler(
                        entry.ctx,
                        entry.token,
                        conf=worker.conf,
                        worker_id=worker.worker_id,
                        loop=loop,
                        given_up=lambda e=entry: e.given_up,
                    )
                    outcome.duration = time.monotonic() - entry.started
                    worker.settle(entry, outcome)
                except Exception:  # a bug of ours: log it, keep the thread alive
                    logger.exception("dbqueue: internal error running job=%s", entry.ctx.id)
                finally:
                    with contextlib.suppress(Exception):
                        hygiene.after()
                    worker.finished(entry)
                if entry.timed_out:
                    # Given up past its timeout: a replacement takes (or took) its place.
                    self._returned_late(entry)
                    return
        finally:
            if loop is not None:
                with contextlib.suppress(Exception):
                    # The ORM calls of async handlers (and their steps, ctx.astep) ran on
                    # asgiref's thread-sensitive executor: close that thread's connections too.
                    loop.run_until_complete(sync_to_async(connections.close_all)())
                loop.close()
            close_side_connections()
            connections.close_all()
