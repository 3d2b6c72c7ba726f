"""Fleet-wide flow control with real worker processes: a concurrency limit held while workers
hammer the queue (and one is killed with SIGKILL mid-job), a rate limit's starts per sliding
window, and a paused queue that resumes promptly."""

import os
import signal
import threading
import time

import psycopg
import pytest

from django_dbqueue import enqueue_many, pause_queue, resume_queue
from django_dbqueue.connections import connection_params
from tests.acceptance.helpers import effects, rows, states, wait_all_in_state
from tests.acceptance.settings_flow import FLOW_DBQUEUE
from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FLOW = "tests.acceptance.settings_flow"


class Sampler(threading.Thread):
    """Counts the running jobs of a queue every ~20 ms on a connection of its own."""

    def __init__(self, queue):
        super().__init__(daemon=True)
        self.queue = queue
        self.samples = []
        self.stop = threading.Event()

    def run(self):
        with psycopg.connect(**connection_params("default"), autocommit=True) as conn:
            while not self.stop.is_set():
                (n,) = conn.execute(
                    "SELECT count(*) FROM dbqueue_job WHERE state = 'running' AND queue = %s",
                    [self.queue],
                ).fetchone()
                self.samples.append(n)
                time.sleep(0.02)  # the sampling period, not a wait for a condition


def test_global_concurrency_holds_across_workers_and_a_killed_workers_slot_comes_back(
    start_worker, settings
):
    settings.DBQUEUE = FLOW_DBQUEUE  # the lease (4 s) is fixed at enqueue time
    jobs = [
        job.id
        for job in enqueue_many(
            [{"type": "record", "payload": {"sleep": 0.15}, "queue": "limited"}] * 45
        )
    ]
    sampler = Sampler("limited")
    sampler.start()
    workers = [
        start_worker("--queues", "limited", "--concurrency", "4", settings=FLOW, name=f"w{i}")
        for i in range(3)
    ]
    # kill one worker while it holds a job
    victim = wait_until(
        lambda: next(
            (w for w in workers if any(str(w.pid) in (r[2] or "") for r in effects(jobs))), None
        ),
        timeout=20,
        message="a worker to start a job",
    )
    held = rows(
        "SELECT count(*) FROM dbqueue_job WHERE state = 'running' AND worker_id LIKE %s",
        [f"%:{victim.pid}:%"],
    )[0][0]
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.wait_exit(10) == -signal.SIGKILL
    wait_all_in_state(jobs, "done", timeout=45)
    sampler.stop.set()
    sampler.join(5)
    assert max(sampler.samples) <= 3, max(sampler.samples)
    assert max(sampler.samples) == 3  # the limit was used, not just respected
    # every job done; a job ran twice only when the killed worker held it (its lease expired)
    runs = effects(jobs)
    per_job = {}
    for job_id, attempt, _, pid in runs:
        per_job.setdefault(job_id, []).append((attempt, pid))
    assert set(per_job) == set(jobs)
    twice = {j: r for j, r in per_job.items() if len(r) > 1}
    assert all(r[0][1] == victim.pid for r in twice.values()), twice
    assert len(twice) <= max(held, 1) + 3
    assert dict(states(jobs)) == {"done": len(jobs)}


def _max_in_window(times, period):
    times = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= period:
            start += 1
        best = max(best, end - start + 1)
    return best


def test_rate_limit_starts_per_sliding_window_across_workers(start_worker, settings):
    settings.DBQUEUE = FLOW_DBQUEUE
    jobs = [job.id for job in enqueue_many([{"type": "noop", "queue": "rated"}] * 30)]
    for i in range(3):
        start_worker("--queues", "rated", "--concurrency", "4", settings=FLOW, name=f"r{i}")
    wait_all_in_state(jobs, "done", timeout=20)
    started = [
        t.timestamp()
        for (t,) in rows("SELECT started_at FROM dbqueue_job WHERE id = ANY(%s)", [jobs])
    ]
    assert _max_in_window(started, 1.0) <= 5
    # close to 5 per second: 30 jobs in 6 windows, the first one at once; no long stalls
    span = max(started) - min(started)
    assert span < 5.0 + 1.5, span
    assert span > 5.0 - 0.01, span


def test_rate_limit_holds_and_leaks_nothing_when_a_worker_is_killed_mid_job(start_worker, settings):
    settings.DBQUEUE = FLOW_DBQUEUE  # the lease (4 s) is fixed at enqueue time
    jobs = [
        job.id
        for job in enqueue_many(
            [{"type": "record", "payload": {"sleep": 0.3}, "queue": "rated"}] * 20
        )
    ]
    workers = [
        start_worker("--queues", "rated", "--concurrency", "4", settings=FLOW, name=f"k{i}")
        for i in range(3)
    ]
    victim = wait_until(
        lambda: next(
            (w for w in workers if any(str(w.pid) in (r[2] or "") for r in effects(jobs))), None
        ),
        timeout=20,
        message="a worker to start a job",
    )
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.wait_exit(10) == -signal.SIGKILL
    wait_all_in_state(jobs, "done", timeout=40)
    # Every claim, the killed worker's included, went through the window: the last start of
    # every job (its successful run) keeps to 5 per second, and the killed worker's jobs,
    # taken back at their lease's end, ran again within the limit (no leaked capacity: all
    # done, at the limit's pace).
    started = [
        t.timestamp()
        for (t,) in rows("SELECT started_at FROM dbqueue_job WHERE id = ANY(%s)", [jobs])
    ]
    assert _max_in_window(started, 1.0) <= 5
    runs = {}
    for job_id, _, _, pid in effects(jobs):
        runs.setdefault(job_id, []).append(pid)
    assert set(runs) == set(jobs)
    assert all(pids[0] == victim.pid for pids in runs.values() if len(pids) > 1), runs
    assert dict(states(jobs)) == {"done": len(jobs)}
    for worker in workers:
        if worker is not victim:
            worker.assert_alive()


def test_paused_queue_is_not_claimed_and_resume_wakes_the_workers(start_worker, settings):
    settings.DBQUEUE = FLOW_DBQUEUE
    worker = start_worker("--queues", "pausable,default", settings=FLOW)
    pause_queue("pausable", by="test")
    paused = [job.id for job in enqueue_many([{"type": "noop", "queue": "pausable"}] * 5)]
    probe = [job.id for job in enqueue_many([{"type": "noop", "queue": "default"}])]
    wait_all_in_state(probe, "done", timeout=20)  # the worker claims, just not that queue
    assert dict(states(paused)) == {"pending": 5}
    begun = time.monotonic()
    resume_queue("pausable", by="test")
    wait_all_in_state(paused, "done", timeout=10)
    # woken by the resume's notification, not found at the next poll (2 s)
    assert time.monotonic() - begun < 1.5
    worker.assert_alive()
