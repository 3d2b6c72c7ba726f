"""Acknowledgements: the outcomes of finished handlers, buffered and written back in batches.

Handler threads only append to the buffer. The worker's claim loop calls ``flush_once()`` on its
own Session every ``ACK_INTERVAL`` seconds or ``ACK_BATCH`` jobs: successes as one fenced
statement (committed asynchronously with ``ASYNC_COMMIT``: a completion lost in a database crash
only means the job runs again), failures one by one with a durable commit, so an error history
or a dead letter is never lost. A flush that fails with the connection keeps everything in the
buffer and is tried again once the database is back, fenced, so a connection blip does not make
finished work run again. A retried write that matches nothing is read back: when the first try
had committed after all, the outcome is reported (signals, counts) as if the reply had arrived.

A write about a job whose row another transaction holds (a caller's ``select_for_update()``, a
signal or cancel whose deferred trigger ran early, a workflow linking a dependent to it) never
waits for it on the worker's only connection: the statements pass such a row over (SKIP LOCKED),
and a job whose workflow dependent such a transaction holds, which its end must count down or
cancel, too (store DEPENDENTS_FREE); the read-back finds it still running under this claim. The
rare wait that escapes that (a dependent linked after the statement began) is ended by the
session's ``lock_timeout``, and the whole batch is put off at once. That outcome is kept aside, its lease renewed with the rest, and
written again after a short delay (``BUSY_FIRST`` doubling up to ``BUSY_MOST``) until the row is
free: nothing is lost, and every other outcome is written now.
"""

import logging
import threading
import time
from dataclasses import dataclass

from . import signals, store
from .ack_reports import Reporting
from .connections import BUSY_ERRORS, DB_ERRORS

logger = logging.getLogger("django_dbqueue")


@dataclass(eq=False)
class _Failure:
    entry: object
    error: dict
    delay: float
    dead: bool = False
    unknown_type: bool = False
    duration: float | None = None  # seconds the run took, for the outcome's signal
    cancelled: bool = False  # the run stopped because it was cancelled (error is None)
    snooze: object = None  # the Outcome of a snooze or a durable wait (error is None)
    tries: int = 0  # writes refused for a reason other than the connection


@dataclass(eq=False)
class _Later:
    """An outcome whose job's row another transaction held: written again at ``due``."""

    due: float  # time.monotonic()
    kind: str  # "done" (item: (entry, result, duration)) or "failed" (item: a _Failure)
    item: object
    tries: int = 1

    @property
    def entry(self):
        return self.item[0] if self.kind == "done" else self.item.entry


class Acknowledger(Reporting):
    MAX_OTHER_ERRORS = 5  # a write that keeps failing for a reason other than the connection
    BUSY_FIRST = 0.1  # seconds before a write whose row was locked is tried again ...
    BUSY_MOST = 2.0  # ... doubling up to this

    def __init__(
        self,
        *,
        worker_id,
        batch,
        async_commit,
        unknown_type_delay,
        unknown_type_grace,
        max_snoozes=1000,
    ):
        self.worker_id = worker_id
        self.batch = batch
        self.async_commit = async_commit
        self.unknown_type_delay = unknown_type_delay
        self.unknown_type_grace = unknown_type_grace
        self.max_snoozes = max_snoozes
        self._lock = threading.Lock()
        self._done = []  # (entry, result_json, duration)
        self._failed: list[_Failure] = []
        self._later: list[_Later] = []  # outcomes whose rows were locked: tried again later
        self._tries = {}  # (id, token) -> times put off so far, of an outcome due again
        self.on_ready = lambda: None  # set by the worker: wakes its loop
        self.next_retry = None  # time.monotonic() when the soonest retry written comes due
        self.succeeded = 0
        self.failed = 0
        self.fenced = 0
        self.dead = 0
        self.deferred = 0
        self.cancelled = 0
        self.snoozed = 0  # snoozes and durable waits written
        self.busy = 0  # writes put off because another transaction held the job's row

    # -- called by handler threads -------------------------------------------------------------
    def succeed(self, entry, result_json=None, duration=None):
        """Buffer a success; ``result_json`` is the handler's return value, already encoded;
        ``duration`` (seconds of the run) goes to the ``job_succeeded`` signal."""
        with self._lock:
            self._done.append((entry, result_json, duration))
            wake = len(self._done) == 1 or len(self._done) >= self.batch
        if wake:
            self.on_ready()

    def fail(self, entry, error, *, delay, dead=False, unknown_type=False, duration=None):
        with self._lock:
            self._failed.append(_Failure(entry, error, delay, dead, unknown_type, duration))
        self.on_ready()

    def cancel(self, entry, duration=None):
        """Buffer the end of a run stopped by its cancel (or of a job withdrawn before it
        started): written as ``cancelled``, durably, like a failure."""
        with self._lock:
            self._failed.append(_Failure(entry, None, 0.0, cancelled=True, duration=duration))
        self.on_ready()

    def committed(self, entry, duration=None, cancelled_by=None):
        """An atomic handler committed its own completion (``cancelled_by`` not None: it ended
        the job cancelled): count it and send the signal."""
        if cancelled_by is not None:
            self._report_cancelled(entry.ctx, cancelled_by, None, duration)
            return
        with self._lock:
            self.succeeded += 1
        self._signal(signals.job_succeeded, entry.ctx, duration=duration)

    def settle(self, entry, outcome, *, at_timeout=False):
        """Buffer a run's outcome (``execution.Outcome``), or discard it: its attempt was given
        up (timed out, lost or released) and its end is already written. ``at_timeout``: the
        watchdog writes, for a job it gives up now, the mark its batch handler made for it
        (heartbeat.check_timeouts), in place of the timeout's failure."""
        kind, duration = outcome.kind, outcome.duration
        if kind == "committed":
            self.committed(entry, duration=duration, cancelled_by=outcome.cancelled_by)
        elif kind == "fenced":
            self.fenced += 1
            logger.warning(
                "dbqueue fenced job=%s type=%s attempt=%s: atomic handler rolled back, the lease "
                "was lost and the job belongs to another attempt",
                entry.ctx.id,
                entry.ctx.name,
                entry.ctx.attempt,
            )
        elif entry.given_up and not at_timeout:
            return  # timed out, lost or released: that attempt's end is already written
        elif kind == "success":
            self.succeed(entry, outcome.result, duration=duration)
        elif kind == "cancelled":
            self.cancel(entry, duration=duration)
        elif kind in ("snooze", "wait"):
            with self._lock:
                self._failed.append(_Failure(entry, None, outcome.delay, snooze=outcome))
            self.on_ready()
        else:
            self.fail(
                entry,
                outcome.error,
                delay=outcome.delay,
                dead=kind == "dead",
                unknown_type=kind == "unknown",
                duration=duration,
            )

    # -- called by the claim loop --------------------------------------------------------------
    def pending(self):
        """Outcomes not written yet, those put off for a locked row included."""
        with self._lock:
            return len(self._done) + len(self._failed) + len(self._later)

    def ready(self):
        """Outcomes to write now (not those put off for a locked row until ``next_due()``)."""
        with self._lock:
            return len(self._done) + len(self._failed)

    def next_due(self):
        """When the soonest outcome put off for a locked row is tried again, or None."""
        with self._lock:
            return min((later.due for later in self._later), default=None)

    def full(self):
        with self._lock:
            return len(self._done) >= self.batch or bool(self._failed)

    def pending_keys(self):
        """``(id, token)`` of every buffered outcome: their leases must be kept until written."""
        with self._lock:
            return (
                [e.key for e, _, _ in self._done]
                + [f.entry.key for f in self._failed]
                + [later.entry.key for later in self._later]
            )

    def pending_outcomes(self):
        """``[(entry, outcome)]`` of every buffered outcome, for a restart in place to hand to
        the new image (restart.held_runs): ``["done", result]``, ``["failed", error, delay,
        dead]`` for a plain failure, ``["spent"]`` for the rest (a cancelled end, a snooze or
        wait, an unknown type: the new image writes the attempt as spent)."""
        with self._lock:
            done, failed = list(self._done), list(self._failed)
            for later in self._later:
                (done if later.kind == "done" else failed).append(later.item)
        outcomes = [(entry, ["done", result]) for entry, result, _ in done]
        for f in failed:
            plain = f.error is not None and f.snooze is None and not f.unknown_type
            outcomes.append((f.entry, ["failed", f.error, f.delay, f.dead] if plain else ["spent"]))
        return outcomes

    def flush_once(self, db):
        """Write what is buffered on ``db``. Returns the number of outcomes written.

        Raises the connection error when the database is gone; nothing is lost then: the
        buffer keeps it all for the next call.
        """
        self._take_due(time.monotonic())
        with self._lock:
            done, self._done = self._done, []
            failed, self._failed = self._failed, []
        written = 0
        try:
            if done:
                written += self._write_done(db, done)
                done = []
            while failed:
                if self._write_failure(db, failed[0]):
                    written += 1
                failed.pop(0)
        except DB_ERRORS:
            with self._lock:
                self._done[:0] = done
                self._failed[:0] = failed
            raise
        if self._tries:  # forget the counts of outcomes put off once and written since
            keys = set(self.pending_keys())
            self._tries = {key: n for key, n in self._tries.items() if key in keys}
        return written

    def _take_due(self, now):
        """Put the outcomes put off for a locked row whose time came back in the buffer."""
        with self._lock:
            if not self._later or min(later.due for later in self._later) > now:
                return
            due = [later for later in self._later if later.due <= now]
            self._later = [later for later in self._later if later.due > now]
            for later in due:
                if later.kind == "done":
                    self._done.append(later.item)
                else:
                    self._failed.append(later.item)
                self._tries[later.entry.key] = later.tries

    def _put_off(self, kind, item, why):
        """Write ``item`` again later: its job's row was locked by another transaction."""
        later = _Later(0.0, kind, item)
        later.tries = self._tries.pop(later.entry.key, 0) + 1
        tries = later.tries
        later.due = time.monotonic() + min(self.BUSY_MOST, self.BUSY_FIRST * 2 ** (tries - 1))
        with self._lock:
            self._later.append(later)
            self.busy += 1
        if tries == 1:
            ctx = later.entry.ctx
            logger.warning(
                "dbqueue job=%s type=%s attempt=%s: its row is locked by another transaction "
                "(%s); its %s is written once that ends, meanwhile the worker goes on",
                ctx.id,
                ctx.name,
                ctx.attempt,
                why,
                "completion" if kind == "done" else "outcome",
            )

    # -- writes --------------------------------------------------------------------------------
    def take_done(self):
        """The buffered successes, to write along with a claim (``done_statement``); give them
        back with ``restore_done`` when that fails."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def restore_done(self, done):
        with self._lock:
            self._done[:0] = done

    def done_statement(self, done):
        # In id order, like the heartbeat, so the two never lock the same rows in opposite orders.
        acks = sorted((e.ctx.id, e.token, r) for e, r, _ in done)
        return store.complete_statement(acks, async_commit=self.async_commit)

    def _write_done(self, db, done):
        try:
            matched = store.completed_endings(db.execute(*self.done_statement(done)))
        except BUSY_ERRORS:
            # A wait inside the statement ran out. The statement locks the rows it changes with
            # SKIP LOCKED first, the workflow dependents included (store DEPENDENTS_FREE), so
            # this is the rare race that escapes it (a dependent linked after its snapshot). Not
            # narrowed down job by job, which would wait lock_timeout again for each one on the
            # worker's only connection: the whole batch is put off and written again shortly,
            # by the same statement, which then leaves out what is still held.
            for item in done:
                self._put_off("done", item, "a dependent's row")
            return 0
        except DB_ERRORS:
            raise
        except Exception:
            if len(done) == 1:
                entry = done[0][0]
                logger.exception(
                    "dbqueue could not acknowledge job=%s type=%s attempt=%s; the sweeper will "
                    "take it back when its lease expires",
                    entry.ctx.id,
                    entry.ctx.name,
                    entry.ctx.attempt,
                )
                return 0
            # Narrow it down to the write the database refuses; the others go through.
            logger.exception(
                "dbqueue could not acknowledge %d jobs; writing them one by one", len(done)
            )
            written = 0
            for item in done:
                written += self._write_done(db, [item])
            return written
        return self.report_done(db, done, matched)

    def report_done(self, db, done, matched):
        """Count and signal the successes written; read back the ones the write did not match.

        ``matched``: ``{id: None}`` per job written done, ``{id: who}`` per job that ended
        cancelled (``store.completed_endings``)."""
        missing = [e for e, _, _ in done if e.ctx.id not in matched]
        busy = set()
        if missing:
            for job_id, state in self._read_back(db, missing, "done", "cancelled", "running"):
                if state == "running":
                    busy.add(job_id)  # still ours: its row was locked, passed over
                else:
                    matched[job_id] = None if state == "done" else ""
        for item in done:
            entry, _, duration = item
            if entry.ctx.id in busy:
                self._put_off("done", item, "the completion passed it over")
            elif entry.ctx.id not in matched:
                self._fenced(entry, "completion")
            elif matched[entry.ctx.id] is not None:
                self._report_cancelled(entry.ctx, matched[entry.ctx.id], None, duration)
            else:
                self.succeeded += 1
                self._signal(signals.job_succeeded, entry.ctx, duration=duration)
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "dbqueue succeeded job=%s type=%s attempt=%s",
                    entry.ctx.id,
                    entry.ctx.name,
                    entry.ctx.attempt,
                )
        return len(matched)

    def _read_back(self, db, entries, *states):
        """``[(id, state)]`` of the ``entries`` whose row still carries this run's token, in
        one of ``states`` (this run's own write; "running": not written yet)."""
        rows = store.read_back(db, [e.ctx.id for e in entries])
        return [
            (e.ctx.id, rows[e.ctx.id][0])
            for e in entries
            if rows.get(e.ctx.id, (None, None))[1] == e.token and rows[e.ctx.id][0] in states
        ]

    def _write_failure(self, db, failure):
        entry, ctx = failure.entry, failure.entry.ctx
        cancelled_by = None
        try:
            if failure.cancelled:
                cancelled_by = store.end_cancelled(db, job_id=ctx.id, token=entry.token)
                state = None if cancelled_by is None else "cancelled"
            elif failure.snooze is not None:
                return self._write_snooze(db, failure)
            elif failure.unknown_type:
                state = store.defer_unknown_type(
                    db,
                    job_id=ctx.id,
                    token=entry.token,
                    error=failure.error,
                    delay=self.unknown_type_delay,
                    grace=self.unknown_type_grace,
                )
            else:
                state, cancelled_by = store.fail_job(
                    db,
                    job_id=ctx.id,
                    token=entry.token,
                    error=failure.error,
                    delay=failure.delay,
                    dead=failure.dead,
                ) or (None, None)
        except BUSY_ERRORS:
            # A wait inside the statement (a trigger locking a workflow dependent's row) ran out.
            self._put_off("failed", failure, "a dependent's row")
            return False
        except DB_ERRORS:
            raise
        except Exception:
            failure.tries += 1
            logger.exception(
                "dbqueue could not record the failure of job=%s type=%s attempt=%s (try %d)",
                ctx.id,
                ctx.name,
                ctx.attempt,
                failure.tries,
            )
            if failure.tries >= self.MAX_OTHER_ERRORS:
                logger.error(
                    "dbqueue gave up recording the failure of job=%s type=%s attempt=%s; the "
                    "sweeper will take it back when its lease expires",
                    ctx.id,
                    ctx.name,
                    ctx.attempt,
                )
                return False
            with self._lock:
                self._failed.append(failure)
            return False
        if state is None:
            rows = store.read_back(db, [ctx.id])
            state, token = rows.get(ctx.id, (None, None))
            if token == entry.token and state == "running" and not failure.unknown_type:
                # Still ours: the statement passed its locked row over (SKIP LOCKED).
                self._put_off("failed", failure, "the write passed it over")
                return False
            if token != entry.token or state not in ("pending", "dead", "cancelled"):
                self._fenced(entry, "failure")
                return False
        self._report_failure(failure, state, cancelled_by)
        return True

    def _write_snooze(self, db, failure):
        """A snooze or a durable wait: back to pending without spending the attempt. A snooze
        past ``max_snoozes`` is written as a failed attempt (``SnoozeLimit``) instead."""
        entry, ctx, o = failure.entry, failure.entry.ctx, failure.snooze
        row = store.snooze(
            db,
            job_id=ctx.id,
            token=entry.token,
            until=o.until,
            delay=o.delay,
            counts=o.kind == "snooze",
            limit=self.max_snoozes,
            reason=o.reason,
            seen=o.seen,
        )
        if row is None:
            state, token = store.read_back(db, [ctx.id]).get(ctx.id, (None, None))
            if token != entry.token or state != "running":
                self._fenced(entry, "snooze")
                return False
            # Still running under this run: past MAX_SNOOZES. A failed attempt, so that a job
            # that snoozes for ever ends in the dead letters, where a person sees it.
            failure.snooze = None
            failure.error = {
                "attempt": ctx.attempt,
                "class": "SnoozeLimit",
                "message": f"the job snoozed {self.max_snoozes} times (MAX_SNOOZES); this "
                "snooze counts as a failed attempt",
                "traceback": "",
                "worker": self.worker_id,
            }
            return self._write_failure(db, failure)
        state, run_after, cancelled_by, due_in = row
        if state == "cancelled":
            self._report_cancelled(ctx, cancelled_by or "", None, failure.duration)
            return True
        # The job comes due again then: the loop claims at that time, not at its next poll.
        due = time.monotonic() + max(0.0, due_in)
        self.next_retry = due if self.next_retry is None else min(self.next_retry, due)
        with self._lock:
            self.snoozed += 1
        logger.info(
            "dbqueue %s job=%s type=%s attempt=%s until %s (the attempt is not spent)",
            "snoozed" if o.kind == "snooze" else f"job waits ({o.reason})",
            ctx.id,
            ctx.name,
            ctx.attempt,
            run_after,
        )
        return True
