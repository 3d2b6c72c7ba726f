"""The worker's periodic duties, each when it is due: the watchdog (runs past their timeout),
the heartbeat, the worker registry's row (presence.py), the sweeper, the scheduler and the
status line.

The claim loop calls ``run_due()`` once per turn, and sleeps no longer than ``deadline()``. The
heartbeat and the watchdog run on the loop's own connection and let a lost connection reach the
loop (which reconnects); the others are ``guarded``: one that fails is logged and tried again at
its next interval, and never stops claiming.
"""

import logging
import time

from . import store
from .connections import BUSY_ERRORS, DB_ERRORS
from .rollup import INTERVAL as ROLLUP_INTERVAL

logger = logging.getLogger("django_dbqueue")


class Maintenance:
    WATCH_INTERVAL = 1.0  # seconds between the watchdog's looks at running jobs

    def __init__(self, worker):
        self.worker = worker
        now = time.monotonic()
        conf = worker.conf
        self.next = {
            "beat": now + conf.HEARTBEAT_INTERVAL,
            "presence": now,  # at start, then with each heartbeat
            "watch": now + self.WATCH_INTERVAL,
            "sweep": now,
            "schedule": now,
            "rollup": now,
            "status": now + (conf.STATUS_INTERVAL or 0),
        }
        self.last_counts = (0, 0, 0)

    def deadline(self):
        """When the next duty is due (``time.monotonic()``)."""
        w = self.worker
        # The scheduler runs whether or not DBQUEUE["SCHEDULE"] has entries: an entry may be
        # stored in the database at any time (one plain SELECT per SCHEDULE_INTERVAL).
        due = [self.next["beat"], self.next["presence"], self.next["sweep"], self.next["schedule"]]
        if w.inflight.occupied():
            due.append(self.next["watch"])
        return min(due)

    def watch_and_beat(self):
        """The watchdog and the heartbeat alone (while stopping)."""
        w, now = self.worker, time.monotonic()
        if now >= self.next["watch"]:
            self.next["watch"] = now + self.WATCH_INTERVAL
            w.heartbeat.check_timeouts()
        if now >= self.next["beat"]:
            w.heartbeat.beat_once(w.session)
            self.next["beat"] = now + w.conf.HEARTBEAT_INTERVAL
        if now >= self.next["presence"]:
            self.next["presence"] = self.next["beat"]
            w.presence.announce_once(w.session)  # says "stopping" now

    def run_due(self):
        """Heartbeat, watchdog, sweeper, scheduler and status line, each when it is due."""
        w = self.worker
        now = time.monotonic()
        nxt = self.next
        if now >= nxt["watch"]:
            nxt["watch"] = now + self.WATCH_INTERVAL
            w.heartbeat.check_timeouts()
        if now >= nxt["beat"]:
            w.heartbeat.beat_once(w.session)  # a lost connection goes to the loop
            nxt["beat"] = now + w.conf.HEARTBEAT_INTERVAL
        # Each of these on its own: one that fails is logged and tried again at its next
        # interval, and never stops claiming. The registry's row is one of them: it is for
        # people to see, and never holds up the leases.
        if now >= nxt["presence"]:
            nxt["presence"] = nxt["beat"]  # with the heartbeat: one wake-up for both
            self.guarded("worker registry", w.presence.announce_once, w.session)
        if now >= nxt["sweep"]:
            nxt["sweep"] = now + w.conf.SWEEP_INTERVAL
            self.guarded("sweep", w.sweeper.run_once)
        if now >= nxt["schedule"]:
            nxt["schedule"] = now + w.conf.SCHEDULE_INTERVAL
            self.guarded("scheduler", w.scheduler.run_once, w.session)
        if now >= nxt["rollup"]:
            nxt["rollup"] = now + ROLLUP_INTERVAL
            self.guarded("rollup", w.rollup.run_once)
        if w.conf.STATUS_INTERVAL and now >= nxt["status"]:
            nxt["status"] = now + w.conf.STATUS_INTERVAL
            self.last_counts = (
                self.guarded("status", self.status_line, self.last_counts) or self.last_counts
            )

    def guarded(self, what, func, *args):
        """Run one maintenance task; a failure is logged and left to its next interval."""
        w = self.worker
        try:
            return func(*args)
        except BUSY_ERRORS as exc:
            # Another transaction held what it needed past the session's lock_timeout: the
            # connection is fine, and the next interval tries again.
            logger.warning(
                "dbqueue %s waited too long for a lock (%s); trying again later", what, exc
            )
        except DB_ERRORS as exc:
            w._lost_connection()
            logger.warning("dbqueue %s failed, the database connection was lost (%s)", what, exc)
        except Exception:
            w._lost_connection()
            logger.exception("dbqueue %s failed; trying again at its next interval", what)
        return None

    def status_line(self, last):
        """Print one summary line when anything happened since the last one."""
        w = self.worker
        counts = (w.acks.succeeded, w.acks.failed + w.acks.dead, w.claimed_total)
        if counts == last:
            return counts
        elapsed = max(1e-6, w.conf.STATUS_INTERVAL)
        depth = store.count_due(w.session, w.queues)
        w.out(
            f"dbqueue worker {w.worker_id}: {(counts[0] - last[0]) / elapsed:.1f} done/s, "
            f"{(counts[1] - last[1]) / elapsed:.1f} failed/s, {depth if depth < 10000 else '10000+'} "
            f"due in {','.join(w.queues)}, {len(w.inflight)} in flight"
        )
        return counts
