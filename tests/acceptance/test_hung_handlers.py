"""Handlers that hang forever, helper threads that die, connections killed between jobs: with
real ``run_jobqueue`` processes, in both execution modes."""

import json
import signal

import pytest

from django_dbqueue import enqueue
from tests.acceptance.helpers import (
    effects,
    enqueue_jobs,
    rows,
    states,
    terminate_backends,
    wait_all_in_state,
)
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"


@pytest.fixture(autouse=True)
def fast_leases(settings):
    settings.DBQUEUE = FAST_DBQUEUE  # leases are fixed at enqueue time


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_fleet_where_some_jobs_hang_forever_still_runs_every_other_job(start_worker, mode):
    """4 jobs hang on every attempt (timeout 1 s, 2 attempts: 8 hung runs); 2 worker processes
    with 2 slots each. Every ordinary job runs, exactly once; the hanging ones end dead."""
    hanging = enqueue_jobs("hang", 4)
    ordinary = enqueue_jobs("record", 150)
    supervisor = start_worker(
        "--processes", "2", "--concurrency", "2", "--execution", mode, settings=FAST
    )
    wait_all_in_state(ordinary, "done", timeout=120)
    wait_all_in_state(hanging, "dead", timeout=60)
    ran = [job_id for job_id, *_ in effects(ordinary)]
    assert sorted(ran) == sorted(ordinary), "every ordinary job ran exactly once"
    for (errors,) in rows("SELECT errors::text FROM dbqueue_job WHERE id = ANY(%s)", [hanging]):
        errors = json.loads(errors)
        assert [e["class"] for e in errors] == ["TimeoutError", "TimeoutError"]
        assert "timeout of 1s" in errors[0]["message"]
        assert "last attempt" in errors[1]["message"]
    output = supervisor.stdout()
    if mode == "thread":
        # 8 hung runs on 2 processes allowed 2 replacement threads each: at least one process
        # passed its bound, exited non-zero and was restarted by the supervisor.
        assert "exited with code 3; restarting" in output, supervisor.output()
    else:
        # Hard time limit: the stuck child process was killed, its slot never lost.
        assert "exited with code" not in output, supervisor.output()
        assert "killing the handler process" in supervisor.stderr()
    supervisor.assert_alive()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_jobs_waiting_behind_a_hung_one_are_not_held_hostage(start_worker, mode):
    """Concurrency 1, one job hangs, three wait behind it (claimed in the same batch): they run
    once the hung run is given up, and ``--burst`` still ends."""
    hung = enqueue("hang", max_attempts=1).id
    waiting = enqueue_jobs("record", 3)
    worker = start_worker("--concurrency", "1", "--burst", "--execution", mode, settings=FAST)
    wait_all_in_state(waiting, "done", timeout=30)
    assert worker.wait_exit(60) == 0, worker.output()
    assert states([hung])["dead"] == 1  # given up at its timeout, its only attempt
    assert len(effects(waiting)) == 3


def test_past_the_hung_thread_limit_the_worker_exits_non_zero(start_worker, settings):
    """With HUNG_THREAD_LIMIT at the concurrency (1), the second hung run makes the worker give
    up: it hands back what it has not started and, with ``--on-give-up exit``, exits 3 for an
    external supervisor to restart it (by default it restarts itself in place: below)."""
    hanging = enqueue_jobs("hang", 2)
    worker = start_worker("--concurrency", "1", "--on-give-up", "exit", settings=FAST)
    assert worker.wait_exit(60) == 3, worker.output()
    assert "giving up" in worker.stderr() and "HUNG_THREAD_LIMIT" in worker.stderr()
    # Nothing stays running under the dead worker: given up runs were recorded as failed.
    assert states(hanging)["running"] == 0


def test_a_listener_thread_that_dies_stops_the_worker_non_zero(start_worker):
    (job_id,) = enqueue_jobs("record", 1)
    worker = start_worker(
        "--on-give-up", "exit", settings="tests.acceptance.settings_broken_listener"
    )
    assert worker.wait_exit(30) == 3, worker.output()
    assert "the listener thread crashed" in worker.stderr()
    assert states([job_id])["running"] == 0  # nothing left behind under a lease


def test_a_handler_connection_killed_between_jobs_does_not_fail_the_next_job(start_worker):
    worker = start_worker(
        "--concurrency", "1", settings="tests.acceptance.settings_kept_connections"
    )
    (first,) = enqueue_jobs("record", 1)
    wait_all_in_state([first], "done", timeout=30)
    # Kill every session of the worker: its handler thread's kept connection among them.
    killed = terminate_backends()
    assert killed
    wait_until(
        lambda: not rows("SELECT 1 FROM pg_stat_activity WHERE pid = ANY(%s)", [list(killed)]),
        message="the killed sessions gone",
    )
    second = enqueue_jobs("record", 3)
    wait_all_in_state(second, "done", timeout=30)
    attempts = rows(
        "SELECT attempts, jsonb_array_length(errors) FROM dbqueue_job WHERE id = ANY(%s)", [second]
    )
    assert all(a == 1 and not errors for a, errors in attempts), attempts
    worker.assert_alive()


def test_alone_at_the_defaults_a_worker_past_the_hung_thread_limit_restarts_in_place(
    start_worker,
):
    """No supervisor, the default concurrency (10) and HUNG_THREAD_LIMIT, a type with a timeout
    whose runs hang forever: 30 such jobs, 2 attempts each, pass the limit several times. The
    worker used to exit 3 there, leaving the rest pending; now it restarts in place, under the
    same pid, and drains every ordinary job. ``kill -9`` of that pid still stops it at once."""
    hanging = enqueue_jobs("hang", 30)
    ordinary = enqueue_jobs("record", 300)
    worker = start_worker(settings=FAST)
    worker.wait_for_output("giving up", timeout=60)
    ordinary += enqueue_jobs("record", 300)  # past the point where it used to exit 3
    try:
        wait_until(
            lambda: worker.stdout().count("restarting in place") >= 2 or not worker.alive(),
            timeout=120,
            message="two restarts in place",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{worker.output()}") from None
    worker.assert_alive()
    wait_all_in_state(ordinary, "done", timeout=120)
    wait_all_in_state(hanging, "dead", timeout=60)
    worker.assert_alive()
    ran = [job_id for job_id, *_ in effects(ordinary)]
    assert sorted(ran) == sorted(ordinary), "every ordinary job ran exactly once"
    assert f"restarted in place (pid {worker.pid})" in worker.stdout(), worker.output()
    assert "exited" not in worker.stdout()

    # The old images' sessions went with them: one session of the worker's own is left (never
    # more; none for a moment while the image that runs now connects, or restarts once more).
    def sessions():
        (count,) = rows(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'dbqueue worker%%'"
        )[0]
        assert count <= 1, f"{count} sessions of one worker process"
        return count

    wait_until(lambda: sessions() == 1, timeout=30, message="the worker's one session")

    worker.send(signal.SIGKILL)
    assert worker.wait_exit(10) == -signal.SIGKILL
    assert not worker.group_members()


def test_a_worker_restarted_in_place_stops_gracefully_on_sigterm(start_worker):
    """SIGTERM and SIGINT are blocked across the exec and let through once the new image has
    its handlers: a SIGTERM after the restart is a graceful stop, exit 0."""
    hanging = enqueue_jobs("hang", 2)
    worker = start_worker("--concurrency", "1", settings=FAST)
    worker.wait_for_output("restarted in place", stream="stdout", timeout=60)
    (job_id,) = enqueue_jobs("record", 1)
    wait_all_in_state([job_id], "done", timeout=30)  # the new image runs jobs
    worker.send(signal.SIGTERM)
    assert worker.wait_exit(30) == 0, worker.output()
    assert "SIGTERM received" in worker.stderr()
    assert states(hanging)["running"] == 0
