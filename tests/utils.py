"""Helpers shared by the test suites: waiting on conditions (never fixed sleeps), factories."""

import json
import time

from django.db import connection


def wait_until(predicate, *, timeout=10.0, interval=0.01, message="condition"):
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def job_row(job_id):
    """The job's columns as a dict, read with plain SQL (no ORM caching)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM dbqueue_job WHERE id = %s", [job_id])
        columns = [c.name for c in cursor.description]
        row = cursor.fetchone()
    if not row:
        return None
    values = dict(zip(columns, row, strict=True))
    for name in ("payload", "errors", "result"):  # Django reads jsonb as text on raw cursors
        if isinstance(values[name], str):
            values[name] = json.loads(values[name])
    return values


def scalar(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def run_concurrently(count, func, *, timeout=30):
    """Run ``func()`` on ``count`` threads released together by a barrier, each with its own
    database connection (closed afterwards); re-raise the first error; return the results."""
    import threading

    from django.db import connections

    barrier = threading.Barrier(count)
    results, errors = [], []

    def run():
        try:
            barrier.wait(timeout)
            results.append(func())
        except BaseException as exc:  # re-raised on the test's thread below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), "a thread did not finish in time"
    if errors:
        raise errors[0]
    return results


class Listener:
    """A plain psycopg connection LISTENing on the default channel, as a worker does, to see
    exactly what workers would see. By default it also says that it waits for wake-ups on
    ``queues`` (default: every queue of the settings; waiters.hold), as an idle worker does:
    without that, enqueues send none. ``slots``: also LISTEN on the channels of these wake-up
    slots of the ``default`` queue (migration 0014), where named wake-ups go; ``main=False``:
    not on the main channel."""

    def __init__(self, queues=None, *, waits=True, slots=(), main=True):
        import psycopg

        from django_dbqueue import waiters
        from django_dbqueue.conf import get_settings
        from django_dbqueue.connections import connection_params

        queues = list(get_settings().QUEUES) if queues is None else queues

        self.conn = psycopg.connect(**connection_params("default"), autocommit=True)
        if main:
            self.conn.execute("LISTEN dbqueue")
        for slot in slots:
            name = self.conn.execute(
                "SELECT dbqueue_slot_channel('dbqueue', 'default', %s)", [slot]
            ).fetchone()[0]
            self.conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(name)))
        self.got = []
        if waits:
            assert waiters.hold(self.conn, queues)

    def drain(self, timeout):
        """What arrived so far, waiting up to ``timeout`` seconds for the first of it."""
        import select

        got = []
        select.select([self.conn.fileno()], [], [], timeout)
        self.conn.pgconn.consume_input()
        while (n := self.conn.pgconn.notifies()) is not None:
            got.append(n.extra.decode())
        return got

    def collect(self, timeout):
        """Read what arrives within ``timeout`` seconds (all of it: nothing is left behind)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            self.got.extend(self.drain(left))
        return self.got

    def until_jobs(self, count, timeout=5.0):
        """Read until the payloads' counts add up to ``count`` jobs; fail after ``timeout``."""
        from django_dbqueue.notifications import parse_wakeup

        wait_until(
            lambda: sum(parse_wakeup(p)[1] for p in self.collect(0.01)) >= count,
            timeout=timeout,
            message=f"wake-ups for {count} jobs (got {self.got})",
        )
        return self.got

    def close(self):
        self.conn.close()


WAKEUP_WAITERS = """
SELECT array_agg(l.pid ORDER BY l.pid) FROM pg_locks AS l
WHERE l.locktype = 'advisory' AND l.classid = %s AND l.objsubid = 2 AND l.mode = 'ShareLock'
  AND l.granted AND l.objid = (hashtext(%s)::bigint & 4294967295)::oid
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


WAKEUP_SLOTS = """
SELECT s.slot, l.pid
FROM generate_series(0, %(slots)s - 1) AS s (slot)
CROSS JOIN LATERAL (SELECT hashtextextended(%(name)s, s.slot) AS k) AS h
JOIN pg_locks AS l
  ON l.locktype = 'advisory' AND l.objsubid = 1 AND l.mode = 'ExclusiveLock' AND l.granted
 AND l.classid = ((h.k >> 32) & 4294967295)::oid AND l.objid = (h.k & 4294967295)::oid
 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def wakeup_slots(queue="default", channel="dbqueue"):
    """``{slot: backend pid}`` of the wake-up slots held on ``queue`` (waiters.py)."""
    from django.db import connection

    from django_dbqueue.store import wakeups

    with connection.cursor() as cursor:
        cursor.execute(WAKEUP_SLOTS, {"slots": wakeups.WAKEUP_SLOTS, "name": f"{channel}:{queue}"})
        return dict(cursor.fetchall())


def wakeup_waiters(queue="default"):
    """Backend pids that say they wait for wake-ups on ``queue`` (waiters.py)."""
    from django_dbqueue.store import wakeups as sql

    return set(scalar(WAKEUP_WAITERS, [sql.WAITING_LOCK, queue]) or ())
