"""What the tests of callers' transactions share (tests/integration/test_held_rows.py,
test_held_limits.py, test_review_held_waits.py): a caller's transaction on a connection of its
own that holds rows of ours, the worker's Session counting the waits its lock_timeout ended,
and a stand-in for a run the worker has in flight (what the acknowledger reads of one)."""

import psycopg

from django_dbqueue.connections import BUSY_ERRORS, Session, connection_params


class Caller:
    """A caller's transaction holding the rows ``sql`` selects (with its ``FOR ...`` clause)
    until ``commit()``; it must select something."""

    def __init__(self, sql, params):
        self.conn = psycopg.connect(**connection_params("default"))
        assert self.conn.execute(sql, params).fetchall(), "nothing to hold"

    def commit(self):
        self.conn.commit()
        self.conn.close()

    def rollback(self):
        if not self.conn.closed:
            self.conn.rollback()
            self.conn.close()


class CountingSession(Session):
    """The worker's Session, counting the statements that waited for a lock until its
    lock_timeout ended them (each one held the worker's only connection that long)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lock_waits = 0

    def execute(self, statement, params):
        try:
            return super().execute(statement, params)
        except BUSY_ERRORS:
            self.lock_waits += 1
            raise


def worker_session():
    """The worker's own connection, with the lock_timeout a worker sets: a statement that
    waited for a held row fails with LockNotAvailable after 0.2 s instead of hanging."""
    return CountingSession("default", lock_timeout=0.2, track_backend=True)


class _Ctx:
    def __init__(self, job_id):
        self.id, self.type, self.name, self.queue = job_id, "record", "record", "default"
        self.attempt, self.max_attempts = 1, 3


class Entry:
    """A run in flight, as the acknowledger reads it."""

    def __init__(self, job_id, token):
        self.ctx, self.token = _Ctx(job_id), token
        self.given_up = False

    @property
    def key(self):
        return (self.ctx.id, self.token)
