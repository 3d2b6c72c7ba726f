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
