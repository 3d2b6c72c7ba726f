"""``run_jobqueue --processes 2``: a parent that keeps two worker processes running."""

import os
import re
import signal

import pytest

from tests.acceptance.helpers import enqueue_jobs, rows, wait_all_in_state, wait_for_listeners
from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"
STARTED = re.compile(r"started worker (\d+) \(pid (\d+)\)")


def children(supervisor):
    """``{slot: pid}`` of the newest child in each slot, from the supervisor's output."""
    return {int(slot): int(pid) for slot, pid in STARTED.findall(supervisor.stdout())}


def pid_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still "exists" until reaped; count it as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def run_batch(count):
    job_ids = enqueue_jobs("record", count, {"sleep": 0.05})
    wait_all_in_state(job_ids, "done", timeout=30)
    return {
        pid
        for (pid,) in rows(
            "SELECT DISTINCT pid FROM testapp_effect WHERE job_id = ANY(%s)", [job_ids]
        )
    }


def test_supervisor_restarts_a_killed_child_and_stops_on_sigterm(start_worker):
    supervisor = start_worker("--processes", "2", "--concurrency", "2", settings=FAST)
    first = wait_until(
        lambda: len(c := children(supervisor)) == 2 and c, timeout=20, message="two children"
    )
    assert supervisor.pid not in first.values()
    wait_for_listeners(1)  # one LISTEN for the whole group, in the supervisor's listener process
    assert run_batch(60) <= set(first.values())  # the parent runs no jobs

    os.kill(first[0], signal.SIGKILL)
    restarted = wait_until(
        lambda: (c := children(supervisor))[0] != first[0] and c,
        timeout=20,
        message="the supervisor to restart child 0",
    )
    assert restarted[1] == first[1]
    wait_for_listeners(1)  # the group's listener outlives a worker
    ran = run_batch(60)
    assert ran <= {restarted[0], restarted[1]}
    assert restarted[0] in ran, "the restarted child ran no jobs"
    supervisor.assert_alive()

    supervisor.send(signal.SIGTERM)
    assert supervisor.wait_exit(30) == 0
    wait_until(
        lambda: not any(pid_exists(pid) for pid in restarted.values()),
        timeout=10,
        message="every child to exit",
    )
    assert "all workers stopped" in supervisor.stdout()
