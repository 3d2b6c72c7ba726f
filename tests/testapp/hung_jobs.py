"""Job types of the tests of runs past their timeout under fleet-wide limits and at shutdown
(tests/acceptance/test_hung_limits.py). Each run records its start and end in
testapp_serial_run (database time, pid): how the tests see which runs overlapped, a run that is
still going included."""

import os
import threading
import time

from django.db import connection

from django_dbqueue import job


def _wait_for_file(path, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (path and os.path.exists(path)):
        time.sleep(0.02)


def _recorded_run(ctx):
    """Record the run's start; hang until ``until_file`` exists (at most ``seconds``); record
    its end. With ``hold_exit_file``, the worker process cannot exit before that file exists
    (a thread that is not a daemon): the test decides when the process, and this run in it,
    is gone."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_serial_run (job_id, attempt, key, pid, started) "
            "VALUES (%s, %s, %s, %s, clock_timestamp()) RETURNING id",
            [ctx.id, ctx.attempt, ctx.queue, os.getpid()],
        )
        run_id = cursor.fetchone()[0]
    if hold := ctx.payload.get("hold_exit_file"):
        threading.Thread(target=_wait_for_file, args=(hold, 120), daemon=False).start()
    _wait_for_file(ctx.payload.get("until_file"), ctx.payload.get("seconds", 120))
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE testapp_serial_run SET finished = clock_timestamp() WHERE id = %s", [run_id]
        )


@job("hang-recorded", timeout=1.0, max_attempts=2)
def hang_recorded(ctx):
    """Hangs past its timeout of 1 s until the test lets it return."""
    _recorded_run(ctx)


@job("run-recorded", max_attempts=3)
def run_recorded(ctx):
    """Like hang-recorded, without a timeout: runs until the test lets it return."""
    _recorded_run(ctx)


@job("slow-but-finishing", timeout=1.0, max_attempts=1)
def slow_but_finishing(ctx):
    """Runs past its timeout of 1 s, and returns as soon as its timeout is written (the job
    left `running`): slow, but it does finish. Bounded at 60 s."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT state FROM dbqueue_job WHERE id = %s", [ctx.id])
            (state,) = cursor.fetchone()
        if state != "running":
            return
        time.sleep(0.02)


@job("serial-hang", serial_key=lambda payload: payload.get("account"), timeout=1.0)
def serial_hang(ctx):
    """A serially keyed job that hangs past its timeout until the test lets it return."""
    _recorded_run(ctx)
