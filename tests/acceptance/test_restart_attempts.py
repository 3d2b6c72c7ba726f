"""What a worker that restarts in place, or gives up and exits, does with the attempts of the
jobs it held (docs/concepts/shutdown.md#what-counts-as-an-attempt), with real ``run_jobqueue``
processes.

The job type ``serial-hang`` (tests/testapp/hung_jobs.py) has a serial key and a timeout of
1 s, and hangs until the test lets it go: past its timeout its run keeps the job ``running``
(a second run of its key must not start beside it), so two of them on one thread pass the
default ``HUNG_THREAD_LIMIT`` (the concurrency, 1) and the worker gives up. Each run records
its start in testapp_serial_run: how the tests count the times a handler was entered."""

import json

import pytest

from django_dbqueue import enqueue
from django_dbqueue.sweeper import Sweeper
from tests.acceptance.helpers import rows, states, wait_all_in_state
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"


@pytest.fixture(autouse=True)
def fast_leases(settings):
    settings.DBQUEUE = FAST_DBQUEUE  # leases are fixed at enqueue time


def entries(job_ids):
    """``{job_id: [attempt, ...]}``: each time a handler was entered, with its attempt."""
    entered = {job_id: [] for job_id in job_ids}
    for job_id, attempt in rows(
        "SELECT job_id, attempt FROM testapp_serial_run WHERE job_id = ANY(%s) ORDER BY id",
        [list(job_ids)],
    ):
        entered[job_id].append(attempt)
    return entered


def error_classes(job_id):
    (errors,) = rows("SELECT errors::text FROM dbqueue_job WHERE id = %s", [job_id])[0]
    return [error["class"] for error in json.loads(errors)]


def hanging_keyed_jobs(count, tmp_path, **options):
    """``count`` serial-hang jobs, each of a key of its own, hanging until a file that no one
    creates (at most 120 s)."""
    return [
        enqueue(
            "serial-hang",
            {"account": f"acct-{n}", "until_file": str(tmp_path / "never")},
            **options,
        ).id
        for n in range(count)
    ]


def test_a_restart_in_place_counts_the_attempts_of_runs_past_their_timeout(start_worker, tmp_path):
    """The issue's case: one thread, two keyed jobs with max_attempts=1 that hang past their
    timeout of 1 s. The worker gives up and restarts in place; the attempts those runs spent
    count, so both jobs are dead (TimeoutError), each handler entered once. (It used to hand
    them back with ``attempts - 1`` after the restart: the same runs over and over, restart
    after restart, the jobs never dead.)"""
    jobs = hanging_keyed_jobs(2, tmp_path, max_attempts=1)
    worker = start_worker("--concurrency", "1", settings=FAST)
    worker.wait_for_output("restarted in place", stream="stdout", timeout=60)
    wait_all_in_state(jobs, "dead", timeout=30)
    assert entries(jobs) == {job_id: [1] for job_id in jobs}, worker.output()
    for job_id in jobs:
        assert error_classes(job_id) == ["TimeoutError"], worker.output()
    worker.assert_alive()


def test_a_restart_in_place_counts_a_keyed_run_it_cut_short(start_worker, tmp_path):
    """A keyed run without a timeout, still going when the worker gives up (three other keyed
    runs hang past their timeouts on two threads): after the grace it is not handed back (a
    second run of its key could start beside it), and the restart ends it. It was started, so
    its attempt counts (``WorkerRestarted``): its next run is attempt 2. (It used to be handed
    back after the restart with ``attempts - 1``: run again as attempt 1, its first run
    uncounted.)"""
    long_run = enqueue("serial-record", {"account": "long", "sleep": 15}).id
    hanging = hanging_keyed_jobs(3, tmp_path, max_attempts=1)
    worker = start_worker("--concurrency", "2", settings=FAST)
    worker.wait_for_output("restarted in place", stream="stdout", timeout=60)
    wait_all_in_state(hanging, "dead", timeout=30)
    wait_until(
        lambda: len(entries([long_run])[long_run]) >= 2,
        timeout=30,
        message="the keyed job's second run",
    )
    assert entries([long_run]) == {long_run: [1, 2]}, worker.output()
    assert error_classes(long_run) == ["WorkerRestarted"], worker.output()
    assert entries(hanging) == {job_id: [1] for job_id in hanging}, worker.output()
    worker.assert_alive()


def test_a_worker_that_gives_up_and_exits_leaves_its_timed_out_runs_counted(start_worker, tmp_path):
    """``--on-give-up exit``: the keyed runs past their timeout stay claimed as the process
    exits (they may still run until it is gone); their leases expire and the sweeper counts
    the attempts: dead after their only attempt, each handler entered once."""
    jobs = hanging_keyed_jobs(2, tmp_path, max_attempts=1)
    worker = start_worker("--concurrency", "1", "--on-give-up", "exit", settings=FAST)
    assert worker.wait_exit(60) == 3, worker.output()
    assert states(jobs)["running"] == 2  # not handed back: the runs went on until the exit
    sweeper = Sweeper()

    def swept_dead():
        sweeper.run_once()
        return states(jobs)["dead"] == 2

    wait_until(swept_dead, timeout=30, message="the swept jobs dead")
    assert entries(jobs) == {job_id: [1] for job_id in jobs}
    for job_id in jobs:
        assert error_classes(job_id) == ["LeaseExpired"]
