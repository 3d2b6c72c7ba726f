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
