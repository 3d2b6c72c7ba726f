"""SIGTERM in the middle of a batch, with a real ``run_jobqueue`` process: the batch's handler
outlives SHUTDOWN_GRACE, its jobs are handed back (pending, no attempt spent) while the handler
still runs, the handler then returns inside the process marking every job done, and those
outcomes are discarded: the jobs run again on the next worker, once each."""

import signal

import pytest

from django_dbqueue import enqueue_many
from tests.acceptance.helpers import rows, wait_all_in_state
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"  # SHUTDOWN_GRACE 3 s
GRACE = FAST_DBQUEUE["SHUTDOWN_GRACE"]


def effects_by(ids, kind):
    return rows(
        "SELECT job_id, attempt, pid FROM testapp_effect WHERE job_id = ANY(%s) AND worker = %s "
        "ORDER BY job_id",
        [ids, kind],
    )


def test_sigterm_past_the_grace_hands_a_running_batch_back_and_discards_its_outcomes(
    start_worker, settings
):
    settings.DBQUEUE = FAST_DBQUEUE
    ids = [j.id for j in enqueue_many([("accept-batch-hold", {"n": n}) for n in range(6)])]
    first = start_worker("--concurrency", "1", settings=FAST, name="first")
    wait_until(
        lambda: len(effects_by(ids, "started")) == len(ids),
        timeout=30,
        message="the batch of six to start in one call",
    )
    assert {pid for _, _, pid in effects_by(ids, "started")} == {first.pid}

    first.send(signal.SIGTERM)
    assert first.wait_exit(GRACE + 15) == 0
    assert "still running after" in first.stderr()
    # The handler returned after its jobs were handed back, inside the process (its
    # "returned" records), marking each one done: discarded, not written.
    assert [(j, a) for j, a, _ in effects_by(ids, "returned")] == [(i, 1) for i in ids]
    for job_id, state, attempts, leased, no_errors, no_result in rows(
        "SELECT id, state, attempts, leased_until, errors = '[]'::jsonb, result IS NULL "
        "FROM dbqueue_job WHERE id = ANY(%s)",
        [ids],
    ):
        ended = (state, attempts, leased, no_errors, no_result)
        assert ended == ("pending", 0, None, True, True), job_id

    # The next worker runs each of them once, as a first attempt.
    second = start_worker("--concurrency", "1", settings=FAST, name="second")
    wait_all_in_state(ids, "done", timeout=60)
    second.assert_alive()
    done = rows(
        "SELECT id, attempts, result = '{\"returned\": true}'::jsonb FROM dbqueue_job "
        "WHERE id = ANY(%s)",
        [ids],
    )
    assert sorted(done) == [(i, 1, True) for i in sorted(ids)]
    again = effects_by(ids, "started")
    assert sorted((j, a) for j, a, pid in again if pid == second.pid) == [(i, 1) for i in ids]


def test_process_mode_runs_each_batch_job_as_a_batch_of_one(start_worker, settings):
    """``--execution process``: the pool takes no batches (docs/batches.md, "a batch of one in
    process mode"); every job of a batch type reaches the handler alone, in a child, and ends
    done. (Found by the soak: the process pool was handed batches its threads could not run,
    and the worker held their jobs, renewed, without running them.)"""
    settings.DBQUEUE = FAST_DBQUEUE
    ids = [j.id for j in enqueue_many([("accept-batch", {"n": n}) for n in range(8)])]
    worker = start_worker("--concurrency", "2", "--execution", "process", settings=FAST)
    try:
        wait_all_in_state(ids, "done", timeout=60)
    except AssertionError:
        raise AssertionError(worker.stderr()) from None
    worker.assert_alive()
    ran = rows(
        "SELECT job_id, attempt, worker FROM testapp_effect WHERE job_id = ANY(%s) ORDER BY job_id",
        [ids],
    )
    assert ran == [(i, 1, "batch:1") for i in sorted(ids)]
    assert "Traceback" not in worker.stderr()
