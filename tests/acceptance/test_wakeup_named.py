"""Wake-ups that name their workers (waiters.py), with separate ``run_jobqueue`` processes: one
job sends the workers it names into a claim, not every idle one; a frozen (SIGSTOP) worker that
still holds its slot strands no job; a worker whose thread is busy holds no slot, so jobs go to
the idle ones at once; a worker killed with SIGKILL, idle or mid-job, takes its slot along and
loses nothing.

Every worker polls once in ten minutes: a job that runs within seconds was woken."""

import re
import signal

import pytest

from django_dbqueue import enqueue
from tests.utils import job_row, wait_until, wakeup_slots

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

POLL = ["--poll-interval", "600", "--concurrency", "1"]
SETTINGS = "tests.acceptance.settings_info"  # logs the claims a worker made when it stops
CLAIMS = re.compile(r"(\d+) claims \((\d+) empty\)")


def state(job_id):
    row = job_row(job_id)
    return row and row["state"]


def fleet(start_worker, n):
    """``n`` idle workers, started one after the other: the i-th holds slot i."""
    workers = []
    for i in range(n):
        workers.append(start_worker(*POLL, settings=SETTINGS, name=f"w{i}"))
        wait_until(
            lambda i=i: len(wakeup_slots()) == i + 1, timeout=60, message=f"worker {i}'s slot"
        )
    return workers


def claims_at_stop(workers):
    for worker in workers:
        worker.send(signal.SIGTERM)
    total = 0
    for worker in workers:
        assert worker.wait_exit(30) == 0, worker.output()
        found = CLAIMS.findall(worker.stderr() + worker.stdout())
        assert found, worker.output()
        total += int(found[-1][0])
    return total


def trickle(jobs):
    for _ in range(jobs):
        job = enqueue("record")
        wait_until(lambda job=job: state(job.id) == "done", timeout=10, message="the job, woken")


def test_one_job_sends_the_named_workers_into_a_claim_not_every_idle_one(start_worker):
    # The claims a fleet makes by starting and stopping, without jobs.
    base = claims_at_stop(fleet(start_worker, 4))
    workers = fleet(start_worker, 4)
    jobs = 20
    trickle(jobs)
    claims = claims_at_stop(workers) - base
    # Each wake-up names two of the four (its one job plus one): two claims per job, against
    # four when every waiting worker claimed. Slack for start-up claims that vary between runs.
    assert claims <= 2 * jobs + 6, claims


def test_a_frozen_worker_holding_a_slot_strands_no_job(start_worker):
    workers = fleet(start_worker, 3)
    slots = wakeup_slots()
    frozen = workers[0]  # slot 0: named by every wake-up
    frozen.send(signal.SIGSTOP)
    try:
        trickle(10)  # each also names a live worker: all run well before the poll
        assert wakeup_slots()[0] == slots[0], "the frozen worker still holds its slot"
    finally:
        frozen.send(signal.SIGCONT)
    for worker in workers:
        worker.assert_alive()


def fleet_with_a_busy_worker(start_worker, n, flag):
    """``n`` idle workers, then a slow job (until ``flag`` exists) running on one of them, whose
    slot has gone: the job, the id of the worker running it, the worker, and the fleet."""
    workers = fleet(start_worker, n)
    slow = enqueue("slow-record", {"until_file": str(flag), "seconds": 60})
    wait_until(lambda: state(slow.id) == "running", timeout=10, message="the slow job running")
    holder = job_row(slow.id)["worker_id"]
    busy = next(w for w in workers if f":{w.pid}:" in holder)
    wait_until(lambda: len(wakeup_slots()) == n - 1, message="the busy worker's slot given back")
    return slow, holder, busy, workers


def trickle_elsewhere(jobs, holder):
    for _ in range(jobs):
        job = enqueue("record")
        wait_until(lambda job=job: state(job.id) == "done", timeout=10, message="the job, woken")
        assert job_row(job.id)["worker_id"] != holder, "not behind the busy worker's thread"


def test_a_busy_worker_holds_no_slot_and_the_jobs_go_to_the_idle_ones(start_worker, tmp_path):
    flag = tmp_path / "go"
    slow, holder, _busy, workers = fleet_with_a_busy_worker(start_worker, 3, flag)
    trickle_elsewhere(10, holder)  # each names both idle workers
    flag.touch()
    wait_until(lambda: state(slow.id) == "done", timeout=10, message="the slow job done")
    wait_until(lambda: len(wakeup_slots()) == 3, message="its slot taken again")
    for worker in workers:
        worker.assert_alive()


def test_a_worker_killed_idle_or_mid_job_frees_its_slot_and_loses_nothing(start_worker, tmp_path):
    slow, holder, victim, workers = fleet_with_a_busy_worker(start_worker, 4, tmp_path / "never")
    victim.kill()  # SIGKILL, mid-job
    idle = next(w for w in workers if w is not victim)
    idle.kill()  # SIGKILL, idle, holding a slot
    wait_until(lambda: len(wakeup_slots()) == 2, message="the idle one's connection and slot gone")
    trickle_elsewhere(10, holder)  # the survivors, each named while it waits
    assert state(slow.id) == "running", "the killed worker's job stays until its lease runs out"
    assert job_row(slow.id)["worker_id"] == holder
