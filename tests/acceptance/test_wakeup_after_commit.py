"""A producer that dies between its commit and its wake-up loses latency, never the job.

A commit inside ``transaction.atomic()`` carries its wake-up in the same round trip (the COMMIT
and the notification in one pipeline), so the server runs both or neither, whatever happens to
the producer after sending them. What a producer can still die with is a wake-up it holds back:
an enqueue in autocommit (or where the driver cannot pipeline) that comes less than the
coalescing window after the previous notification of its queue leaves its count for the trailing
notification, which the process sends a little later. The producer here is a real process in
exactly that state: its queue "was just notified" (with a window of a minute, so the trailing
notification cannot fall due during the test), it enqueues in autocommit, reports the commit and
is killed with SIGKILL. A real ``run_jobqueue`` worker, listening, with a 3-second poll, still
runs the job, and no notification for it was ever sent.
"""

import os
import select
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from django_dbqueue.connections import connection_params
from tests.acceptance.conftest import REPO_ROOT, worker_env
from tests.acceptance.helpers import wait_for_listeners
from tests.acceptance.test_wakeup import listen_started, wait_idle
from tests.utils import job_row, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

POLL = 3.0

PRODUCER = """
import threading, time
import django
from django.conf import settings
django.setup()
# The trailing notification falls due long after the kill.
settings.DBQUEUE = {**settings.DBQUEUE, "WAKEUP_WINDOW": 60.0}
from django_dbqueue import enqueue, wakeup
from django_dbqueue.conf import get_settings
get_settings.cache_clear()
wakeup._COALESCER._last[("default", "dbqueue", "default")] = time.monotonic()  # just notified

job = enqueue("record", {})  # autocommit: committed by the INSERT itself
assert wakeup._COALESCER._pending == {("default", "dbqueue", "default"): 1}
print(f"committed {job.id}", flush=True)
threading.Event().wait()  # killed here, holding the wake-up
"""


def test_a_producer_killed_after_its_commit_loses_only_the_wake_up(start_worker, test_database_url):
    listener = psycopg.connect(**connection_params("default"), autocommit=True)
    listener.execute("LISTEN dbqueue")
    worker = start_worker("--poll-interval", str(POLL))
    [worker_listener] = wait_for_listeners(1)
    wait_idle(listen_started(worker_listener))

    env = {**worker_env(test_database_url), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    producer = subprocess.Popen(
        [sys.executable, "-c", PRODUCER],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        line = producer.stdout.readline().decode()
        assert line.startswith("committed "), (line, producer.stderr.read().decode())
        committed_at = time.monotonic()
        job_id = int(line.split()[1])
        os.kill(producer.pid, signal.SIGKILL)
        assert producer.wait(10) == -signal.SIGKILL
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait(10)
        producer.stdout.close()
        producer.stderr.close()

    assert job_row(job_id)["state"] in ("pending", "running", "done")  # committed: it exists
    wait_until(
        lambda: job_row(job_id)["state"] == "done",
        timeout=POLL + 5.0,
        interval=0.05,
        message="the worker's poll to run the job",
    )
    assert time.monotonic() - committed_at < POLL + 5.0
    worker.assert_alive()

    select.select([listener.fileno()], [], [], 0)
    listener.pgconn.consume_input()
    assert listener.pgconn.notifies() is None, "a wake-up was sent: the kill came too late"
    listener.close()
