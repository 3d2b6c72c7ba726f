"""Durable steps under kill -9: five five-step jobs, each held in a different step when its worker
process is killed; another worker process takes them back and finishes them. Every step that
finished before the kill ran exactly once; the step that was cut off ran again; the steps after
it ran once (counted by their bodies' rows in testapp_step_body)."""

import os
import signal

import pytest
from django.db import connection

from django_dbqueue import enqueue, store
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.testapp.step_jobs import STEPS
from tests.utils import job_row, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"


def bodies(job_id):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT step, phase, attempt FROM testapp_step_body WHERE job_id = %s ORDER BY id",
            [job_id],
        )
        out = {}
        for step, phase, attempt in cursor.fetchall():
            out.setdefault((step, phase), []).append(attempt)
        return out


def test_kill_9_in_each_step_in_turn_repeats_no_finished_step(start_worker, settings, tmp_path):
    settings.DBQUEUE = FAST_DBQUEUE  # the short lease is fixed at enqueue time
    never = str(tmp_path / "never")  # attempt 1 stays in its step until the process dies
    jobs = {step: enqueue("five-steps", {"block": {step: never}}).id for step in STEPS}

    worker_a = start_worker("--concurrency", str(len(STEPS)), settings=FAST, name="A")
    wait_until(
        lambda: all(bodies(job_id).get((step, "start")) == [1] for step, job_id in jobs.items()),
        timeout=30,
        message="each job to be inside the step it is held in",
    )
    os.kill(worker_a.pid, signal.SIGKILL)
    assert worker_a.wait_exit(10) == -signal.SIGKILL

    start_worker(settings=FAST, name="B")
    for job_id in jobs.values():
        wait_until(
            lambda job_id=job_id: job_row(job_id)["state"] == "done",
            timeout=40,
            message=f"job {job_id} to be swept back and finished",
        )

    for held, job_id in jobs.items():
        got = bodies(job_id)
        cut = STEPS.index(held)
        row = job_row(job_id)
        assert row["attempts"] == 2, held
        for i, step in enumerate(STEPS):
            if i < cut:  # finished before the kill: recorded, replayed, never run again
                assert got[(step, "start")] == [1] and got[(step, "end")] == [1], (held, step)
            elif i == cut:  # cut off mid-step: not recorded, so it ran again, once
                assert got[(step, "start")] == [1, 2] and got[(step, "end")] == [2], (held, step)
            else:  # never reached before the kill
                assert got[(step, "start")] == [2] and got[(step, "end")] == [2], (held, step)
        recorded = [(name, n) for name, n, *_ in store.list_steps("default", job_id)]
        assert recorded == [(step, 1) for step in STEPS], held
        assert row["result"] == [1] * cut + [2] * (len(STEPS) - cut), held


def test_a_frozen_run_that_wakes_after_another_finished_the_job_runs_none_of_its_steps(
    start_worker, settings, tmp_path
):
    """The zombie: worker A is frozen (SIGSTOP) between two steps of a job; its lease runs out,
    worker B takes the job, replays the first step and runs the second. When A wakes, its next
    step finds that it no longer holds the job (its lease was not renewed for half a lease):
    the second step's body ran once, in B's run, and A's outcome is discarded."""
    settings.DBQUEUE = FAST_DBQUEUE
    hold = tmp_path / "hold"
    job_id = enqueue("pausing-steps", {"hold": str(hold)}).id
    worker_a = start_worker(settings=FAST, name="A")
    wait_until(
        lambda: bodies(job_id).get(("reserve", "end")) == [1],
        timeout=30,
        message="the first run to record its first step",
    )
    os.kill(worker_a.pid, signal.SIGSTOP)  # no more heartbeats: the lease runs out
    try:
        start_worker(settings=FAST, name="B")
        wait_until(
            lambda: job_row(job_id)["state"] == "done",
            timeout=40,
            message="the job to be taken over and finished by B",
        )
        hold.touch()  # A, woken, goes straight on to its second step
    finally:
        os.kill(worker_a.pid, signal.SIGCONT)
    wait_until(
        lambda: bodies(job_id).get(("charge-called", "end")) == [2, 1],
        timeout=15,
        message="worker A, woken, to have called its second step",
    )
    got = bodies(job_id)
    assert got[("reserve", "start")] == [1] and got[("charge", "start")] == [2], got
    # A says it lost the job: its step's refusal, its heartbeat's notice, or (when its run
    # ended before either was logged) the fenced write of the run's outcome.
    said = worker_a.stderr()
    assert any(
        text in said for text in ("no longer holds the job", "lease lost", "the lease was lost")
    ), said
    assert job_row(job_id)["result"] == {"step": "charge", "attempt": 2}
    assert job_row(job_id)["attempts"] == 2
