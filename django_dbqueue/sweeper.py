"""The sweeper: takes back jobs whose lease expired, prunes old finished jobs and forgets the
workers that stopped beating (presence.py). Runs inside every worker.

Each pass is bounded (``SWEEP_BATCH`` rows per statement, a few statements at most) and uses
SKIP LOCKED, so any number of workers can sweep at once: they split the expired rows between them
and never wait on each other. ``run_once()`` returns counts; the worker calls it every
``SWEEP_INTERVAL`` seconds.

An expired lease is taken back only when its worker is gone: its row in the worker registry is
stale or deleted (presence.py). A live worker renews every lease it holds except those of rows
another transaction locks, whose jobs it still runs; it takes back itself, in its own sweeps
(``owner``), the expired jobs of its own that it no longer holds (a run whose outcome it gave up
writing). docs/concepts/worker.md#callers-transactions.
"""

import logging

from . import signals, store
from .conf import get_settings

logger = logging.getLogger("django_dbqueue")


class Sweeper:
    MAX_ROUNDS = 10  # statements per pass; what is left waits for the next pass

    def __init__(self, using=None, *, conf=None, db=None, owner=None):
        self.conf = conf or get_settings()
        self.using = using or self.conf.DATABASE
        # Where the statements run: the alias (this thread's Django connection) or, inside a
        # worker, its own Session, so that sweeping costs the worker no extra connection.
        self.db = db if db is not None else self.using
        # Inside a worker: returns (its worker id, the lease tokens it holds), or None while it
        # cannot tell (Worker.own_jobs); its expired jobs that it does not hold are taken back.
        self.owner = owner

    def run_once(self):
        """One pass. Returns ``{"rescued": n, "dead": n, "cancelled": n, "pruned": n,
        "events_pruned": n, "workers_forgotten": n}``."""
        counts = self.rescue()
        counts["pruned"] = self.prune()
        counts["events_pruned"] = self.prune_events()
        counts["workers_forgotten"] = self.forget_workers()
        return counts

    def forget_workers(self):
        """Delete the registry rows of workers that stopped beating (presence.py)."""
        forgotten = store.forget_expired_workers(self.db)
        for worker_id, heartbeat_at in forgotten:
            logger.warning(
                "dbqueue worker %s left the worker registry: no heartbeat since %s (it was "
                "killed, hung or lost the database)",
                worker_id,
                heartbeat_at.isoformat(),
            )
        return len(forgotten)

    def prune(self):
        """Delete finished jobs past their retention (``DONE_RETENTION`` and friends)."""
        conf = self.conf
        pruned = 0
        for state, age in (
            ("done", conf.DONE_RETENTION),
            ("cancelled", conf.CANCELLED_RETENTION),
            ("dead", conf.DEAD_RETENTION),
        ):
            if age is None:
                continue
            for _ in range(self.MAX_ROUNDS):
                deleted = store.prune(self.db, state=state, age=age, limit=conf.SWEEP_BATCH)
                pruned += deleted
                if deleted < conf.SWEEP_BATCH:
                    break
        if pruned:
            logger.info("dbqueue pruned %d finished jobs past their retention", pruned)
        return pruned

    def prune_events(self):
        """Delete published events that no job refers to any more and that are older than
        ``DONE_RETENTION`` (kept forever when it is None): docs/events.md."""
        conf = self.conf
        if conf.DONE_RETENTION is None:
            return 0
        pruned = 0
        for _ in range(self.MAX_ROUNDS):
            deleted = store.prune_events(self.db, age=conf.DONE_RETENTION, limit=conf.SWEEP_BATCH)
            pruned += deleted
            if deleted < conf.SWEEP_BATCH:
                break
        return pruned

    def rescue(self):
        """Return expired leases to pending (or dead, or cancelled when a cancel was asked for).
        Returns ``{"rescued": n, "dead": n, "cancelled": n}``."""
        conf = self.conf
        counts = {"rescued": 0, "dead": 0, "cancelled": 0}
        own = self.owner() if self.owner is not None else None
        worker, known = own if own is not None else (None, ())
        for _ in range(self.MAX_ROUNDS):
            rows = store.rescue_expired(
                self.db,
                limit=conf.SWEEP_BATCH,
                base=conf.BACKOFF_BASE,
                factor=conf.BACKOFF_FACTOR,
                cap=conf.BACKOFF_CAP,
                worker=worker,
                known=known,
            )
            for job_id, job_type, attempts, state, worker, queue, cancelled_by, name in rows:
                if state == "cancelled":
                    counts["cancelled"] += 1
                    signals.send(
                        signals.job_cancelled,
                        job_type,
                        job_name=name,
                        job_id=job_id,
                        queue=queue,
                        attempt=attempts,
                        worker_id=worker,
                        duration=None,
                        cancelled_by=cancelled_by,
                        error={
                            "class": "LeaseExpired",
                            "message": "lease expired",
                            "traceback": "",
                        },
                    )
                    logger.warning(
                        "dbqueue swept job=%s type=%s attempt=%s to cancelled: its cancel was "
                        "asked for and its lease expired (worker %s)",
                        job_id,
                        name,
                        attempts,
                        worker,
                    )
                elif state == "dead":
                    counts["dead"] += 1
                    signals.send(
                        signals.job_dead,
                        job_type,
                        job_name=name,
                        job_id=job_id,
                        queue=queue,
                        attempt=attempts,
                        worker_id=worker,
                        duration=None,  # the run was never timed: its worker died or hung
                        error={
                            "class": "LeaseExpired",
                            "message": "lease expired",
                            "traceback": "",
                        },
                    )
                    logger.error(
                        "dbqueue swept job=%s type=%s attempt=%s to dead: lease expired (worker %s)",
                        job_id,
                        name,
                        attempts,
                        worker,
                    )
                else:
                    counts["rescued"] += 1
                    logger.warning(
                        "dbqueue swept job=%s type=%s attempt=%s back to pending: lease expired "
                        "(worker %s)",
                        job_id,
                        name,
                        attempts,
                        worker,
                    )
            if len(rows) < conf.SWEEP_BATCH:
                break
        return counts
