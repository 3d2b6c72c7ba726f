"""The dashboard's rollup: once a minute, one worker samples the queues' depth and counts the jobs
that finished since the last sample, into two small tables (``dbqueue_depth``,
``dbqueue_finished``) that the admin's queue dashboard reads.

Why a rollup at all (docs/observability.md#the-dashboard): the job table has no history of its
depth, and counting every finished job of the last 24 hours on each page load reads hundreds of
thousands of rows. The rollup reads one minute of finished rows per pass, through the finished
index, and keeps its counts after retention deletes the jobs.

Every worker calls ``run_once()`` every ``INTERVAL`` seconds; the first to come in a new minute
does the work, the others find it done with one index probe (see ``ROLLUP_MINUTE`` in
store/dashboard.py).
"""

import logging

from . import store
from .conf import get_settings

logger = logging.getLogger("django_dbqueue")

INTERVAL = (
    15.0  # seconds between a worker's passes: each minute is sampled within 15 s of its start
)
KEEP = 25 * 3600.0  # seconds a rollup row is kept: the dashboard's longest window and a margin
CATCH_UP = 24 * 3600.0  # seconds of finished jobs counted when there is no earlier sample
PRUNE_BATCH = 5000  # rollup rows deleted per table and pass

# Upper bounds (seconds) of the wait histogram's bins: bin 0 is below 10 ms, bin i is
# [WAIT_BOUNDS[i-1], WAIT_BOUNDS[i]), the last bin is an hour or more (PostgreSQL's width_bucket).
WAIT_BOUNDS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip


class Rollup:
    def __init__(self, using=None, *, conf=None, db=None):
        self.conf = conf or get_settings()
        self.using = using or self.conf.DATABASE
        # Like the sweeper: the alias, or inside a worker its own Session.
        self.db = db if db is not None else self.using

    def run_once(self):
        """One pass. Returns ``{"sampled": n, "rolled": n, "pruned": n}``; all 0 when another
        worker has done this minute."""
        sampled, rolled = store.rollup_minute(
            self.db, queues=list(self.conf.QUEUES), bounds=WAIT_BOUNDS, catch_up=CATCH_UP
        )
        pruned = store.prune_rollup(self.db, age=KEEP, limit=PRUNE_BATCH) if sampled else 0
        if rolled or pruned:
            logger.debug(
                "dbqueue rollup: %d queue(s) sampled, %d minute row(s) written, %d pruned",
                sampled,
                rolled,
                pruned,
            )
        return {"sampled": sampled, "rolled": rolled, "pruned": pruned}
