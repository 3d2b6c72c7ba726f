"""Process mode (``EXECUTION = "process"``): each handler slot runs its handlers in a child
process of its own, so that a run past its timeout can be ended for real.

The slot's thread in the worker sends the claimed job to its child as JSON over a pipe and waits
for the outcome. When the watchdog gives a run up, the pool kills the child running it (SIGKILL)
and the slot starts a new one for its next job. Children are started with ``spawn``, not
``fork``: forking a process that runs threads can copy a lock held mid-update. A child whose
worker died (``kill -9``) notices within a second and exits, even in the middle of a hung run.

Stopping: after the shutdown grace the pool kills (SIGKILL) the children still running a job
and waits until each is gone before the job is handed back (``end_runs``), so a handler that
ignores SIGTERM can never run on while its job is claimed elsewhere; ``stop`` kills every child
left, idle ones too (a handler may have left its child ignoring SIGTERM).

Cancelling a running job: the slot's thread sends SIGUSR1 to the child running it, whose
handler raises the job's ``ctx.cancelled`` flag (and cancels an async handler's task), so a
handler behaves as it does in thread mode. A child still starting (before its handler for the
signal is installed) dies of the signal instead; the run then ends cancelled all the same.
"""

import asyncio
import contextlib
import datetime
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from dataclasses import asdict

from . import registry
from .context import JobContext
from .exceptions import UnreadableJob
from .execution import ConnectionHygiene, Outcome, ThreadPool, retry_delay, run_handler
from .outcomes import error_record

logger = logging.getLogger("django_dbqueue")


def _row_to_json(ctx, token):
    return json.dumps(
        {
            "token": token,
            "id": ctx.id,
            "type": ctx.type,
            "queue": ctx.queue,
            "payload": ctx.payload,
            "attempt": ctx.attempt,
            "max_attempts": ctx.max_attempts,
            "lease_seconds": ctx.lease_seconds,
            "idempotency_key": ctx.idempotency_key,
            "priority": ctx.priority,
            "created_at": ctx.enqueued_at.isoformat() if ctx.enqueued_at else None,
            "wait": ctx.wait,
            "traceparent": ctx.traceparent,
            # time.monotonic() is one clock for every process of the machine (CLOCK_MONOTONIC).
            "renewed": ctx._renewed,
        }
    ).encode()


def _message(entry, worker_id):
    """The job as the message its child reads (``_row_to_json``), or, for a job whose payload
    this Python decoded but cannot encode again (nested as deep as its json reads: Python 3.13
    reads some 10,000 levels, and the message wraps the payload in one more), the Outcome that
    fails it dead at once, UnreadableJob naming the payload: running it again could never send
    it, and left unsettled it would sit out its lease, attempt after attempt."""
    try:
        return _row_to_json(entry.ctx, entry.token)
    except (ValueError, RecursionError) as exc:
        reason = (
            f"cannot be sent to the handler process as JSON ({type(exc).__name__}: {exc}); "
            "run it in a worker with EXECUTION 'threads', or send a flatter payload"
        )
        error = error_record(
            UnreadableJob("payload", reason), attempt=entry.ctx.attempt, worker_id=worker_id
        )
        return Outcome("dead", error=error, duration=0.0)


def _child_main(conn, worker_id, parent_pid):
    """A handler process: set Django up, then run the jobs the parent sends, one at a time."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when children stop
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    running = [None]  # the JobContext of the run under way, for the cancel signal
    signal.signal(signal.SIGUSR1, lambda *_: running[0] is not None and running[0]._cancel())
    import django

    django.setup()

    from .apps import DBQueueConfig
    from .conf import get_settings
    from .store import ClaimedRow

    if DBQueueConfig._uses_tasks_backend():
        from .tasks import discover_tasks

        discover_tasks()

    def orphan_guard():  # a parent killed with SIGKILL cannot stop a hung child: it stops itself
        while True:
            time.sleep(1.0)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=orphan_guard, daemon=True).start()
    conf = get_settings()
    hygiene = ConnectionHygiene()
    loop = asyncio.new_event_loop()
    while True:
        try:
            message = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            os._exit(0)
        token = message.pop("token")
        renewed = message.pop("renewed", None)
        created = message.pop("created_at")
        message["created_at"] = datetime.datetime.fromisoformat(created) if created else None
        ctx = JobContext(
            ClaimedRow(**message),
            worker_id=worker_id,
            using=conf.DATABASE,
        )
        # The child hears of no renewal: past half a lease, its steps check the lease first.
        ctx._renewed = renewed
        hygiene.before()
        running[0] = ctx
        try:
            outcome = run_handler(ctx, token, conf=conf, worker_id=worker_id, loop=loop)
        finally:
            running[0] = None
        with contextlib.suppress(Exception):
            hygiene.after()
        try:
            conn.send_bytes(json.dumps(asdict(outcome)).encode())
        except (BrokenPipeError, OSError):
            os._exit(0)


class _Child:
    def __init__(self, context, worker_id):
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(
            target=_child_main,
            args=(child_conn, worker_id, os.getpid()),
            name="dbqueue-handler-process",
            daemon=True,
        )
        self.process.start()
        child_conn.close()

    def signal_kill(self):
        """SIGKILL the child, from any thread. Its pipe stays open: the slot's thread, which owns
        it, sees the end of file and closes it (``kill``)."""
        with contextlib.suppress(ProcessLookupError, AttributeError, ValueError):
            self.process.kill()

    def gone(self, timeout):
        """Wait up to ``timeout`` seconds for the child to be gone; True once it is. Its
        sentinel becomes readable when the process has exited: from any thread, and without
        reaping it (the slot's thread does that)."""
        try:
            return bool(multiprocessing.connection.wait([self.process.sentinel], timeout))
        except (AttributeError, ValueError, OSError):
            return True  # never started, or already joined and closed

    def reap(self, grace=5.0):
        """The child's pipe ended: wait for it to exit (killing it if it lingers past ``grace``),
        close its pipe and return its exit code. A child whose pipe closed has not necessarily
        been reaped yet: reading ``exitcode`` at once gave None for a child that exited with 1."""
        self.process.join(grace)
        if self.process.exitcode is None:
            self.signal_kill()
            self.process.join(5)
        with contextlib.suppress(OSError):
            self.conn.close()
        return self.process.exitcode

    def kill(self):
        """Kill the child and close its pipe: only from the slot's own thread. Closing the pipe
        from another thread too could close its descriptor twice, and the second close would
        hit whatever the slot's thread opened under that number meanwhile (its next child's
        pipe: that job would fail with "the handler process died")."""
        self.signal_kill()
        self.process.join(5)
        with contextlib.suppress(OSError):
            self.conn.close()


class ProcessPool(ThreadPool):
    """One child process per slot; a run past its timeout is killed with its process."""

    # Each job runs alone in a child: a batch type's job reaches its handler as a batch of one
    # (execution.run_handler), so the claim hands this pool no BatchRuns (docs/batches.md).
    runs_batches = False

    def __init__(self, worker, size, *, hung_limit):
        super().__init__(worker, size, hung_limit=hung_limit)
        # spawn, not fork: forking a process that runs threads can copy a lock held mid-update.
        self.context = multiprocessing.get_context("spawn")
        self._children: dict[int, _Child] = {}  # id(entry) -> the child running it
        self._started: list[_Child] = []  # every child started, for stop() to make sure of
        self._lock = threading.Lock()
        self.replaced = 0

    def abandon(self, entry):
        """The watchdog gave up ``entry``'s run: kill the child running it."""
        with self._lock:
            child = self._children.get(id(entry))
        if child is not None:
            logger.warning(
                "dbqueue: killing the handler process (pid %s) of job=%s type=%s: past its timeout",
                child.process.pid,
                entry.ctx.id,
                entry.ctx.name,
            )
            child.signal_kill()  # the slot's thread sees the end of file and cleans up

    def cancel(self, entry):
        """``entry``'s cancel was asked for: signal the child running it (see the module doc)."""
        entry.ctx._cancel()
        with self._lock:
            child = self._children.get(id(entry))
            if child is not None:
                with contextlib.suppress(ProcessLookupError, TypeError):
                    os.kill(child.process.pid, signal.SIGUSR1)

    def end_runs(self, entries, timeout=10.0):
        """The shutdown grace is over and ``entries`` are about to be handed back: SIGKILL the
        children running them and wait until they are gone, so that no handler runs on (a child
        that ignores SIGTERM) while its job is claimed elsewhere. Returns the pids still alive
        after ``timeout`` (none unless the kernel could not end them)."""
        with self._lock:
            children = [c for e in entries if (c := self._children.get(id(e))) is not None]
        for child in children:
            logger.warning(
                "dbqueue: killing the handler process (pid %s): still running after the grace",
                child.process.pid,
            )
            child.signal_kill()
        deadline = time.monotonic() + timeout
        return [
            child.process.pid
            for child in children
            if not child.gone(max(0.0, deadline - time.monotonic()))
        ]

    def stop(self, timeout):
        super().stop(timeout)
        # Every child left, idle ones too: one whose handler set SIGTERM to be ignored would
        # otherwise keep the interpreter's exit waiting for it forever (multiprocessing
        # terminates its daemonic children with SIGTERM at exit, then joins them).
        with self._lock:
            children = list(self._started)
        for child in children:
            child.signal_kill()
        deadline = time.monotonic() + 5.0
        for child in children:
            child.gone(max(0.0, deadline - time.monotonic()))

    def _thread_main(self):
        worker = self.worker
        child = None
        try:
            while True:
                entry = self._work.get()
                if entry is None:
                    return
                if not worker.inflight.start(entry):
                    worker.finished(entry)
                    continue
                try:
                    message = _message(entry, worker.worker_id)
                    if isinstance(message, Outcome):  # a job that cannot be sent: dead now
                        worker.started(entry)
                        worker.settle(entry, message)
                        continue
                    if child is None or not child.process.is_alive():
                        child = _Child(self.context, worker.worker_id)
                        with self._lock:
                            self._started = [c for c in self._started if not c.gone(0)]
                            self._started.append(child)
                    worker.started(entry)
                    outcome = self._run_in(child, entry, message)
                    if outcome is None:  # the child died: killed at the timeout, or crashed
                        code = child.reap()
                        child = None
                        self.replaced += 1
                        if entry.timed_out:
                            continue  # the watchdog recorded this attempt already
                        if entry.ctx.cancelled:  # killed by the cancel signal while starting
                            outcome = Outcome("cancelled")
                            outcome.duration = time.monotonic() - entry.started
                            worker.settle(entry, outcome)
                            continue
                        exc = RuntimeError(
                            f"the handler process died while running the job (exit code {code})"
                        )
                        job_type = registry.get(entry.ctx.type)
                        outcome = Outcome(
                            "retry",
                            error=error_record(
                                exc, attempt=entry.ctx.attempt, worker_id=worker.worker_id
                            ),
                            delay=retry_delay(job_type, entry.ctx.attempt, worker.conf),
                        )
                    outcome.duration = time.monotonic() - entry.started
                    worker.settle(entry, outcome)
                except Exception:
                    logger.exception("dbqueue: internal error running job=%s", entry.ctx.id)
                finally:
                    worker.finished(entry)
        finally:
            if child is not None:
                child.kill()

    def _run_in(self, child, entry, message):
        with self._lock:
            self._children[id(entry)] = child
        try:
            child.conn.send_bytes(message)
            while True:
                # Wake now and then: a stop after the grace period kills the children.
                if child.conn.poll(0.5):
                    return Outcome(**json.loads(child.conn.recv_bytes()))
                if not child.process.is_alive():
                    return None
        except (EOFError, OSError):
            return None
        finally:
            with self._lock:
                self._children.pop(id(entry), None)
