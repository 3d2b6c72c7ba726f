"""Cancelling running jobs with real ``run_jobqueue`` processes: the notification reaches the
worker holding the job (its own listener, or the group listener of ``--processes``), the
heartbeat is the backstop without LISTEN, async and process-mode handlers are stopped, a handler
that ignores the cancel keeps its result, and a worker killed with SIGKILL while holding a
cancel-marked job leaves it to the sweeper, which ends it cancelled (never runs it again).

The bound asserted is 2 s from the cancel's commit to the job's end; the figure measured is
printed (run with ``-s`` to see it)."""

import os
import signal
import time

import pytest

from django_dbqueue import cancel, enqueue
from tests.acceptance.helpers import effect_count, wait_for_listeners
from tests.acceptance.settings_cancel import CANCEL_DBQUEUE
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.utils import job_row, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

NOTIFIED = "tests.acceptance.settings_cancel"  # heartbeat 5 s: only a notification is quick
NO_LISTEN = "tests.acceptance.settings_cancel_no_listen"  # heartbeat 0.25 s, no LISTEN
FAST = "tests.acceptance.settings_fast"
BOUND = 2.0  # seconds from the cancel to the job's end


def wait_started(job_ids, timeout=30):
    wait_until(
        lambda: effect_count(job_ids) == len(job_ids),
        timeout=timeout,
        message=f"the handlers of {job_ids} to start",
    )


def cancel_and_time(job_ids, what, *, expected_state="cancelled", by=None):
    asked = time.monotonic()
    outcome = cancel(job_ids, by=by)
    assert set(outcome.values()) == {"cancelling"}, outcome
    wait_until(
        lambda: all(job_row(i)["state"] == expected_state for i in job_ids),
        timeout=15,
        interval=0.01,
        message=f"{job_ids} to be {expected_state}",
    )
    took = time.monotonic() - asked
    print(f"\ncancel -> {expected_state} ({what}): {took * 1000:.0f} ms")
    return took


def test_a_cooperative_handler_is_stopped_by_the_notification(start_worker, settings):
    settings.DBQUEUE = CANCEL_DBQUEUE
    worker = start_worker("--concurrency", "2", settings=NOTIFIED)
    wait_for_listeners(1)
    job_id = enqueue("cooperative").id
    wait_started([job_id])
    assert cancel_and_time([job_id], "cooperative, notified", by="ops") < BOUND
    row = job_row(job_id)
    assert (row["cancelled_by"], row["errors"], row["attempts"]) == ("ops", [], 1)
    assert effect_count([job_id]) == 1
    worker.wait_for_output(f"cancelled job={job_id} type=cooperative attempt=1 by ops")
    worker.assert_alive()


def test_without_listen_the_heartbeat_tells_the_worker(start_worker, settings):
    settings.DBQUEUE = FAST_DBQUEUE
    worker = start_worker(settings=NO_LISTEN)
    job_id = enqueue("cooperative").id
    wait_started([job_id])
    assert cancel_and_time([job_id], "cooperative, heartbeat only") < BOUND
    worker.assert_alive()


def test_an_async_handler_is_cancelled(start_worker, settings, tmp_path):
    settings.DBQUEUE = CANCEL_DBQUEUE
    start_worker(settings=NOTIFIED)
    wait_for_listeners(1)
    started = tmp_path / "started"
    job_id = enqueue("async-cooperative", {"started_file": str(started)}).id
    wait_until(started.exists, timeout=30, message="the async handler to start")
    assert cancel_and_time([job_id], "async task cancelled") < BOUND
    assert job_row(job_id)["result"] is None


def test_a_handler_that_ignores_the_cancel_runs_to_its_end(start_worker, settings):
    settings.DBQUEUE = CANCEL_DBQUEUE
    start_worker(settings=NOTIFIED)
    wait_for_listeners(1)
    job_id = enqueue("ignores-cancel", {"seconds": 3}).id
    wait_started([job_id])
    took = cancel_and_time([job_id], "ignoring handler, ran to its end")
    assert took < 3 + BOUND
    row = job_row(job_id)
    # It ran to its end (it saw the cancel: it was told), kept its result, and ran once.
    assert row["result"] == {"ran_to_the_end": True, "saw_cancel": True}
    assert row["attempts"] == 1 and effect_count([job_id]) == 1


def test_under_processes_the_group_listener_reaches_the_right_child(start_worker, settings):
    settings.DBQUEUE = CANCEL_DBQUEUE
    group = start_worker("--processes", "2", "--concurrency", "1", settings=NOTIFIED)
    wait_for_listeners(1)  # one LISTEN connection for the whole group
    jobs = [enqueue("cooperative").id for _ in range(2)]
    wait_started(jobs)
    holders = {job_row(i)["worker_id"] for i in jobs}
    assert len(holders) == 2  # one job in each child
    assert cancel_and_time(jobs, "two children of --processes 2, notified") < BOUND
    group.assert_alive()


def test_process_execution_signals_the_child_running_the_handler(start_worker, settings):
    settings.DBQUEUE = CANCEL_DBQUEUE
    start_worker("--execution", "process", "--concurrency", "1", settings=NOTIFIED)
    wait_for_listeners(1)
    job_id = enqueue("cooperative").id
    wait_started([job_id], timeout=40)  # a spawned child sets Django up first
    assert cancel_and_time([job_id], "EXECUTION=process, SIGUSR1 to the child") < BOUND
    assert job_row(job_id)["errors"] == []


def test_a_worker_killed_holding_a_marked_job_leaves_it_to_the_sweeper(start_worker, settings):
    settings.DBQUEUE = FAST_DBQUEUE  # a 4 s lease, fixed at enqueue
    holder = start_worker(settings=FAST, name="holder")
    job_id = enqueue("ignores-cancel", {"seconds": 60}).id
    wait_started([job_id])
    assert cancel(job_id) == {job_id: "cancelling"}
    os.kill(holder.pid, signal.SIGKILL)
    assert holder.wait_exit(10) == -signal.SIGKILL
    assert job_row(job_id)["state"] == "running"

    sweeper = start_worker(settings=FAST, name="sweeper")
    wait_until(
        lambda: job_row(job_id)["state"] == "cancelled",
        timeout=20,
        message="the other worker's sweeper to end the job cancelled",
    )
    row = job_row(job_id)
    assert row["errors"][-1]["class"] == "LeaseExpired" and row["cancelled_by"] == "api"
    assert effect_count([job_id]) == 1  # never run again
    sweeper.wait_for_output(f"swept job={job_id} type=ignores-cancel attempt=1 to cancelled")
    sweeper.assert_alive()


def _notify(payload):
    """A bare NOTIFY on the workers' channel, as any role that can connect may send one."""
    from django.db import connection
    from psycopg import sql as pgsql

    from django_dbqueue.conf import get_settings

    channel = pgsql.Identifier(get_settings().NOTIFY_CHANNEL).as_string(connection.connection)
    with connection.cursor() as cursor:
        cursor.execute(f"NOTIFY {channel}, '{payload}'")


@pytest.mark.parametrize(
    "options",
    [("--processes", "2", "--concurrency", "1"), ("--execution", "process")],
    ids=["processes", "process-execution"],
)
def test_a_cancel_notification_nobody_asked_for_and_a_hostile_one_do_nothing(
    start_worker, settings, options
):
    # Issue 35: a "cancel:<id>" notification is only a hint, which the database must confirm;
    # a malformed payload stops neither a group's listener nor a worker.
    settings.DBQUEUE = CANCEL_DBQUEUE
    group = start_worker(*options, settings=NOTIFIED)
    wait_for_listeners(1)
    job_id = enqueue("ignores-cancel", {"seconds": 2}).id
    wait_started([job_id], timeout=40)
    _notify(f"cancel:{job_id}")
    _notify("9" * 5000 + ":default")
    _notify("cancel:" + "9" * 5000 + f",{job_id}")
    wait_until(
        lambda: job_row(job_id)["state"] not in ("pending", "running"),
        timeout=20,
        message="the job to end",
    )
    row = job_row(job_id)
    assert (row["state"], row["result"]) == ("done", {"ran_to_the_end": True, "saw_cancel": False})
    group.assert_alive()
    # A real cancel still goes through, by notification.
    other = enqueue("cooperative").id
    wait_started([other], timeout=40)
    assert cancel_and_time([other], f"{options[0]}, after hostile notifications") < BOUND
    group.assert_alive()
