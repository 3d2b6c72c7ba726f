"""``--burst`` and ``--max-jobs``: workers that exit on their own, with code 0."""

import pytest

from django_dbqueue import enqueue
from tests.acceptance.helpers import effects, enqueue_jobs, states
from tests.utils import job_row

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]


def test_burst_drains_due_jobs_and_leaves_scheduled_ones(start_worker):
    due = enqueue_jobs("record", 20)
    later = enqueue("record", {}, delay=3600).id

    worker = start_worker("--burst", "--concurrency", "4")
    assert worker.wait_exit(30) == 0

    assert states(due) == {"done": 20}
    assert len(effects(due)) == 20
    row = job_row(later)
    assert (row["state"], row["attempts"]) == ("pending", 0)
    assert effects([later]) == []


def test_max_jobs_exits_after_running_that_many(start_worker):
    job_ids = enqueue_jobs("record", 8)

    worker = start_worker("--max-jobs", "5", "--concurrency", "4")
    assert worker.wait_exit(30) == 0

    assert states(job_ids) == {"done": 5, "pending": 3}
    ran = {job_id for job_id, *_ in effects(job_ids)}
    assert len(ran) == 5 and len(effects(job_ids)) == 5
    for job_id in set(job_ids) - ran:
        assert job_row(job_id)["attempts"] == 0


def test_burst_with_processes_exits_when_the_children_are_done(start_worker):
    job_ids = enqueue_jobs("record", 40)
    supervisor = start_worker("--burst", "--processes", "2", "--concurrency", "2")
    assert supervisor.wait_exit(60) == 0
    assert states(job_ids) == {"done": 40}
    assert "restarting" not in supervisor.stdout()


def test_supervisor_children_stop_when_the_supervisor_is_killed(start_worker):
    import os
    import re
    import signal

    from tests.utils import wait_until

    supervisor = start_worker("--processes", "2", settings="tests.acceptance.settings_fast")
    wait_until(
        lambda: len(re.findall(r"pid (\d+)", supervisor.stdout())) == 2,
        timeout=30,
        message="children",
    )
    pids = [int(p) for p in re.findall(r"pid (\d+)", supervisor.stdout())]
    os.kill(supervisor.pid, signal.SIGKILL)

    def gone(pid):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                return stat.read().split(")")[-1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    wait_until(
        lambda: all(gone(pid) for pid in pids), timeout=30, message="orphaned children to stop"
    )
