"""Waking up: NOTIFY wakes an idle worker at once; the poll finds jobs whose notification was lost."""

import time

import pytest

from django_dbqueue import enqueue
from tests.acceptance.helpers import database_name, effects, rows, wait_for_listeners
from tests.utils import job_row, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def wait_idle(after_sql_time):
    """Wait until the worker's own session ran a statement after ``after_sql_time`` (a database
    timestamp) and is idle again: the worker has done its work and is now waiting."""
    wait_until(
        lambda: (
            rows(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND state = 'idle' "
                "AND query NOT LIKE 'LISTEN %%' AND query_start > %s "
                "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
                [database_name(), after_sql_time],
            )[0][0]
            >= 1
        ),
        timeout=20,
        message="the worker to go idle",
    )


def listen_started(listener_pid):
    """When the listening session connected: its LISTEN, and a worker's claims on the same
    session, come after that."""
    return rows("SELECT backend_start FROM pg_stat_activity WHERE pid = %s", [listener_pid])[0][0]


def seconds_until_done(job_id, timeout):
    start = time.monotonic()
    wait_until(lambda: job_row(job_id)["state"] == "done", timeout=timeout, message="the job")
    return time.monotonic() - start


def test_notify_wakes_an_idle_worker_long_before_its_poll(start_worker):
    start_worker("--poll-interval", "30")
    [listener] = wait_for_listeners(1)
    wait_idle(listen_started(listener))

    for _ in range(2):  # the second proves the worker is woken again after a job
        job_id = enqueue("record", {}).id
        assert seconds_until_done(job_id, timeout=2.0) < 2.0  # a poll would take 30 s
        # The handler's effect row is stamped with database time; the claim that follows the
        # job (the worker went idle) starts after it.
        wait_idle(rows("SELECT at FROM testapp_effect WHERE job_id = %s", [job_id])[0][0])


def test_poll_finds_a_job_whose_notification_was_missed(start_worker):
    start_worker("--poll-interval", "0.5")
    [listener] = wait_for_listeners(1)
    wait_idle(listen_started(listener))

    # Inserted by plain SQL: no pg_notify, as if the notification was lost.
    [(job_id,)] = rows(
        "INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts, "
        "max_attempts, lease_seconds, errors, created_at) VALUES ('record', 'default', '{}', "
        "'pending', 0, now(), 0, 3, 60, '[]', now()) RETURNING id"
    )
    assert seconds_until_done(job_id, timeout=3.0) < 3.0
    assert len(effects([job_id])) == 1


def test_a_scheduled_job_runs_within_a_poll_interval_of_coming_due(start_worker):
    start_worker("--poll-interval", "0.5")
    wait_for_listeners(1)

    job_id = enqueue("record", {}, delay=1.5).id
    due = job_row(job_id)["run_after"]
    wait_until(lambda: job_row(job_id)["state"] == "done", timeout=10, message="the scheduled job")
    [(ran_at,)] = rows("SELECT at FROM testapp_effect WHERE job_id = %s", [job_id])
    assert ran_at >= due  # not early
    assert (ran_at - due).total_seconds() < 0.5 + 1.5  # one poll interval, plus slack
