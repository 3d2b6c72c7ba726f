"""The worker: the claim loop and shutdown. No SQL text, no thread plumbing here.

One ``Worker`` is one process's worth of work. Its loop, on the calling thread, is the only code
that talks to the database for the worker itself, on one connection of its own (a ``Session``):
it claims jobs into free handler slots, writes the outcomes the handlers left in the
acknowledgement buffer (``acks.flush_once``), renews leases (``heartbeat.beat_once``), gives up
runs past their timeout, sweeps expired leases and ticks the schedule. Handlers run in the
handler pool (``execution.py``), which touches the database only through the handlers' own
Django connections. NOTIFY turns into an immediate claim: a worker that listens for itself does
it on its Session, and its loop sleeps on that connection's socket (a listener thread with a
connection of its own only where ``LISTEN_DATABASE`` names another database); under
``--processes`` the supervisor listens for the group.

Dedicated connections per worker process: the Session; plus the listener's only when
``LISTEN_DATABASE`` sends the LISTEN to another database.

The parts, one module each: when to claim and how much (``claim_timing.py``, pure), one claim
(``claiming.py``), building and starting (``startup.py``), stopping (``shutdown.py``).

``run_once()`` does one claim; ``run()`` loops until stopped, SIGTERM, ``burst`` drained or
``max_jobs`` reached, and returns the exit code: 0 after a graceful stop, 3 when the worker gave
up (too many hung handler threads, a helper thread died) so that its supervisor restarts it.
"""

import logging
import os
import secrets
import socket
import threading
import time

from . import claiming, signals, startup
from .cancel_notices import parse_cancel
from .claim_timing import AGAIN, DRAINED, ClaimTiming
from .conf import get_settings
from .connections import BUSY_ERRORS, DB_ERRORS, OTHER_DB_ERRORS, reset_connection
from .execution import retry_delay
from .inflight import Inflight
from .notifications import Wakeup, parse_named, parse_wakeup
from .shutdown import EXIT_GAVE_UP, install_signal_handlers, shut_down

logger = logging.getLogger("django_dbqueue")

UNCAPPED = 2**31 - 1  # a queue without its own concurrency: the claim's limit bounds it


def make_worker_id():
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


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
        execution=None,
        waker=None,
        report_free=None,
    ):
        conf = get_settings()
        self.conf = conf
        self.using = using or conf.DATABASE
        self.queues = list(queues or conf.QUEUES)
        self.concurrency = concurrency or conf.CONCURRENCY
        self.poll_interval = conf.POLL_INTERVAL if poll_interval is None else poll_interval
        self.burst = burst
        # When to claim and how much (claim_timing.py): the prefetch, what made a claim due.
        self.timing = ClaimTiming(
            concurrency=self.concurrency,
            prefetch=conf.PREFETCH,
            poll_interval=self.poll_interval,
            burst=burst,
        )
        startup.set_flow(self, conf)  # fleet-wide limits (flow.py): self.flow
        self.max_jobs = max_jobs
        self.listen = conf.LISTEN if listen is None else listen
        self.worker_id = worker_id or make_worker_id()
        self.parent_pid = parent_pid  # under a supervisor: stop if it dies
        self.out = out or logger.info
        self.execution = execution or conf.EXECUTION
        # A queue's own cap counts jobs (a batch's one by one); without one, the free slots
        # bound the claim (a batch takes one slot, so a cap of the slots would be too few).
        self.queue_caps = [
            (conf.QUEUES.get(name) or {}).get("concurrency") or UNCAPPED for name in self.queues
        ]
        self.async_commit = conf.ASYNC_COMMIT
        self.stopping = threading.Event()  # no more claims
        self.stopped = threading.Event()  # helper threads may exit
        self._wakeup = Wakeup()
        self._readable = False  # the session's socket woke the loop: notifications to read
        self._acks_ready = threading.Event()
        self._releasing = False  # a signal or a fatal error: hand unstarted jobs back
        self.restarts_in_place = False  # set by run_jobqueue (shutdown.leave_registry)
        self._signals = 0
        self._stop_signalled = False  # a signal asked to stop (see install_signal_handlers)
        self._reconnected = False
        self._recover_after = 0.0  # time.monotonic() before which _recover does not look again
        self.exit_code = 0
        self.claimed_total = 0
        self.claims = 0  # claim statements run (the fleet benchmark counts claims per job)
        self.empty_claims = 0
        self.inflight = Inflight()
        self.waker = waker  # a supervisor's wake-up pipe, instead of a listener of our own
        self.report_free = report_free  # tells that supervisor how many jobs we could take
        self.listener = None
        startup.assemble(self, conf, waker=waker)  # its Session, pool, waiting, services

    # ---------------------------------------------------------------------------------------
    # The claim
    # ---------------------------------------------------------------------------------------
    def free_slots(self):
        return self.timing.free(self.inflight.occupied())

    @property
    def prefetch(self):
        return self.timing.prefetch

    @property
    def _starved(self):  # counted by the handler pool (execution.py)
        return self.timing.starved

    @_starved.setter
    def _starved(self, value):
        self.timing.starved = value

    @property
    def _claim_next(self):  # (these two: read by tests/integration/test_wakeup_slots.py)
        return self.timing.claim_next

    @property
    def _missed(self):
        return self.timing.missed

    def run_once(self, done=None):
        """Claim what fits into the free slots and hand it to the handler pool; ``done``, the
        successes taken from the acknowledgement buffer, ride on the claim (claiming.py).
        Returns ``(claimed, asked)``."""
        return claiming.claim(self, done)

    # ---------------------------------------------------------------------------------------
    # Called by the handler pool
    # ---------------------------------------------------------------------------------------
    def started(self, entry):
        """A handler takes ``entry``: the ``job_started`` signal (costs nothing unheard)."""
        if signals.job_started.receivers:
            ctx = entry.ctx
            signals.send(
                signals.job_started,
                ctx.type,
                job_name=ctx.name,
                job_id=ctx.id,
                queue=ctx.queue,
                attempt=ctx.attempt,
                worker_id=self.worker_id,
                enqueued_at=ctx.enqueued_at,
                wait=ctx.wait,
            )

    def settle(self, entry, outcome):
        """Hand a run's outcome to the acknowledgement buffer (or discard it: given up)."""
        self.acks.settle(entry, outcome)

    def finished(self, entry):
        """The pool is done with ``entry``: its handler returned (or its child process is dead),
        or it never started. Called on the handler's thread."""
        failure = self.inflight.end(entry)
        if failure is not None and not (entry.lost or entry.released):
            # A run past its timeout that kept its job `running`: now that it has ended, its
            # failure is written (and the job's slot of its limit, or its key, frees).
            error, delay = failure
            self.acks.fail(entry, error, delay=delay, duration=time.monotonic() - entry.started)
        occupied = self.inflight.remove(entry)
        # Claim again when a backlog left the slots full and a real batch fits again, a kept
        # wake-up has a thread now, a limit may have room, a serial key's next job may be
        # claimable, or a burst run went idle (claim_timing.py).
        if self.timing.finished(keyed=entry.keyed, occupied=occupied):
            # Also ends _batch_acks' wait for more completions: the claim they ride on is due
            # now, not at the end of ACK_INTERVAL (handlers that wait on I/O let the loop reach
            # that wait while slots are still busy).
            self._acks_ready.set()
            self._wakeup.set()
        elif self.waiting.wants_sync(occupied < self.concurrency):
            self._wakeup.set()  # a thread is free again: the loop takes the wake-up slots back

    def _sync_slots(self):
        """Take or give back the wake-up slots as the free threads say; once more should a
        handler have freed a thread meanwhile (finished() saw the slots still held and did not
        wake the loop for it)."""
        for _ in range(2):
            free_thread = self.inflight.occupied() < self.concurrency
            if not self.waiting.wants_sync(free_thread):
                break
            self.waiting.sync_slots(free_thread)
        if (retry := self.waiting.next_try()) is not None:
            # A failed take or give let go of WAITING too: say it again soon, not at the poll.
            self.timing.poll_by(retry)

    def retry_delay(self, job_type, attempt):
        return retry_delay(job_type, attempt, self.conf)

    def _on_ack(self):
        self._acks_ready.set()
        self._wakeup.set()

    # ---------------------------------------------------------------------------------------
    # Wake-ups, signals, fatal errors
    # ---------------------------------------------------------------------------------------
    def cancel_requested(self, ids):
        """The cancel of jobs ``ids`` was asked for (a notification or the heartbeat told us;
        any thread). A running handler is told (``ctx.cancelled``; an async one's task is
        cancelled; in process mode its child is signalled); a job claimed but not started is
        withdrawn, never started, and written cancelled. Ids this worker does not hold are
        ignored. Returns how many jobs were affected."""
        running, withdrawn = self.inflight.cancel(ids)
        for entry in running:
            logger.info(
                "dbqueue cancelling job=%s type=%s attempt=%s: telling its handler",
                entry.ctx.id,
                entry.ctx.name,
                entry.ctx.attempt,
            )
            self.pool.cancel(entry)
        for entry in withdrawn:
            self.acks.cancel(entry)
        return len(running) + len(withdrawn)

    def _on_notify(self, payload, *, wake=True):
        """A notification (``None``: a wake-up that names no queue). ``wake=False``: called by
        the loop itself right before it looks whether a claim is due, so the claim this asks
        for runs on that same pass; the loop is not woken again for it. Never raises."""
        if payload is not None and (ids := parse_cancel(payload)) is not None:
            # A hint only (NOTIFY needs no privilege): the loop asks the database (heartbeat)
            if self.heartbeat.hint_cancels(ids) and wake:
                self._wakeup.set()
            return
        if self.stopping.is_set():
            return  # no more claims: a wake-up only matters to a cancel, handled above
        if payload is None:
            self.timing.wake()
            if wake:
                self._wakeup.set()
            return
        queue = parse_wakeup(payload)[0]
        if queue not in self.queues:
            return
        act = self.waiting.acts_on(
            queue, parse_named(payload), free_thread=self.inflight.occupied() < self.concurrency
        )
        if act is None:
            # Ours, but every thread is busy: claiming now would hold the job in our buffer
            # while idle workers sleep. Claim when a thread frees (finished); look again in
            # case one did just now, before finished() could see the flag.
            act = self.timing.keep_wakeup(self.inflight.occupied)
        if act:
            self.timing.wake()
            if wake:
                self._wakeup.set()

    def fatal(self, reason):
        """Give up: stop claiming, hand back what has not started, exit with EXIT_GAVE_UP."""
        if self.exit_code == 0:
            logger.error("dbqueue worker %s giving up: %s", self.worker_id, reason)
        self.exit_code = EXIT_GAVE_UP
        self.stop()

    def install_signal_handlers(self):
        """SIGTERM and SIGINT stop gracefully; a second one exits at once (shutdown.py)."""
        install_signal_handlers(self)

    def stop(self):
        """Ask the loop to stop claiming and shut down gracefully. Safe from any thread (but not
        from a signal handler on the loop's thread: the handlers above set a flag instead)."""
        self._releasing = True
        self.stopping.set()
        self._acks_ready.set()  # ends _batch_acks' wait: the shutdown writes what is buffered
        self._wakeup.set()

    def _stop_requested(self):
        """Whether to stop: ``stop()`` was called, or a signal asked (made ``stopping`` here, on
        the loop's thread)."""
        if self._stop_signalled and not self.stopping.is_set():
            self.stopping.set()
        return self.stopping.is_set()

    def _backoff(self, delay):
        """Wait ``delay`` seconds before retrying the database, or less if asked to stop."""
        deadline = time.monotonic() + delay
        while not self._stop_requested():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._wakeup.wait(left)
            self._wakeup.clear()

    # ---------------------------------------------------------------------------------------
    # The loop
    # ---------------------------------------------------------------------------------------
    def start(self):
        """Start the handler pool and the listener (startup.py)."""
        startup.start(self)

    @property
    def listening(self):
        """An Event set while this worker's LISTEN is in place (on its session or its listener
        thread's connection), or None when it does not listen itself."""
        if self.session.listen is not None:
            return self.session.listening
        return self.listener.connected if self.listener is not None else None

    def _take_notifies(self, *, wake=True):
        """Act on the notifications the session received (while a statement ran, or read from
        its socket while the loop slept). ``wake=False``: the loop looks whether a claim is due
        right after this, so a wake-up taken here is acted on in the same pass; setting
        ``_wakeup`` for it would only send the loop round once more, idle, while the handler
        thread that the claim fed waits for the GIL."""
        if self._readable:
            self._readable = False
            self.session.read_notifies()
        notifies = self.session.notifies
        while notifies:
            self._on_notify(notifies.popleft(), wake=wake)
        self.heartbeat.check_hinted(self.session)  # heard here, or by a listener thread

    def run(self):
        """Run until stopped; returns the process exit code (0 after a graceful stop)."""
        self.start()
        try:
            self._loop()
        finally:
            shut_down(self)
        return self.exit_code

    def _loop(self):
        errors = 0
        while not self._stop_requested():
            if self.parent_pid is not None and os.getppid() != self.parent_pid:
                logger.warning("dbqueue worker %s: its supervisor died; stopping", self.worker_id)
                self.stop()
                break
            claimed = asked = None
            try:
                self._batch_acks()
                if self._wakeup.is_set() or not self._readable:
                    # Woken by the session's socket with the flag down (an idle worker's
                    # wake-up), there is nothing to drain: the pipe's read would only fail. A
                    # byte that a racing set() left there with the flag down returns the next
                    # wait at once, and that pass, not woken by the socket, drains it.
                    self._wakeup.clear()
                self._take_notifies(wake=False)
                if self._reconnected:
                    self._recover()
                self.maintenance.run_due()
                # Claim only when there may be work: a notification, capacity wanted for a
                # backlog, the poll. A wake-up to write outcomes or renew leases claims nothing.
                claim_now = self.timing.due(time.monotonic())
                # Successes go out with the claim when there is one (one round trip for both);
                # failures (durable, one statement each), and successes with no claim to ride
                # on, on their own.
                if claim_now:
                    # Say that we wait for wake-ups, if we should and do not yet, before the
                    # claim that follows (it may wait on the database: before the completions
                    # are taken, which a lost connection would otherwise lose).
                    self.waiting.before_claim()
                    self.timing.before_claim()  # before the completions are taken
                done = self.acks.take_done() if claim_now else None
                try:
                    self.acks.flush_once(self.session)
                except BaseException:
                    if done:
                        self.acks.restore_done(done)
                    raise
                if self.acks.next_retry is not None:
                    # A job this worker just failed comes due again: look then, not at the poll.
                    self.timing.poll_by(self.acks.next_retry)
                    self.acks.next_retry = None
                if claim_now:
                    self.timing.claiming()
                    claimed, asked = self.run_once(done)
                    full = self.timing.after_claim(claimed, asked)
                    # A full claim: we claim again by ourselves, so stop waiting. A short one:
                    # wait for wake-ups, and claim again once we say so (waiters.py: this claim
                    # may have missed jobs whose enqueues found nobody waiting): next_try().
                    self.waiting.after_claim(full=full)
                    self.timing.poll_from(time.monotonic())
                    if (retry := self.waiting.next_try()) is not None:
                        self.timing.poll_by(retry)
                # Hold the wake-up slots while waiting with a free thread, and only then
                # (waiters.py): given back as the claim took the last free one, taken again
                # when a handler frees one (finished wakes the loop for it). The wake-ups that
                # came during the claim are read first, while the slots they may name are
                # still this worker's: one that names it now that every thread is busy is
                # claimed when a thread frees (timing.missed), not dropped as another worker's.
                self._take_notifies()
                self._sync_slots()
                errors = 0
            except BUSY_ERRORS as exc:
                # A lock held elsewhere past lock_timeout (startup.py): the connection is fine,
                # the completions it carried are kept, jobs a committed claim took before a
                # top-up failed are handed back unspent (_recover); claim again at the poll.
                logger.warning("dbqueue worker: the claim waited too long for a lock (%s)", exc)
                self._reconnected = True
                self.timing.poll_from(time.monotonic())
            except DB_ERRORS as exc:
                errors += 1
                self._lost_connection()
                delay = min(5.0, 0.1 * 2**errors)
                logger.warning(
                    "dbqueue worker lost the database (%s); retrying in %.2fs", exc, delay
                )
                self._backoff(delay)
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
                self._lost_connection()
                self._backoff(delay)
                continue
            if claimed is not None:
                if self.max_jobs is not None and self.claimed_total >= self.max_jobs:
                    break
                then = self.timing.after_result(
                    time.monotonic(),
                    claimed=claimed,
                    asked=asked,
                    occupied=self.inflight.occupied(),
                    acks_pending=self.acks.pending(),
                )
                if then == DRAINED:
                    break
                if then == AGAIN:
                    continue
            if self.report_free is not None:
                self.report_free(self.timing.reportable_free(self.free_slots()))
            self._sleep(self._idle_wait())

    def _sleep(self, timeout):
        """Until woken (``_wakeup``), a notification arrives on the session or ``timeout``."""
        fileno = self.session.listening_fileno()
        if fileno is None:
            if not self.session.notifies:
                self._wakeup.wait(timeout)
            return
        self._readable = self._wakeup.wait_on(fileno, timeout)

    def _idle_wait(self):
        now = time.monotonic()
        if self.acks.ready():
            return self.conf.ACK_INTERVAL
        due = [self.timing.next_poll, self.maintenance.deadline()]
        if (later := self.acks.next_due()) is not None:
            due.append(later)  # an outcome put off for a locked row is tried again then
        return max(0.0, min(due) - now)

    def _batch_acks(self):
        """Let a few completions gather into one statement, unless the slots want a claim.

        The wait ends early on ``_acks_ready``: a full buffer, a claim that came due (finished,
        which makes the claim due first, whatever made it due), a stop. It is cleared before the
        conditions are read, so that what sets it after they were read still ends the wait, and
        what changed before is seen by them. (A stop by signal sets neither: the wait then runs
        out, ACK_INTERVAL at most.)"""
        self._acks_ready.clear()
        if not self.acks.ready() or self.acks.full() or self._stop_requested():
            return
        if self.timing.due_for_acks(self.free_slots()):
            return  # a claim is due: the completions go with it
        self._acks_ready.wait(self.conf.ACK_INTERVAL)

    def _lost_connection(self):
        self.session.reset()
        self.waiting.reset()  # its locks went with the connection
        reset_connection(self.using)
        self._reconnected = True
        self.timing.wake()  # notifications may have been missed meanwhile

    def _recover(self):
        """Release what a claim lost took (claiming.recover); held rows later, twice a second."""
        now = time.monotonic()
        if now < self._recover_after:
            return None
        self._recover_after = now + 0.5
        return claiming.recover(self)
