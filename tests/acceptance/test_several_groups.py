"""Several hosts, as the database sees them: separate ``run_jobqueue --processes`` groups, each
with its own listener, against one database. Every job runs exactly once across the groups, and
a worker killed with ``kill -9`` mid-job in one group loses nothing."""

import os
import re
import signal

import pytest

from tests.acceptance.helpers import (
    effects,
    enqueue_jobs,
    rows,
    wait_all_in_state,
    wait_for_listeners,
)
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"
STARTED = re.compile(r"started worker (\d+) \(pid (\d+)\)")


def test_two_groups_share_the_work_and_survive_a_killed_worker(start_worker, settings):
    settings.DBQUEUE = FAST_DBQUEUE  # short leases: a killed worker's job comes back in seconds
    groups = [
        start_worker("--processes", "2", "--concurrency", "2", settings=FAST, name=f"host{i}")
        for i in (1, 2)
    ]
    wait_for_listeners(2)  # one LISTEN per group, not per process
    job_ids = enqueue_jobs("record", 400, {"sleep": 0.01})

    # Kill one worker of the first group while it runs jobs.
    def a_worker_mid_job():
        pids = {int(pid) for _, pid in STARTED.findall(groups[0].stdout())}
        running = rows("SELECT DISTINCT pid FROM testapp_effect WHERE job_id = ANY(%s)", [job_ids])
        busy = pids & {pid for (pid,) in running}
        return busy and min(busy)

    victim = wait_until(a_worker_mid_job, timeout=30, message="a worker of group 1 running jobs")
    os.kill(victim, signal.SIGKILL)
    wait_all_in_state(job_ids, "done", timeout=120)

    done = effects(job_ids)
    per_job = {}
    for job_id, *_ in done:
        per_job[job_id] = per_job.get(job_id, 0) + 1
    assert set(per_job) == set(job_ids)
    # Only a job the killed worker was running when it died may have run twice (at least once).
    repeated = {job_id for job_id, n in per_job.items() if n > 1}
    killed_runs = {job_id for job_id, _, _, pid in done if pid == victim}
    assert repeated <= killed_runs, (repeated, killed_runs)
    # At most what its slots held: 2 threads plus a prefetch of up to 4 x 2.
    assert len(repeated) <= 10
    # Both groups did work: SKIP LOCKED shares the backlog between hosts.
    by_group = {}
    for group in groups:
        pids = {int(pid) for _, pid in STARTED.findall(group.stdout())}
        by_group[group.name] = sum(1 for *_, pid in done if pid in pids)
    assert all(by_group.values()), by_group
    for group in groups:
        group.assert_alive()
    assert "exited with code -9; restarting" in groups[0].stdout()
