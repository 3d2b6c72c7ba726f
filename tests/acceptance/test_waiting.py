"""Wake-ups only for workers that wait (waiters.py), with real ``run_jobqueue`` processes and
real producer processes, some killed with SIGKILL: a worker's lock goes with it, an enqueue
killed with its transaction open holds no worker up, and no job is ever left behind.

Every worker polls once in ten minutes: a job that runs within seconds was woken (or claimed by
a worker starting up)."""

import os
import signal
import subprocess
import sys

import pytest

from django_dbqueue import enqueue
from django_dbqueue.notifications import parse_wakeup
from tests.acceptance.conftest import REPO_ROOT, worker_env
from tests.utils import Listener, job_row, wait_until, wakeup_slots, wakeup_waiters

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

POLL = ["--poll-interval", "600"]

# A producer that enqueues in a transaction it keeps open: it found nobody waiting, so it holds
# the lock that a worker starting to wait must wait for. It commits when told, or is killed.
PRODUCER = """
import sys
import django
django.setup()
from django.db import transaction
from django_dbqueue import enqueue

with transaction.atomic():
    job = enqueue("record", {})
    print(f"looked {job.id}", flush=True)
    if sys.stdin.readline().strip() != "commit":
        raise SystemExit(1)
print("committed", flush=True)
"""


def done(job_id):
    row = job_row(job_id)
    return row is not None and row["state"] == "done"


def start_producer(test_database_url):
    env = {**worker_env(test_database_url), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    producer = subprocess.Popen(
        [sys.executable, "-c", PRODUCER],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = producer.stdout.readline()
    assert line.startswith("looked "), (line, producer.stderr.read())
    producer.job_id = int(line.split()[1])
    return producer


def test_only_waiting_workers_are_woken_and_a_killed_one_takes_its_lock_along(start_worker):
    plain = Listener(waits=False, slots=[0])  # sees every wake-up sent to slot 0 or nobody
    try:
        first = start_worker(*POLL, "--concurrency", "2", name="first")
        second = start_worker(*POLL, "--concurrency", "2", name="second")
        # A worker says it waits (its waiting lock) a step before it takes its slot: wait for
        # both, or the wake-up may find nobody to name yet.
        two = wait_until(
            lambda: len(w := wakeup_waiters()) == 2 and set(wakeup_slots().values()) == w and w,
            message="both idle workers waiting, each in its slot",
        )
        job = enqueue("record")
        wait_until(lambda: done(job.id), timeout=5, message="the job, woken")
        assert plain.until_jobs(1) == ["1/0.1:default"], "to slot 0, naming both (waiters.py)"

        first.kill()  # SIGKILL: its connection, and the lock on it, go with it
        one = wait_until(lambda: len(w := wakeup_waiters()) == 1 and w, message="one waiter left")
        assert one < two
        job = enqueue("record")
        wait_until(lambda: done(job.id), timeout=5, message="the job, woken in the survivor")
        second.assert_alive()

        second.kill()
        wait_until(lambda: wakeup_waiters() == set(), message="nobody waiting")
        plain.collect(0.2)
        sent = len(plain.got)
        orphan = enqueue("record")
        assert plain.collect(0.3)[sent:] == [], "nobody waits: no wake-up is sent"
        assert job_row(orphan.id)["state"] == "pending"
        start_worker(*POLL, name="third")  # claims at start: the job was never lost
        wait_until(lambda: done(orphan.id), timeout=15, message="the job, claimed at start")
    finally:
        plain.close()


def test_an_enqueue_killed_with_its_transaction_open_holds_no_worker_up(
    start_worker, test_database_url
):
    """The enqueues look before any worker waits, and keep their transactions open: the worker,
    starting up, must wait for them before its claim. One producer is killed with SIGKILL (its
    transaction rolls back with its connection), the other commits: the worker gets through,
    claims the committed job at once although no wake-up was ever sent for it, and is woken for
    the next one."""
    killed = start_producer(test_database_url)
    kept = start_producer(test_database_url)
    plain = Listener(waits=False)
    try:
        worker = start_worker(*POLL, "--concurrency", "2")
        pid = wait_until(
            lambda: len(w := wakeup_waiters()) == 1 and next(iter(w)),
            message="the worker waiting, though not through yet",
        )
        os.kill(killed.pid, signal.SIGKILL)
        assert killed.wait(10) == -signal.SIGKILL
        assert job_row(killed.job_id) is None, "its enqueue rolled back with it"
        kept.stdin.write("commit\n")
        kept.stdin.flush()
        assert kept.stdout.readline().strip() == "committed"
        assert kept.wait(10) == 0
        wait_until(lambda: done(kept.job_id), timeout=5, message="the committed job, at once")
        assert plain.collect(0.2) == [], "both enqueues found nobody waiting: no wake-up"
        job = enqueue("record")
        wait_until(lambda: done(job.id), timeout=5, message="the next job, woken")
        assert plain.until_jobs(1) == ["1:default"]
        assert wakeup_waiters() == {pid}
        worker.assert_alive()
        assert "could not yet say" not in worker.stderr()  # tried at DEBUG, warned never
    finally:
        plain.close()
        for producer in (killed, kept):
            if producer.poll() is None:
                producer.kill()
                producer.wait(10)
            for stream in (producer.stdin, producer.stdout, producer.stderr):
                stream.close()


def test_a_group_s_workers_say_they_wait_and_its_listener_wakes_them(start_worker):
    """Under --processes each worker says it waits on its own connection, and the group's one
    listener hands the wake-ups to them: with a ten-minute poll, every job runs within
    seconds."""
    plain = Listener(waits=False)
    try:
        group = start_worker(*POLL, "--processes", "2", "--concurrency", "2")
        wait_until(lambda: len(wakeup_waiters()) == 2, message="both workers of the group waiting")
        for _ in range(3):
            job = enqueue("record")
            wait_until(lambda j=job.id: done(j), timeout=5, message="the job, woken")
        assert sum(parse_wakeup(p)[1] for p in plain.collect(0.2)) == 3
        group.assert_alive()
        group.send(signal.SIGTERM)
        assert group.wait_exit(30) == 0
        wait_until(lambda: wakeup_waiters() == set(), message="the group's locks gone with it")
    finally:
        plain.close()
