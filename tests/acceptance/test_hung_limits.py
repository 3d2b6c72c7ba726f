"""A fleet-wide concurrency limit of N never has more than N handlers running, with real
``run_jobqueue`` processes: a thread-mode run past its timeout (it still runs: it counts), a
shutdown whose grace ends while a limited handler runs, and ``HUNG_THREAD_LIMIT`` counting the
threads stuck now, not every timeout ever (docs/concepts/claiming.md#timeouts).

Each run records its start and end (``clock_timestamp()``, pid) in testapp_serial_run
(tests/testapp/hung_jobs.py); a run without an end is still going until its process is gone."""

import datetime
import json
import signal

import pytest

from django_dbqueue import enqueue, enqueue_many
from tests.acceptance.helpers import enqueue_jobs, rows, states, wait_all_in_state
from tests.acceptance.settings_hung_limits import HUNG_LIMITS_DBQUEUE
from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

SETTINGS = "tests.acceptance.settings_hung_limits"
LIMIT = 2  # global_concurrency of the queue "limited2"
FOREVER = datetime.datetime.max.replace(tzinfo=datetime.UTC)


@pytest.fixture(autouse=True)
def hung_limits_settings(settings):
    settings.DBQUEUE = HUNG_LIMITS_DBQUEUE  # leases are fixed at enqueue time


def runs(gone=None):
    """``[(job_id, attempt, pid, started, end)]`` of the recorded runs of the limited queue. A
    run with no end is still going: until ``gone[pid]`` (when its process was seen dead), or
    for ever."""
    gone = gone or {}
    return [
        (job_id, attempt, pid, started, finished or gone.get(pid, FOREVER))
        for job_id, attempt, pid, started, finished in rows(
            "SELECT job_id, attempt, pid, started, finished FROM testapp_serial_run "
            "WHERE key = 'limited2' ORDER BY id"
        )
    ]


def most_at_once(recorded):
    """The most runs of ``recorded`` going at one instant (an end before a start at a tie)."""
    events = sorted(
        [(run[3], 1) for run in recorded] + [(run[4], -1) for run in recorded],
        key=lambda event: (event[0], event[1]),
    )
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def now_in_database():
    return rows("SELECT clock_timestamp()")[0][0]


def limited_jobs(job_type, count, **payload):
    return [
        job.id
        for job in enqueue_many(
            [{"type": job_type, "payload": payload, "queue": "limited2"}] * count
        )
    ]


def claimed_since(queue):
    """Returns once the worker that alone serves ``queue`` (an unlimited one) has run a claim
    that started after this call: a job enqueued now on that queue is done."""
    marker = enqueue("record", queue=queue).id
    wait_all_in_state([marker], "done", timeout=30)


def test_a_limited_run_past_its_timeout_counts_until_its_thread_returns(start_worker, tmp_path):
    """Thread mode, global_concurrency=2, two workers with 3 threads each, 4 jobs that hang
    past their timeout of 1 s until the test lets them return. At their timeout the first two
    stay `running` (their threads still run); the claims both workers make afterwards, with
    free threads, start none of the other two. Once the two return, their failures are written
    and everything runs, never more than 2 at once."""
    release = tmp_path / "return"
    jobs = limited_jobs("hang-recorded", 4, until_file=str(release))
    workers = [
        start_worker("--queues", f"limited2,{own}", "--concurrency", "3", settings=SETTINGS)
        for own in ("default", "emails")
    ]
    wait_until(
        lambda: sum(w.stderr().count("dbqueue timeout job=") for w in workers) >= LIMIT,
        timeout=30,
        message=f"the first {LIMIT} runs to pass their timeout",
    )
    for own in ("default", "emails"):
        claimed_since(own)  # each worker claimed, with free threads, after the timeouts
    assert most_at_once(runs()) <= LIMIT, runs()
    first = [job_id for job_id, *_ in runs()]
    assert len(first) == LIMIT, runs()
    # They still run: the limit still counts them, fleet-wide.
    assert (
        rows("SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state = 'running'", [first])[
            0
        ][0]
        == LIMIT
    )
    release.touch()
    wait_all_in_state(jobs, "done", timeout=60)
    recorded = runs()
    assert all(end != FOREVER for *_, end in recorded), recorded
    assert most_at_once(recorded) <= LIMIT, recorded
    # The timed-out runs failed their first attempt with the timeout, written when they ended.
    for (errors,) in rows("SELECT errors::text FROM dbqueue_job WHERE id = ANY(%s)", [first]):
        assert [e["class"] for e in json.loads(errors)] == ["TimeoutError"], errors
    for worker in workers:
        worker.assert_alive()


def test_a_limited_run_still_going_after_the_shutdown_grace_is_not_handed_back(
    start_worker, tmp_path
):
    """Thread mode, global_concurrency=2: worker 1 runs two limited jobs that outlast its
    shutdown grace (3 s); a third waits, and worker 2 waits for room. Worker 1 gets SIGTERM:
    after its grace it must not hand the two back while their threads still run (the test
    keeps the process, and the runs in it, alive until it has seen worker 2 claim). Worker 2
    starts nothing until worker 1 is gone; the jobs come back at lease expiry."""
    release, hold = tmp_path / "return", tmp_path / "exit"
    jobs = limited_jobs("run-recorded", 3, until_file=str(release), hold_exit_file=str(hold))
    first = start_worker("--queues", "limited2", "--concurrency", "2", settings=SETTINGS)
    wait_until(lambda: len(runs()) == LIMIT, timeout=30, message="worker 1 to start 2 runs")
    second = start_worker("--queues", "limited2,default", "--concurrency", "4", settings=SETTINGS)
    claimed_since("default")  # worker 2 is up and claiming; the limit is full
    started = [job_id for job_id, *_ in runs()]
    first.send(signal.SIGTERM)
    wait_until(
        lambda: (
            "not handed back" in first.stderr()
            or rows(
                "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state = 'running' "
                "AND worker_id LIKE %s",
                [started, f"%:{first.pid}:%"],
            )[0][0]
            < LIMIT
        ),
        timeout=30,
        message="worker 1 to decide about its running jobs at the end of its grace",
    )
    claimed_since("default")  # worker 2 claimed after that decision
    assert first.alive(), first.output()  # its runs still go on in it
    assert most_at_once(runs()) <= LIMIT, runs()
    hold.touch()
    assert first.wait_exit(30) == 0, first.output()
    gone = {first.pid: now_in_database()}
    release.touch()
    wait_all_in_state(jobs, "done", timeout=60)
    recorded = runs(gone)
    assert most_at_once(recorded) <= LIMIT, recorded
    second.assert_alive()


def test_hung_thread_limit_counts_the_threads_stuck_now_not_every_timeout(start_worker):
    """Concurrency 2 (HUNG_THREAD_LIMIT defaults to it): 8 jobs each run past their timeout
    and return a moment after it. Never more than 2 threads are stuck at once, so the worker
    never gives up: it ends its burst with exit 0, every job dead after its one attempt."""
    jobs = enqueue_jobs("slow-but-finishing", 8)
    worker = start_worker("--concurrency", "2", "--burst", settings=SETTINGS)
    assert worker.wait_exit(90) == 0, worker.output()
    assert "giving up" not in worker.stderr(), worker.output()
    assert worker.stderr().count("dbqueue timeout job=") == 8, worker.output()
    assert dict(states(jobs)) == {"dead": 8}
