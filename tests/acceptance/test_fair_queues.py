"""Fair queues (docs/fairness.md) with real run_jobqueue processes: one tenant's backlog of a few
thousand jobs, then 20 other tenants' single jobs, each of which starts within the bound the docs
state, counted in the workers' own claims as the database recorded them; a worker killed with
kill -9 mid-backlog, and nothing lost: every job done, each exactly once (one effect row, written
in the handler's transaction), the killed worker's jobs retried once."""

import math
import os
import signal

import pytest

from django_dbqueue import enqueue, enqueue_many
from tests.acceptance.helpers import rows, wait_all_in_state
from tests.acceptance.settings_fair import FAIR_DBQUEUE
from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAIR = "tests.acceptance.settings_fair"
BACKLOG = 4000
WORK = 0.02  # seconds per job: 4,000 jobs outlast both phases of the test
TENANTS = 20

# A worker's claims of the fair queue, as the database recorded them: the jobs one claim took
# share its worker and its started_at (the claim transaction's now()).
CLAIMS = """
SELECT worker_id, started_at, count(*) FROM dbqueue_job
WHERE queue = 'tenants' AND started_at IS NOT NULL
GROUP BY worker_id, started_at
"""
SINGLES = "SELECT id, created_at, started_at, worker_id FROM dbqueue_job WHERE id = ANY(%s)"


def enqueue_backlog():
    ids = []
    job = {"type": "fair-work", "payload": {"tenant": "big", "seconds": WORK}, "queue": "tenants"}
    for _ in range(BACKLOG // 1000):
        ids += [j.id for j in enqueue_many([job] * 1000)]
    return ids


def enqueue_singles(prefix):
    """One job for each of 20 tenants, one transaction each."""
    return [
        enqueue("fair-work", {"tenant": f"{prefix}{i:02}", "seconds": WORK}, queue="tenants").id
        for i in range(TENANTS)
    ]


def claims_of(worker):
    return sum(1 for w, _, _ in rows(CLAIMS) if f":{worker.pid}:" in w)


def check_the_bound(single_ids, workers):
    """Each job of ``single_ids`` was claimed within ceil(K / b) + 1 claims of one of ``workers``
    after it was enqueued (docs/fairness.md, "The bound"): K = 21 keys with due jobs (the
    backlog's and the 20 tenants'), b the smallest batch among those claims, and the one more
    claim a worker may have begun before the job's commit made it visible. Returns the waits."""
    claims = rows(CLAIMS)
    waits = []
    for job_id, created, started, claimed_by in rows(SINGLES, [single_ids]):
        counts = []
        for worker in workers:
            mine = [n for w, at, n in claims if f":{worker.pid}:" in w and created < at <= started]
            bound = math.ceil((TENANTS + 1) / min(mine)) + 1 if mine else 1
            counts.append((len(mine), bound, worker.name))
        assert any(n <= bound for n, bound, _ in counts), (job_id, claimed_by, counts)
        waits.append((started - created).total_seconds())
    return waits


def test_tenants_start_within_the_bound_behind_a_backlog_through_a_kill_9(start_worker, settings):
    settings.DBQUEUE = FAIR_DBQUEUE  # the fair queue, and the short lease fixed at enqueue
    backlog = enqueue_backlog()
    worker_a = start_worker("--queues", "tenants", "--concurrency", "4", settings=FAIR, name="A")
    worker_b = start_worker("--queues", "tenants", "--concurrency", "4", settings=FAIR, name="B")
    wait_until(
        lambda: claims_of(worker_a) and claims_of(worker_b),
        timeout=30,
        message="both workers to have claimed from the backlog",
    )

    # Phase 1: both workers run the backlog when the 20 tenants come.
    first = enqueue_singles("t")
    wait_all_in_state(first, "done", timeout=30)
    waits = check_the_bound(first, [worker_a, worker_b])
    left = rows(
        "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state = 'pending'", [backlog]
    )
    assert left[0][0] > 1000, "the backlog ran out before the tenants came: nothing was shown"

    # kill -9 of A in the middle of the backlog, holding claimed jobs.
    held = rows(
        "SELECT count(*) FROM dbqueue_job WHERE state = 'running' AND worker_id LIKE %s",
        [f"%:{worker_a.pid}:%"],
    )[0][0]
    assert held > 0
    os.kill(worker_a.pid, signal.SIGKILL)
    assert worker_a.wait_exit(10) == -signal.SIGKILL

    # Phase 2: B alone, with A's jobs coming back from the sweeper as they expire.
    second = enqueue_singles("u")
    wait_all_in_state(second, "done", timeout=30)
    waits += check_the_bound(second, [worker_b])
    assert max(waits) < 5.0, waits  # informative: a plain queue would run them after the backlog

    everything = backlog + first + second
    wait_all_in_state(everything, "done", timeout=120)
    # Nothing lost, nothing done twice: one effect row per job (a killed run's rolled back).
    effects = dict(
        rows(
            "SELECT job_id, count(*) FROM testapp_effect WHERE job_id = ANY(%s) GROUP BY job_id",
            [everything],
        )
    )
    assert effects == dict.fromkeys(everything, 1)
    retried = rows(
        "SELECT attempts, errors -> 0 ->> 'class' FROM dbqueue_job "
        "WHERE id = ANY(%s) AND attempts > 1",
        [everything],
    )
    # The jobs A held when it died, back through the sweeper once; no other job ran twice.
    assert retried and all(r == (2, "LeaseExpired") for r in retried), retried
    worker_b.assert_alive()


def test_an_idle_worker_runs_a_free_tenants_job_while_other_tenants_wait_their_serial_turn(
    start_worker, settings
):
    """Tenants a..f each have a long job running on worker A (serial key = tenant) and one more
    waiting for its turn; tenant g then enqueues one job. Worker B, idle, with one thread, runs
    g's job at once: its fair claims pass over the six blocked tenants (before the fix they
    walked as many blocked keys as they had slots, claimed nothing, and never reached g). The
    waiting jobs stay pending while their tenant's job runs."""
    settings.DBQUEUE = FAIR_DBQUEUE
    running, waiting = [], []
    for tenant in "abcdef":
        payload = {"tenant": tenant, "seconds": 20}
        running.append(enqueue("fair-work", payload, queue="tenants", serial_key=tenant).id)
        waiting.append(enqueue("fair-work", payload, queue="tenants", serial_key=tenant).id)
    # A takes the six and nothing more (--max-jobs: no prefetch of g beside them).
    worker_a = start_worker(
        "--queues", "tenants", "--concurrency", "6", "--max-jobs", "6", settings=FAIR, name="A"
    )
    wait_all_in_state(running, "running", timeout=30)
    g = enqueue("fair-work", {"tenant": "g", "seconds": 0}, queue="tenants").id
    worker_b = start_worker("--queues", "tenants", "--concurrency", "1", settings=FAIR, name="B")
    wait_all_in_state([g], "done", timeout=15)
    [(claimed_by,)] = rows("SELECT worker_id FROM dbqueue_job WHERE id = %s", [g])
    assert f":{worker_b.pid}:" in claimed_by, claimed_by
    states = rows(
        "SELECT state, count(*) FROM dbqueue_job WHERE id = ANY(%s) GROUP BY 1", [waiting]
    )
    assert states == [("pending", 6)], states
    worker_a.assert_alive()
    worker_b.assert_alive()
