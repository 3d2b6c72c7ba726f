"""SIGTERM: stop claiming, let running handlers finish within SHUTDOWN_GRACE, release the rest
back to pending without spending their attempt, and exit 0."""

import signal

import pytest

from django_dbqueue import enqueue
from tests.acceptance.helpers import effects, enqueue_jobs, states
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.utils import job_row, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"  # SHUTDOWN_GRACE 3 s
GRACE = FAST_DBQUEUE["SHUTDOWN_GRACE"]
SIGTERM_LOGGED = "SIGTERM received, finishing running jobs"


def wait_running(job_ids, timeout=20):
    """Wait until each job's handler has *started* (its effect row is written): a claimed job
    may still sit prefetched in the worker, and a SIGTERM then releases it instead."""
    wait_until(
        lambda: (
            states(job_ids)["running"] == len(job_ids)
            and {row[0] for row in effects(job_ids)} == set(job_ids)
        ),
        timeout=timeout,
        message=f"jobs {job_ids} to be running",
    )


def test_sigterm_lets_a_running_handler_finish_and_exits_0(start_worker, tmp_path):
    flag = tmp_path / "finish"
    job_id = enqueue("slow-record", {"seconds": 60, "until_file": str(flag)}).id
    worker = start_worker(settings=FAST)
    wait_running([job_id])

    worker.send(signal.SIGTERM)
    worker.wait_for_output(SIGTERM_LOGGED)
    # Inside the grace period: the worker waits for the handler instead of exiting.
    worker.assert_alive()
    assert job_row(job_id)["state"] == "running"
    flag.touch()

    assert worker.wait_exit(GRACE + 10) == 0
    row = job_row(job_id)
    assert (row["state"], row["attempts"], row["errors"]) == ("done", 1, [])


def test_sigterm_releases_prefetched_jobs_without_spending_attempts(start_worker, tmp_path):
    flag = tmp_path / "finish"
    blocker = enqueue("slow-record", {"seconds": 60, "until_file": str(flag)}).id
    worker = start_worker("--concurrency", "1", settings=FAST)
    wait_running([blocker])
    # The only handler thread is busy: what the worker claims now is prefetched, never started.
    queued = enqueue_jobs("record", 3)
    wait_until(lambda: states(queued)["running"] >= 1, timeout=20, message="a prefetch claim")
    prefetched = [job_id for job_id in queued if job_row(job_id)["state"] == "running"]

    worker.send(signal.SIGTERM)
    wait_until(
        lambda: states(prefetched)["pending"] == len(prefetched),
        timeout=GRACE - 0.5,  # released at once, not after the grace period
        message=f"prefetched jobs {prefetched} to be released",
    )
    worker.assert_alive()  # still inside the grace period of the running handler
    flag.touch()  # which now finishes

    assert worker.wait_exit(GRACE + 10) == 0
    for job_id in queued:  # released or never claimed: untouched either way
        row = job_row(job_id)
        assert (row["state"], row["attempts"], row["worker_id"], row["leased_until"]) == (
            "pending",
            0,
            None,
            None,
        )
    assert effects(queued) == []
    assert job_row(blocker)["state"] == "done"


def test_sigterm_releases_a_handler_that_outlives_the_grace(start_worker):
    job_id = enqueue("slow-record", {"seconds": 120}).id
    worker = start_worker(settings=FAST)
    wait_running([job_id])

    worker.send(signal.SIGTERM)
    assert worker.wait_exit(GRACE + 10) == 0
    assert "still running after" in worker.stderr()
    row = job_row(job_id)
    # Released: pending, the attempt the claim took given back, no lease, no error recorded.
    assert (row["state"], row["attempts"], row["leased_until"], row["errors"]) == (
        "pending",
        0,
        None,
        [],
    )


def test_a_second_sigterm_exits_at_once(start_worker):
    job_id = enqueue("slow-record", {"seconds": 120}).id
    worker = start_worker(settings=FAST)
    wait_running([job_id])

    worker.send(signal.SIGTERM)
    worker.wait_for_output(SIGTERM_LOGGED)
    worker.send(signal.SIGTERM)
    worker.wait_exit(GRACE - 1)  # does not wait for the grace period
    assert "second signal, exiting at once" in worker.stderr()
    # Not released: the lease expires and a sweeper recovers the job (spending the attempt).
    assert job_row(job_id)["state"] == "running"
