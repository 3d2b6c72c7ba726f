"""Durable waits and awaited results with a real ``run_jobqueue`` process: a job that sleeps an
hour holds no thread of a one-thread worker and resumes when its time is moved; signals sent
before and after the wait are each delivered once; ``wait_for_result`` in this process is woken
by the notification of the worker's completion (its poll made too slow to matter)."""

import datetime
import time

import pytest
from django.db import connection

from django_dbqueue import enqueue, results, signal_job, wait_for_result
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.acceptance.test_steps_kill import bodies
from tests.utils import job_row, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"


def wait_for(job_id, predicate, what, timeout=30):
    wait_until(lambda: predicate(job_row(job_id)), timeout=timeout, message=f"job {job_id} {what}")
    return job_row(job_id)


def waiting(row, reason):
    return row["state"] == "pending" and row["wait_reason"] == reason


def test_an_hour_s_sleep_holds_no_thread_and_resumes_when_its_time_comes(start_worker, settings):
    settings.DBQUEUE = FAST_DBQUEUE
    sleeper = enqueue("sleeper", {"seconds": 3600}).id
    start_worker("--concurrency", "1", settings=FAST)
    row = wait_for(sleeper, lambda r: waiting(r, "sleep:nap"), "asleep")
    assert row["attempts"] == 0  # a wait spends no attempt
    assert row["run_after"] > row["created_at"] + datetime.timedelta(minutes=59)
    other = enqueue("echo", {"meanwhile": True}).id  # the worker's one thread is free
    wait_for(other, lambda r: r["state"] == "done", "done while the sleeper sleeps")
    assert job_row(sleeper)["state"] == "pending"
    with connection.cursor() as cursor:  # move its time: the sleep's end and its due time
        cursor.execute(
            "UPDATE dbqueue_step SET result = jsonb_build_object('until', now() - interval '1 s')"
            " WHERE job_id = %s AND name = 'sleep:nap'",
            [sleeper],
        )
        cursor.execute("UPDATE dbqueue_job SET run_after = now() WHERE id = %s", [sleeper])
    row = wait_for(sleeper, lambda r: r["state"] == "done", "done after its sleep")
    assert row["attempts"] == 1
    got = bodies(sleeper)
    assert got[("before", "start")] == [1] and got[("after", "start")] == [1], got


@pytest.mark.parametrize("execution", ["thread", "process"])
def test_a_sleep_swallowed_by_except_base_exception_still_suspends_the_job(
    start_worker, settings, execution
):
    """A handler catches BaseException around ``ctx.sleep()`` and returns: the job must still
    sleep (pending, no attempt spent, due in an hour), not end done at once; once its time has
    come it runs again and the sleep returns. The code after the swallowed sleep did run on
    the first run: the run ends at the handler's return, as the worker cannot stop a thread."""
    settings.DBQUEUE = FAST_DBQUEUE
    job_id = enqueue("swallowing-sleeper", {"seconds": 3600}).id
    start_worker("--concurrency", "1", "--execution", execution, settings=FAST)
    row = wait_for(
        job_id,
        lambda r: waiting(r, "sleep:nap") or r["finished_at"] is not None or bool(r["errors"]),
        "asleep, or finished",
    )
    assert waiting(row, "sleep:nap"), row
    assert (row["attempts"], row["errors"], row["result"]) == (0, [], None)
    assert row["run_after"] > row["created_at"] + datetime.timedelta(minutes=59)
    with connection.cursor() as cursor:  # its time comes
        cursor.execute(
            "UPDATE dbqueue_step SET result = jsonb_build_object('until', now() - interval '1 s')"
            " WHERE job_id = %s AND name = 'sleep:nap'",
            [job_id],
        )
        cursor.execute("UPDATE dbqueue_job SET run_after = now() WHERE id = %s", [job_id])
    row = wait_for(job_id, lambda r: r["state"] == "done", "done after its sleep")
    assert (row["result"], row["attempts"]) == ("woke", 1)
    got = bodies(job_id)
    assert got[("before", "start")] == [1]  # replayed, not rerun
    assert got[("after-wait", "end")] == [1, 1]  # once on each run that got past the sleep


def test_signals_before_and_after_the_wait_are_each_delivered_once(start_worker, settings):
    settings.DBQUEUE = FAST_DBQUEUE
    job_id = enqueue("approver", {"waits": 2}).id
    assert signal_job(job_id, "approve", "before") == 1  # kept until the first wait
    start_worker(settings=FAST)
    wait_for(
        job_id,
        lambda r: waiting(r, "signal:approve") and r["signal_seq"] == 1,
        "waiting for its second signal",
    )
    assert signal_job(job_id, "approve", {"after": True}) == 2
    row = wait_for(job_id, lambda r: r["state"] == "done", "done")
    assert row["result"] == ["before", {"after": True}]
    assert bodies(job_id)[("prepare", "start")] == [1]  # replayed at each resume, never rerun
    assert signal_job(job_id, "approve", "late") is None  # finished: refused


def test_wait_for_result_is_woken_by_the_worker_process_s_completion(
    start_worker, settings, monkeypatch
):
    monkeypatch.setattr(results, "POLL_FIRST", 60.0)  # only a notification can wake it in time
    monkeypatch.setattr(results, "POLL_MAX", 60.0)
    settings.DBQUEUE = FAST_DBQUEUE
    start_worker(settings=FAST)
    job = enqueue("record", {"sleep": 1.5})
    wait_for(job.id, lambda r: r["state"] == "running", "running")
    started = time.monotonic()
    assert wait_for_result(job, timeout=30) is None  # the handler returns nothing
    waited = time.monotonic() - started
    assert 0.3 < waited < 20, waited  # it waited for the run, and not for the 60 s poll
    assert job_row(job.id)["state"] == "done"
    with pytest.raises(TimeoutError, match="did not finish"):
        wait_for_result(enqueue("sleeper", {"seconds": 3600}), timeout=0.5)
