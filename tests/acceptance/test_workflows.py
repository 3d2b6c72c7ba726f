"""Fan-in workflows drained by real worker processes, one of them killed with SIGKILL mid-run:
every callback runs once, after all its members, and none twice because of the release."""

import os
import signal

import pytest

from django_dbqueue import group
from tests.acceptance.helpers import rows, wait_all_in_state
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"
WORKFLOWS = 1000  # the issue asks for 1,000 fan-in workflows
MEMBERS = 3


def test_fan_in_workflows_survive_a_killed_worker(start_worker, settings):
    settings.DBQUEUE = FAST_DBQUEUE  # the short lease is fixed at enqueue time
    callbacks, members = [], []
    for _ in range(WORKFLOWS):
        *group_members, callback = group(
            *[("record", {"sleep": 0.02})] * MEMBERS, then=("collect-atomic", {})
        )
        callbacks.append(callback.id)
        members += [m.id for m in group_members]
    workers = [start_worker(settings=FAST, name=name) for name in ("A", "B", "C")]
    victim = workers[0]

    # Kill one worker while workflows are under way: callbacks are being released and run, and
    # it holds running jobs (and outcomes in its buffer) that the others must take back.
    def under_way():
        done = rows(
            "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state = 'done'", [callbacks]
        )[0][0]
        held = rows(
            "SELECT count(*) FROM dbqueue_job WHERE state = 'running' AND worker_id LIKE %s",
            [f"%{victim.pid}%"],
        )[0][0]
        return done >= 10 and held > 0

    wait_until(under_way, timeout=60, interval=0.005, message="workflows under way on the victim")
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.wait_exit(10) == -signal.SIGKILL
    left = rows(
        "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state <> 'done'", [callbacks]
    )[0][0]
    assert left > 0, "the kill came after every workflow had finished"
    wait_all_in_state(callbacks, "done", timeout=120)
    wait_all_in_state(members, "done", timeout=10)

    # Every callback committed exactly one run (its effect commits with its completion).
    runs = dict(
        rows(
            "SELECT job_id, count(*) FROM testapp_effect WHERE job_id = ANY(%s) GROUP BY job_id",
            [callbacks],
        )
    )
    assert runs == dict.fromkeys(callbacks, 1)
    # Each ran after all of its members had finished, and saw all their results.
    late = rows(
        """
        SELECT c.id FROM dbqueue_job AS c
        JOIN dbqueue_dependency AS e ON e.job_id = c.id
        JOIN dbqueue_job AS m ON m.id = e.depends_on_id
        WHERE c.id = ANY(%s)
        GROUP BY c.id, c.started_at, c.result
        HAVING c.started_at < max(m.finished_at) OR jsonb_array_length(c.result) <> %s
        """,
        [callbacks, MEMBERS],
    )
    assert late == []
    assert rows("SELECT count(*) FROM dbqueue_job WHERE waiting_on <> 0")[0][0] == 0
    swept = rows(
        "SELECT count(*) FROM dbqueue_job, jsonb_array_elements(errors) AS e "
        "WHERE e->>'class' = 'LeaseExpired'"
    )[0][0]
    print(f"{left} callbacks not done at the kill; {swept} runs of the killed worker swept back")
    for worker in workers[1:]:
        worker.assert_alive()
