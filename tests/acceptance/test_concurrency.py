"""Two worker processes racing over one backlog: SKIP LOCKED hands every job to exactly one."""

import pytest

from tests.acceptance.helpers import (
    enqueue_jobs,
    rows,
    wait_all_in_state,
    wait_for_listeners,
)

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

JOBS = 10_000


def test_two_workers_run_every_job_exactly_once(start_worker):
    workers = [start_worker("--concurrency", "4") for _ in range(2)]
    wait_for_listeners(2)  # both are up and claiming before the backlog arrives

    job_ids = enqueue_jobs("record", JOBS, chunk=500)
    wait_all_in_state(job_ids, "done", timeout=90, interval=0.25)

    effect_rows, distinct_jobs = rows(
        "SELECT count(*), count(DISTINCT job_id) FROM testapp_effect WHERE job_id = ANY(%s)",
        [job_ids],
    )[0]
    assert (effect_rows, distinct_jobs) == (JOBS, JOBS)
    assert rows(
        "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND attempts <> 1", [job_ids]
    ) == [(0,)]
    per_pid = dict(
        rows(
            "SELECT pid, count(*) FROM testapp_effect WHERE job_id = ANY(%s) GROUP BY pid",
            [job_ids],
        )
    )
    assert set(per_pid) == {w.pid for w in workers}, per_pid
    for worker in workers:
        worker.assert_alive()
