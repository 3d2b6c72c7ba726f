"""Published events with real run_jobqueue processes: each subscriber's job reaches done exactly
once per event, through a failing first attempt and a worker killed with kill -9 mid-job."""

import os
import signal

import pytest

from django_dbqueue import publish
from tests.acceptance.helpers import rows, wait_all_in_state
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.utils import job_row, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"
PAID = "test.invoice.paid"
SUBSCRIBERS = {"email-on-paid", "flaky-on-paid", "ledger-on-paid"}


def test_each_subscriber_runs_once_per_event_through_a_retry_and_a_kill_9(
    start_worker, settings, tmp_path
):
    settings.DBQUEUE = FAST_DBQUEUE  # the short lease is fixed at publish time
    held = publish(PAID, {"n": 0, "flaky": True, "hold_file": str(tmp_path / "never")})
    events = [held] + [publish(PAID, {"n": n, "flaky": True}) for n in range(1, 6)]
    jobs = {j.id: (e.id, j.type) for e in events for j in e.jobs}
    assert all({t for e2, t in jobs.values() if e2 == e.id} == SUBSCRIBERS for e in events)
    [held_job] = [j.id for j in held.jobs if j.type == "ledger-on-paid"]

    worker_a = start_worker("--concurrency", "4", settings=FAST, name="A")
    wait_until(
        lambda: job_row(held_job)["state"] == "running",
        timeout=20,
        message="worker A to be running the held ledger job",
    )
    assert str(worker_a.pid) in job_row(held_job)["worker_id"]
    os.kill(worker_a.pid, signal.SIGKILL)
    assert worker_a.wait_exit(10) == -signal.SIGKILL

    # Two more events once A is gone: only B runs them, so their flaky jobs fail first for sure.
    events += [publish(PAID, {"n": n, "flaky": True}) for n in (6, 7)]
    jobs.update({j.id: (e.id, j.type) for e in events[-2:] for j in e.jobs})
    worker_b = start_worker(settings=FAST, name="B")
    wait_all_in_state(jobs, "done", timeout=60)
    # Each handler is atomic: one effect row per run that reached done, none for a killed run.
    effect_rows = rows(
        "SELECT job_id, count(*) FROM testapp_effect WHERE job_id = ANY(%s) GROUP BY job_id",
        [list(jobs)],
    )
    assert dict(effect_rows) == dict.fromkeys(jobs, 1)
    per_event = rows(
        "SELECT event_id, count(*), count(DISTINCT type) FROM dbqueue_job "
        "WHERE event_id = ANY(%s) GROUP BY event_id",
        [[e.id for e in events]],
    )
    assert sorted(per_event) == sorted((e.id, 3, 3) for e in events)
    held_row = job_row(held_job)
    assert held_row["attempts"] == 2 and held_row["errors"][0]["class"] == "LeaseExpired"
    # A flaky subscriber's first attempt failed (or was swept from the killed worker, which had
    # claimed it): its retry is done, and the retry was this subscriber's only effect.
    flaky = [job_row(j) for j, (_, t) in jobs.items() if t == "flaky-on-paid"]
    assert all(r["attempts"] == 2 for r in flaky)
    firsts = [r["errors"][0]["class"] for r in flaky]
    assert set(firsts) <= {"RuntimeError", "LeaseExpired"} and firsts[-2:] == ["RuntimeError"] * 2
    worker_b.assert_alive()
