"""The heartbeat and the watchdog: single passes that the worker's claim loop calls.

``beat_once()`` renews, in one fenced statement, the lease of every job the worker still holds
(running, waiting for a thread, or finished with its outcome not yet written); a running job
missing from the answer was taken back by the sweeper and is marked lost, so it is never started
and its outcome is discarded. A job whose row another transaction holds is passed over, not
waited for (``busy``): it stays held, and its lease is renewed by a later beat, once the row is
free; the sweeper leaves a live worker's jobs alone meanwhile (store/leases.py,
RESCUE_EXPIRED). The same answer says which held jobs were marked for
cancellation: the backstop for a cancel notification that did not arrive. ``check_timeouts()`` gives up runs past their type's timeout:
the attempt is recorded as failed (and retried elsewhere), and the handler pool replaces the
thread that is still stuck in it (or kills the child process running it). The failure is written
at once only when nothing can overlap the run that may still be going; a job that a fleet-wide
concurrency limit counts or that has a serial key, and any run in a child process, keeps its lease
until its run has ended, and its failure is written then (``Worker.finished``).
"""

import logging
import threading
import time

from . import registry, store
from .execution import marked_outcome
from .outcomes import error_record

logger = logging.getLogger("django_dbqueue")


def given_up_record(ctx, *, worker_id, cls, reason):
    """The error kept for a run this worker gave up for ``reason`` (a restart in place): the
    attempt counts, so the job is retried or, after its last attempt, dead."""
    last = ctx.attempt >= ctx.max_attempts
    return {
        "attempt": ctx.attempt,
        "class": cls,
        "message": f"{reason}; the attempt counts"
        + (" (that was its last attempt)" if last else " and the job is retried"),
        "traceback": "",
        "worker": worker_id,
    }


class Heartbeat:
    def __init__(self, worker):
        self.worker = worker
        self.lost = 0
        self.busy = 0  # held jobs whose rows another transaction held at the last beat
        self._hinted = set()  # held jobs a cancel notification named (hint_cancels)
        self._hints_lock = threading.Lock()

    def beat_once(self, db):
        """Extend the leases; returns ``(kept, lost)`` counts."""
        worker = self.worker
        held = worker.inflight.held()
        keys = {entry.key for entry in held} | set(worker.acks.pending_keys())
        if not keys:
            return 0, 0
        sent = time.monotonic()  # the renewed leases end no sooner than LEASE after this
        # Keyed by (id, token): an old run of a job beside a new claim of it is not renewed.
        kept, busy = store.renew_leases(db, sorted(keys), async_commit=worker.async_commit)
        self.busy = len(busy)
        for entry in held:
            if entry.key in kept:
                entry.ctx._renewed = sent
                if entry.busy:
                    entry.busy = False
                    logger.info(
                        "dbqueue lease renewed again job=%s type=%s attempt=%s: the "
                        "transaction that held its row ended",
                        entry.ctx.id,
                        entry.ctx.name,
                        entry.ctx.attempt,
                    )
            elif entry.key in busy and not entry.busy:
                entry.busy = True
                logger.warning(
                    "dbqueue lease not renewed job=%s type=%s attempt=%s: another transaction "
                    "holds its row (a select_for_update(), an early SET CONSTRAINTS, a "
                    "transaction left open); renewed once that ends, and not taken back while "
                    "this worker is alive",
                    entry.ctx.id,
                    entry.ctx.name,
                    entry.ctx.attempt,
                )
        # Only a job still held *after* the statement was really lost: one that finished in the
        # meantime has its outcome in the acknowledgement buffer (renewed above) or written.
        cancelling = sorted({job_id for (job_id, _token), marked in kept.items() if marked})
        if cancelling:
            worker.cancel_requested(cancelling)  # those already told are skipped
        lost = worker.inflight.mark_lost(
            [e for e in held if e.key not in kept and e.key not in busy]
        )
        for entry in lost:
            self.lost += 1
            logger.warning(
                "dbqueue lease lost job=%s type=%s attempt=%s: the sweeper took it back; %s",
                entry.ctx.id,
                entry.ctx.name,
                entry.ctx.attempt,
                "this run's outcome will be discarded"
                if entry.started is not None
                else "it will not be started here",
            )
        return len(kept), len(lost)

    def hint_cancels(self, ids):
        """A cancel notification names the jobs ``ids`` (any thread). Only a hint: NOTIFY
        needs no privilege, so anyone who can connect may send one. The ids of jobs this worker
        holds are kept for :meth:`check_hinted`, which the loop runs on its next pass; the
        others are ignored. True when any was kept (the loop is to be woken)."""
        held = {entry.ctx.id for entry in self.worker.inflight.held()} & set(ids)
        if held:
            with self._hints_lock:
                self._hinted |= held
        return bool(held)

    def check_hinted(self, db):
        """On the loop's thread: of the held jobs that cancel notifications named, cancel those
        whose rows say their cancel was asked for (``cancel_requested_at``), in one read on
        ``db``. Returns how many jobs were affected. Ids a lost connection keeps from being
        checked here are told by the next beat, as a lost notification is."""
        with self._hints_lock:
            ids, self._hinted = self._hinted, set()
        if not ids:
            return 0
        worker = self.worker
        keys = sorted(entry.key for entry in worker.inflight.held() if entry.ctx.id in ids)
        cancelling = store.cancels_requested(db, keys) if keys else []
        return worker.cancel_requested(cancelling) if cancelling else 0

    def check_timeouts(self):
        """Give up the runs past their type's timeout; returns how many."""
        worker = self.worker
        kills = worker.pool.kills_at_timeout
        expired = worker.inflight.expire(keep=lambda entry: entry.exclusive or kills)
        for entry in expired:
            ctx = entry.ctx
            if self._settle_marked(entry):
                continue
            last = ctx.attempt >= ctx.max_attempts
            exc = TimeoutError(
                f"job ran longer than its timeout of {entry.timeout:g}s; given up"
                + (" (that was its last attempt)" if last else " and retried")
            )
            record = error_record(exc, attempt=ctx.attempt, worker_id=worker.worker_id)
            record["traceback"] = ""
            delay = worker.retry_delay(registry.get(ctx.type), ctx.attempt)
            # The run may still be going: a thread that cannot be stopped, or a child process
            # killed only just now. For a job a fleet-wide limit counts or with a serial key
            # (and any run in a child), writing the failure now would end the job's `running`
            # and free its slot (its key, its retry) beside that run: its lease is kept until
            # the run has ended, and Worker.finished writes the failure then. Otherwise the
            # failure is written for this attempt now, and whatever the run returns later is
            # discarded (the entry is given up).
            if not (
                entry.kept_past_timeout and worker.inflight.hold_failure(entry, (record, delay))
            ):
                worker.acks.fail(
                    entry, record, delay=delay, duration=time.monotonic() - entry.started
                )
            logger.warning(
                "dbqueue timeout job=%s type=%s attempt=%s after %gs%s",
                ctx.id,
                ctx.name,
                ctx.attempt,
                entry.timeout,
                "; it stays running until its handler returns (a fleet-wide limit or a serial "
                "key counts it)"
                if entry.kept_past_timeout and not kills
                else "",
            )
            worker.pool.abandon(entry)
        return len(expired)

    def _settle_marked(self, entry):
        """A batch's job given up at the batch's timeout whose handler had marked it already
        (``batch.succeed``, ``fail``, ...): it ends by that mark, not as timed out; only the
        unmarked jobs of the batch are retried (docs/batches.md). Not for a run that keeps its
        lease past its timeout (a fleet-wide limit or a serial key counts it, or a child
        process runs it): its end waits for the run's. True when it was settled."""
        if entry.batch is None or entry.kept_past_timeout:
            return False
        worker = self.worker
        outcome = marked_outcome(entry, conf=worker.conf, worker_id=worker.worker_id)
        if outcome is None:
            return False
        outcome.duration = time.monotonic() - entry.started
        worker.acks.settle(entry, outcome, at_timeout=True)
        logger.warning(
            "dbqueue timeout job=%s type=%s attempt=%s after %gs: its batch handler had "
            "marked it (%s), which stands",
            entry.ctx.id,
            entry.ctx.name,
            entry.ctx.attempt,
            entry.timeout,
            outcome.kind,
        )
        worker.pool.abandon(entry)  # once per batch: the thread is replaced for all its jobs
        return True
