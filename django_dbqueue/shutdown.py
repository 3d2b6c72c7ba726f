"""Stopping a worker: hand back what has not started, give running handlers their grace
period, write every outcome, then release what is still running (except the runs that must not
overlap a second one: those stay claimed until their lease expires after the process is gone).
Outcomes always go first: a job that finished is written as finished, never handed back to run
again.

After ``burst`` or ``max_jobs`` everything claimed is let finish; after a signal or a fatal error
(``Worker.fatal``) the graceful stop below applies.
"""

import logging
import os
import signal
import time

from django.db import connections

from . import store
from .connections import BUSY_ERRORS, DB_ERRORS, OTHER_DB_ERRORS

logger = logging.getLogger("django_dbqueue")

EXIT_GAVE_UP = 3  # the worker gave up (Worker.fatal): "restart me"


def quiet_tick(w, wait):
    """While shutting down: keep writing outcomes, renewing leases and watching timeouts."""
    try:
        if w._reconnected:
            w.session.reset()
            w._reconnected = False
        w._take_notifies()  # a cancel asked for during the grace period reaches its handler
        w.acks.flush_once(w.session)
        w.maintenance.watch_and_beat()
    except DB_ERRORS as exc:
        logger.warning("dbqueue worker %s: database lost while stopping (%s)", w.worker_id, exc)
        w.session.reset()
    except OTHER_DB_ERRORS:
        logger.exception("dbqueue worker %s: database error while stopping", w.worker_id)
        w.session.reset()
    w._sleep(wait)  # on the session's socket too, when it LISTENs
    w._wakeup.clear()


def release(w, entries, why):
    """Hand ``entries`` back without spending their attempts, after writing every outcome
    already buffered; retried through a lost connection. Returns the entries not handed back
    because another transaction holds their rows (``retry_release`` tries them again). A job
    whose cancel was asked for is not handed back: it ends cancelled (sql.RELEASE_JOBS)."""
    held = {e.key: e for e in entries}
    for attempt in range(5):
        try:
            # Outcomes first: a job that finished is written as finished, not handed back.
            w.acks.flush_once(w.session)
            ended, busy = store.hand_back(w.session, list(held))
        except BUSY_ERRORS:
            ended, busy = {}, {key[0] for key in held}  # a trigger waited: all of them again
        except DB_ERRORS as exc:
            w.session.reset()
            logger.warning("dbqueue could not release %d jobs (%s)", len(held), exc)
            time.sleep(0.2 * (attempt + 1))
            continue
        for entry in entries:
            if entry.ctx.id in ended:
                logger.info(
                    "dbqueue %s job=%s type=%s attempt=%s (%s)",
                    "released" if ended[entry.ctx.id] == "pending" else "cancelled",
                    entry.ctx.id,
                    entry.ctx.name,
                    entry.ctx.attempt,
                    why,
                )
        left = [(entry, why) for entry in entries if entry.ctx.id in busy]
        if left:
            logger.warning(
                "dbqueue worker %s: %d jobs to hand back are locked by another transaction; "
                "trying again until the worker exits: %s",
                w.worker_id,
                len(left),
                sorted(entry.ctx.id for entry, _ in left),
            )
        return left
    return []


def retry_release(w, left):
    """Try again to hand back ``left`` (``[(entry, why)]`` from ``release``); returns what is
    still locked. Their rows' transactions may end at any time: the stop waits for them as
    long as it waits for anything else."""
    still = []
    for why in dict.fromkeys(why for _, why in left):
        still += release(w, [entry for entry, reason in left if reason == why], why)
    return still


def _being_killed(w):
    """Runs past their timeout whose child process is being killed: their failures are written
    once the child is dead, a moment from now (in thread mode such a run may never end)."""
    return w.pool.kills_at_timeout and w.inflight.past_timeout()


def shut_down(w):
    """Stop: after a signal, release unstarted jobs and give running ones the grace period;
    after ``burst`` or ``max_jobs``, let everything claimed finish."""
    # A signal during this wait switches to the graceful stop below (grace, then release).
    while not w._releasing and (w.inflight.occupied() or _being_killed(w)):
        quiet_tick(w, 0.05)
    w.stopping.set()
    w.maintenance.next["presence"] = 0.0  # the registry shows "stopping" at the next tick
    w.waiting.release()  # no more claims: enqueues need not wake us
    unstarted = w.inflight.release_unstarted()
    left = []  # jobs to hand back whose rows another transaction holds: tried again meanwhile
    if unstarted:
        left = release(w, unstarted, "not started before the stop")
        for entry in unstarted:
            w.finished(entry)
    deadline = time.monotonic() + w.conf.SHUTDOWN_GRACE
    while (w.inflight.occupied() or _being_killed(w)) and time.monotonic() < deadline:
        quiet_tick(w, min(0.05, max(0.0, deadline - time.monotonic())))
        left = retry_release(w, left) if left else left
    # Process mode kills every run's child below, before its job goes back: nothing need stay.
    remaining, kept = w.inflight.release_all(runs_are_killed=w.pool.kills_at_timeout)
    if remaining:
        logger.warning(
            "dbqueue worker %s: %d jobs still running after %gs grace; releasing them",
            w.worker_id,
            len(remaining),
            w.conf.SHUTDOWN_GRACE,
        )
        # Process mode: their handler processes are killed first, and gone before the jobs go
        # back (a child that ignores SIGTERM must not run on while its job runs elsewhere).
        w.pool.end_runs(remaining)
        left += release(w, remaining, "still running after the grace period")
    if kept:
        # Handed back now, such a job could start again elsewhere while this process (and the
        # thread in it) still runs it: past its fleet-wide limit, beside its serial key's
        # next job. It stays `running`; its outcome is written should its run end before the
        # process exits, or else the sweeper takes it back when its lease expires, after
        # this process (and the run) is gone.
        logger.warning(
            "dbqueue worker %s: %d jobs still running after %gs grace are not handed back "
            "(a fleet-wide limit or a serial key counts them, or they are past their "
            "timeout); the sweeper takes them back when their leases expire: %s",
            w.worker_id,
            len(kept),
            w.conf.SHUTDOWN_GRACE,
            sorted(entry.ctx.id for entry in kept),
        )
    w.pool.stop(timeout=0.5)
    # Whatever finished meanwhile: written, with retries through a lost connection.
    deadline = time.monotonic() + max(5.0, w.conf.SHUTDOWN_GRACE)
    while (w.acks.pending() or _being_killed(w) or left) and time.monotonic() < deadline:
        quiet_tick(w, 0.05)
        left = retry_release(w, left) if left else left
    if left:
        # Their leases expire after this process is gone, and the sweeper takes them back
        # then: that attempt counts, although the run may never have started here.
        logger.error(
            "dbqueue worker %s: %d jobs could not be handed back, another transaction still "
            "holds their rows: %s",
            w.worker_id,
            len(left),
            sorted(entry.ctx.id for entry, _ in left),
        )
    if w.acks.pending():
        logger.error(
            "dbqueue worker %s: %d outcomes could not be written before exiting; their "
            "jobs will be swept and run again",
            w.worker_id,
            w.acks.pending(),
        )
    w.stopped.set()
    for helper in (w.listener, w.waker):
        if helper is not None:
            helper.join(1.0)
    leave_registry(w)
    w.session.close()
    w._wakeup.close()
    connections[w.using].close()
    logger.info(
        "dbqueue worker %s stopped: %d succeeded, %d retried, %d dead, %d fenced; "
        "%d claims (%d empty)",
        w.worker_id,
        w.acks.succeeded,
        w.acks.failed,
        w.acks.dead,
        w.acks.fenced,
        w.claims,
        w.empty_claims,
    )


def leave_registry(w):
    """Gone from the worker registry at once; or, when the worker gave up and its command
    restarts it in place (``w.restarts_in_place``), shown ``restarting`` until the new image
    announces itself: the jobs whose runs and outcomes it hands over (restart.held_runs) must
    not look like a dead worker's to the sweepers in between (presence.Presence.restarting)."""
    from .restart import expected_within

    if w.exit_code == EXIT_GAVE_UP and w.restarts_in_place:
        w.presence.restarting(w.session, expected_within())
    else:
        w.presence.withdraw(w.session)


def install_signal_handlers(w):
    """SIGTERM and SIGINT ask ``w`` to stop gracefully (``Worker.stop`` from the loop's thread);
    a second signal exits at once."""

    def handle(signum, frame):
        w._signals += 1
        if w._signals > 1:
            logger.warning("dbqueue worker %s: second signal, exiting at once", w.worker_id)
            os._exit(1)
        logger.warning(
            "dbqueue worker %s: %s received, finishing running jobs (grace %gs)",
            w.worker_id,
            signal.Signals(signum).name,
            w.conf.SHUTDOWN_GRACE,
        )
        # Plain attributes and the lock-free wake-up flag only: the handler runs on the
        # loop's thread, which may hold a lock of threading.Event's at this instant. The
        # loop turns the request into ``stopping`` (_stop_requested).
        w._releasing = True
        w._stop_signalled = True
        w._wakeup.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
