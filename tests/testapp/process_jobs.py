"""Job types for process mode's children (``--execution process``): a handler that ignores
SIGTERM, and one whose process exits on its own with a known code."""

import os
import signal
import time

from django.db import connection

from django_dbqueue import job


@job("ignore-sigterm", max_attempts=3)
def ignore_sigterm(ctx):
    """Record the run (with the child's pid), ignore SIGTERM, and run on. Bounded only so a
    leaked process cannot live forever."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO testapp_effect (job_id, attempt, worker, pid) VALUES (%s, %s, %s, %s)",
            [ctx.id, ctx.attempt, ctx.worker_id, os.getpid()],
        )
    deadline = time.monotonic() + ctx.payload.get("seconds", 600)
    while time.monotonic() < deadline:
        time.sleep(0.05)


@job("exit-process", max_attempts=1)
def exit_process(ctx):
    """Process mode only: end the handler's process with ``payload["code"]``. Its descriptors
    (the pipe to the worker among them) are closed first, and the exit follows a moment later:
    the window in which the worker sees the pipe end while the process has not exited yet,
    held open so that a test can tell the real exit code from the one read too early."""
    os.closerange(3, 65536)
    time.sleep(ctx.payload.get("linger", 1.0))
    os._exit(ctx.payload.get("code", 1))
