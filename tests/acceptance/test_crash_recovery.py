"""A worker killed with SIGKILL mid-job: another worker's sweeper takes the job back and runs it."""

import os
import signal

import pytest

from django_dbqueue import enqueue
from tests.acceptance.helpers import effects
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.utils import job_row, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"


def test_sigkill_mid_job_is_swept_back_and_rerun_elsewhere(start_worker, settings, tmp_path):
    settings.DBQUEUE = FAST_DBQUEUE  # the short lease is fixed at enqueue time
    flag = tmp_path / "release"
    job_id = enqueue("slow-record", {"until_file": str(flag)}).id
    assert job_row(job_id)["lease_seconds"] == FAST_DBQUEUE["LEASE"]

    worker_a = start_worker(settings=FAST, name="A")
    wait_until(
        lambda: job_row(job_id)["state"] == "running" and len(effects([job_id])) == 1,
        timeout=20,
        message="worker A to be running the job",
    )
    running = job_row(job_id)
    assert running["attempts"] == 1
    assert str(worker_a.pid) in running["worker_id"]

    os.kill(worker_a.pid, signal.SIGKILL)
    assert worker_a.wait_exit(10) == -signal.SIGKILL
    flag.touch()  # the next run finishes at once

    worker_b = start_worker(settings=FAST, name="B")
    wait_until(
        lambda: job_row(job_id)["state"] == "done",
        timeout=20,
        message="worker B to sweep the job back and complete it",
    )
    done = job_row(job_id)
    assert done["attempts"] == 2
    assert str(worker_b.pid) in done["worker_id"]
    [error] = done["errors"]
    assert error["class"] == "LeaseExpired"
    assert error["attempt"] == 1
    assert error["worker"] == running["worker_id"]
    runs = effects([job_id])
    assert [(attempt, pid) for _, attempt, _, pid in runs] == [
        (1, worker_a.pid),
        (2, worker_b.pid),
    ]
    worker_b.wait_for_output(f"swept job={job_id} type=slow-record attempt=1 back to pending")
    worker_b.assert_alive()


def test_heartbeats_keep_a_job_that_outlives_its_lease(start_worker, settings):
    settings.DBQUEUE = FAST_DBQUEUE  # short lease, frequent heartbeats and sweeps
    job_id = enqueue("record", {"sleep": 1.75 * FAST_DBQUEUE["LEASE"]}).id
    assert job_row(job_id)["lease_seconds"] == FAST_DBQUEUE["LEASE"]

    worker = start_worker(settings=FAST)
    wait_until(
        lambda: job_row(job_id)["state"] == "done",
        timeout=30,
        message="the job that outlives its lease to finish",
    )
    row = job_row(job_id)
    assert (row["attempts"], row["errors"]) == (1, [])
    assert len(effects([job_id])) == 1
    assert "swept" not in worker.stderr() and "lease lost" not in worker.stderr()
