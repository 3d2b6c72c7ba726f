"""Awaited results: wait_for_result returns when the job finishes, woken by the notification of
the statement that finished it (the poll backstop is made too slow to matter here), raises a
named error for a dead or cancelled job, times out cleanly, and never holds a transaction open
while it waits."""

import asyncio
import contextlib
import threading
import time

import pytest
from django.db import connection, transaction

from django_dbqueue import (
    InvalidArgument,
    JobCancelled,
    JobFailed,
    JobNotFound,
    await_result,
    cancel,
    enqueue,
    results,
    wait_for_result,
)
from tests.utils import job_row, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def no_poll(monkeypatch):
    """Only a notification can wake the waiter within these tests' deadlines."""
    monkeypatch.setattr(results, "POLL_FIRST", 60.0)
    monkeypatch.setattr(results, "POLL_MAX", 60.0)


def test_a_success_wakes_the_waiter_by_notification(start_worker, no_poll):
    job = enqueue("record", {"sleep": 0.3})
    echo = enqueue("echo", {"answer": 42})
    start_worker()
    started = time.monotonic()
    assert wait_for_result(echo, timeout=20) == {"answer": 42}
    assert wait_for_result(job.id, timeout=20) is None
    assert time.monotonic() - started < 10  # not the 60 s poll
    assert job_row(job.id)["state"] == "done"


def test_a_dead_job_raises_its_last_error(start_worker, no_poll):
    job = enqueue("fail")  # max_attempts 3, BACKOFF_* tiny in the test settings
    start_worker()
    with pytest.raises(JobFailed, match="boom on attempt 3") as failed:
        wait_for_result(job, timeout=20)
    assert failed.value.job_id == job.id and failed.value.error["attempt"] == 3


def test_a_cancelled_job_raises_job_cancelled_found_by_the_poll():
    job = enqueue("noop")
    waiter = {}

    def wait():
        try:
            wait_for_result(job, timeout=20)
        except BaseException as exc:
            waiter["error"] = exc

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: _waiter_idle(), message="the waiter to be waiting, idle")
    cancel(job)  # a pending job: cancelled by a statement that does not notify; the poll sees it
    thread.join(20)
    assert isinstance(waiter["error"], JobCancelled)


def test_a_job_that_does_not_finish_in_time_raises_timeout_error():
    job = enqueue("noop")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"did not finish within 0\.3s"):
        wait_for_result(job, timeout=0.3)
    assert time.monotonic() - started < 5
    assert job_row(job.id)["state"] == "pending"  # nothing changed


def test_the_waiter_holds_no_transaction_while_it_waits():
    job = enqueue("noop")
    thread = threading.Thread(target=lambda: _ignore(wait_for_result, job, 3))
    thread.start()
    wait_until(lambda: _waiter_idle(), message="the waiter to be waiting, idle")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, backend_xid, backend_xmin FROM pg_stat_activity"
            " WHERE application_name = 'dbqueue result waiter'"
        )
        [(state, xid, xmin)] = cursor.fetchall()
    assert (state, xid, xmin) == ("idle", None, None)
    thread.join(10)


def test_bad_arguments_and_unknown_jobs_are_named():
    with pytest.raises(InvalidArgument, match="job_id must be a job id"):
        wait_for_result("7")
    with pytest.raises(InvalidArgument, match="timeout must be"):
        wait_for_result(1, timeout=-1)
    with pytest.raises(JobNotFound, match="no job #999999"):
        wait_for_result(999999, timeout=1)


def test_inside_the_atomic_that_enqueued_the_job_it_says_the_job_is_not_committed():
    """The waiter's own connection cannot see a job the caller's transaction has not
    committed: it used to say the job never existed. It says the truth now, at once, instead
    of waiting out a timeout for a job that cannot run before the caller's commit."""
    with transaction.atomic():
        job = enqueue("noop")
        started = time.monotonic()
        with pytest.raises(InvalidArgument) as caught:
            wait_for_result(job, timeout=30)
        assert time.monotonic() - started < 10
        message = str(caught.value)
        assert message.startswith(f"wait_for_result(): job #{job.id} is not committed yet"), message
        assert "cannot finish inside this transaction" in message
        assert "never existed" not in message
        # An unknown id inside a transaction is still unknown.
        with pytest.raises(JobNotFound, match="no job #999999"):
            wait_for_result(999999, timeout=1)
    assert job_row(job.id)["state"] == "pending"  # the caller's transaction was not harmed


def test_the_async_form_awaits_the_same_result(start_worker, no_poll):
    job = enqueue("echo", {"async": [1, 2]})
    start_worker()

    async def main():
        return await await_result(job, timeout=20)

    assert asyncio.run(main()) == {"async": [1, 2]}

    waiting = enqueue("noop", delay=3600)  # not due within the test

    async def times_out():
        await await_result(waiting, timeout=0.2)

    with pytest.raises(TimeoutError):
        asyncio.run(times_out())


def _waiter_idle():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = 'dbqueue result waiter' AND state = 'idle'"
        )
        return cursor.fetchone()[0] == 1


def _ignore(func, *args):
    with contextlib.suppress(TimeoutError):
        func(*args)


def test_a_batch_too_large_for_one_notification_says_look_again():
    """500 ids of 18 digits do not fit NOTIFY's 8000 bytes: the completion sends '*' and
    still commits (a payload too long would have failed it)."""
    import psycopg
    from django.db import connections

    from django_dbqueue import enqueue_many, store
    from django_dbqueue.connections import connection_params
    from django_dbqueue.store.completion import RESULT_LOCK

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence('dbqueue_job', 'id'), 100000000000000000)"
        )
    jobs = enqueue_many([("noop", {}) for _ in range(500)])
    ids = [job.id for job in jobs]
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET state = 'running', lease_token = 7, attempts = 1,"
            " leased_until = now() + interval '1 minute', worker_id = 'w'"
            " WHERE id = ANY(%s)",
            [ids],
        )
    params = connection_params("default")
    with psycopg.connect(**params, autocommit=True) as waiter:
        waiter.execute('LISTEN "dbqueue.done"')
        waiter.execute(f"SELECT pg_advisory_lock_shared({RESULT_LOCK})")
        assert store.complete("default", [(i, 7, None) for i in ids]) == set(ids)
        connections["default"].close()
        notes = list(waiter.notifies(timeout=5, stop_after=1))
    assert [n.payload for n in notes] == ["*"]
    assert job_row(ids[0])["state"] == "done"
    with connection.cursor() as cursor:  # the next tests' ids start low again
        cursor.execute("SELECT setval(pg_get_serial_sequence('dbqueue_job', 'id'), 1, false)")


def test_a_job_finishing_while_the_waiter_reads_it_is_heard_at_once(monkeypatch):
    """The notification of a completion that commits while the waiter's read runs arrives
    during that statement, where psycopg takes it off the socket: it is still heard, and the
    waiter reads again at once rather than at its next poll."""
    from django_dbqueue import store
    from tests.integration.test_steps import _hold

    monkeypatch.setattr(results, "POLL_FIRST", 30.0)
    monkeypatch.setattr(results, "POLL_MAX", 30.0)
    slow = "SELECT pg_sleep(0.5), * FROM (" + results.READ_RESULT.strip() + ") AS r"
    monkeypatch.setattr(results, "READ_RESULT", slow)
    monkeypatch.setattr(results, "_outcome", _slow_outcome)
    job = enqueue("noop")
    _hold(job.id, 7)
    waited = {}

    def wait():
        started = time.monotonic()
        waited["result"] = wait_for_result(job, timeout=20)
        waited["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=wait)
    thread.start()
    wait_until(lambda: _waiter_reading(), message="the waiter to be inside its slow read")
    assert store.complete("default", [(job.id, 7, '"ok"')]) == {job.id}  # commits mid-read
    thread.join(20)
    assert waited["result"] == "ok"
    assert waited["seconds"] < 10, waited  # not the 30 s poll


def _slow_outcome(conn, job_id):
    """results._outcome over the slowed read (its first column is pg_sleep's)."""
    import json

    _slept, state, result, *_ = conn.execute(results.READ_RESULT, [job_id]).fetchone()
    if state == "done":
        return True, None if result is None else json.loads(result)
    return False, None


def _waiter_reading():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
            "'dbqueue result waiter' AND query LIKE '%%pg_sleep%%' AND state = 'active'"
        )
        return cursor.fetchone()[0] == 1
