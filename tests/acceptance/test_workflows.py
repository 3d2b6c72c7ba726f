"""Fan-in workflows drained by real worker processes, one of them killed with SIGKILL mid-run:
every callback runs once, after all its members, and none twice because of the release."""

import datetime
import os
import signal
import threading

import pytest
from django.db import connections, transaction

from django_dbqueue import cancel, enqueue, group
from tests.acceptance.helpers import effect_count, enqueue_jobs, rows, wait_all_in_state
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.utils import job_row, wait_until

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


@pytest.mark.parametrize("write", ["workflow", "cancel"])
def test_a_callers_open_transaction_does_not_stop_the_worker_of_a_running_job(
    start_worker, settings, tmp_path, write
):
    """A caller adds a workflow job after a running one, or cancels it, then keeps its
    transaction open for longer than the lease. The worker holding the job keeps beating for
    it (its lease goes on past the original one, nothing is swept), and completes and claims
    other jobs meanwhile; the write reaches the running job at the caller's commit (migration
    0015). Before, the caller's statement locked the job's row until its commit: the worker's
    heartbeat, completion and next claim waited for it, and past the lease its jobs were swept
    and ran again."""
    settings.DBQUEUE = FAST_DBQUEUE  # the 4 s lease is fixed at enqueue time
    flag = tmp_path / "finish"
    running = enqueue("slow-record", {"until_file": str(flag)}).id
    worker = start_worker("--concurrency", "2", settings=FAST)
    wait_until(lambda: effect_count([running]) == 1, timeout=30, message="the job to start")
    others, outcome = [], {}

    def other_jobs():  # on a connection of its own: the test's is inside the caller's atomic
        try:
            others.extend(enqueue_jobs("record", 5))
        finally:
            connections["default"].close()

    with transaction.atomic():
        if write == "workflow":
            outcome["job"] = enqueue("collect", {}, depends_on=[running])
        else:
            outcome["cancel"] = cancel(running, by="ops")
        started = rows("SELECT clock_timestamp()")[0][0]
        producer = threading.Thread(target=other_jobs)
        producer.start()
        producer.join(30)
        wait_all_in_state(others, "done", timeout=30)  # completed and claimed meanwhile
        # Held past the lease: the worker's heartbeat must go on extending it.
        wait_until(
            lambda: (
                rows("SELECT leased_until FROM dbqueue_job WHERE id = %s", [running])[0][0]
                > started + datetime.timedelta(seconds=FAST_DBQUEUE["LEASE"] * 1.5)
            ),
            timeout=30,
            message="the heartbeat to extend the lease past the caller's transaction",
        )
        assert rows("SELECT state, attempts FROM dbqueue_job WHERE id = %s", [running]) == [
            ("running", 1)
        ]
    flag.touch()
    if write == "workflow":
        wait_all_in_state([running, outcome["job"].id], "done", timeout=30)
    else:
        assert outcome["cancel"] == {running: "cancelling"}
        wait_all_in_state([running], "cancelled", timeout=30)
        assert job_row(running)["cancelled_by"] == "ops"
    assert effect_count([running]) == 1  # it ran once: never swept
    worker.assert_alive()
