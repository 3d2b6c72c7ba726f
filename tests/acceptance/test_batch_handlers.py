"""Batch handlers with real ``run_jobqueue`` processes: 1,000 jobs of a batch type across two
workers, one killed with SIGKILL in the middle of its batches. Every job ends done; each job's
successful run is recorded once, by its last attempt; a job the kill interrupted ran again (no job
lost, none settled by its batch mates); and the batches really held more than one job."""

import os
import signal
from collections import defaultdict

import pytest

from django_dbqueue import enqueue_many
from tests.acceptance.helpers import effects, rows, wait_all_in_state
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"


def test_a_thousand_batch_jobs_survive_a_kill_and_settle_per_job(start_worker, settings):
    settings.DBQUEUE = FAST_DBQUEUE  # the short lease is fixed at enqueue time
    count = 1000
    jobs = enqueue_many(
        [("accept-batch", {"n": n, "fail_first": n % 97 == 0, "hold": 0.05}) for n in range(count)]
    )
    ids = [j.id for j in jobs]
    planned_failures = {j.id for n, j in enumerate(jobs) if n % 97 == 0}

    worker_a = start_worker("--concurrency", "2", settings=FAST, name="A")
    worker_b = start_worker("--concurrency", "2", settings=FAST, name="B")
    # A is in the middle of its batches: some of its jobs are recorded, others of its are
    # still running (claimed, not settled).
    wait_until(
        lambda: (
            rows("SELECT count(*) FROM testapp_effect WHERE pid = %s", [worker_a.pid])[0][0] >= 50
            and rows(
                "SELECT count(*) FROM dbqueue_job WHERE state = 'running' AND worker_id LIKE %s",
                [f"%:{worker_a.pid}:%"],
            )[0][0]
            > 1
        ),
        timeout=30,
        message="worker A to be mid-batch",
    )
    held_by_a = {
        row[0]
        for row in rows(
            "SELECT id FROM dbqueue_job WHERE state = 'running' AND worker_id LIKE %s",
            [f"%:{worker_a.pid}:%"],
        )
    }
    os.kill(worker_a.pid, signal.SIGKILL)
    assert worker_a.wait_exit(10) == -signal.SIGKILL

    wait_all_in_state(ids, "done", timeout=120)
    worker_b.assert_alive()

    final_attempt = dict(rows("SELECT id, attempts FROM dbqueue_job WHERE id = ANY(%s)", [ids]))
    by_job = defaultdict(list)
    sizes = []
    for job_id, attempt, worker, _pid in effects(ids):
        by_job[job_id].append(attempt)
        sizes.append(int(worker.split(":")[1]))
    for job_id in ids:
        recorded = by_job[job_id]
        # Its successful run is recorded once, by the attempt that ended it; an earlier record
        # can only be a run the kill cut off before its completion was written.
        assert recorded.count(final_attempt[job_id]) == 1, (job_id, recorded)
        assert all(a < final_attempt[job_id] for a in recorded if a != final_attempt[job_id])
    # The planned failures ran again alone: their first attempt failed, their batch mates'
    # did not (a job with no failure and no kill ended on its first attempt).
    for job_id in planned_failures:
        assert final_attempt[job_id] >= 2
        assert 1 not in by_job[job_id]
    assert max(sizes) > 1  # batches held more than one job
    errors = dict(
        rows(
            "SELECT id, errors::text FROM dbqueue_job WHERE id = ANY(%s) AND attempts > 1",
            [ids],
        )
    )
    # A job ran again only for its own reason: its planned failure, or the kill (its lease
    # expired); never because a batch mate failed.
    for job_id, text in errors.items():
        if job_id in planned_failures:
            # (Its first attempt may have been the kill's instead.)
            assert "planned failure" in text or "LeaseExpired" in text, (job_id, text)
        else:
            assert "LeaseExpired" in text, (job_id, text)
    # The kill did cut batches short: jobs A held came back and ran again.
    assert any(final_attempt[j] > 1 for j in held_by_a - planned_failures)
