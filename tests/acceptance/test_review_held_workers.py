"""Review of issue 35's worker-side changes (branch review-worker), with real ``run_jobqueue``
processes: what a caller's transaction or a restart at the wrong moment still does to jobs it
does not touch.

Each test is a finding, marked ``xfail(strict=True)``: it documents the bug and fails the suite
("XPASS strict") once the bug is fixed, so that the mark is taken off with the fix."""

import contextlib

import psycopg
import pytest

from django_dbqueue import enqueue, workflow
from django_dbqueue.connections import connection_params
from django_dbqueue.models import BackgroundJob
from django_dbqueue.sweeper import Sweeper
from tests.acceptance.helpers import effects, enqueue_jobs, states, wait_all_in_state
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.acceptance.test_caller_locks import (
    Caller,
    _seconds,
    live_workers,
    now,
    ran_once,
    renewed_past,
    slow,
)
from tests.utils import job_row, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"
LEASE = FAST_DBQUEUE["LEASE"]


@pytest.fixture(autouse=True)
def fast_leases(settings):
    settings.DBQUEUE = FAST_DBQUEUE  # leases are fixed at enqueue time


@contextlib.contextmanager
def committed_at_the_end(caller):
    """The caller's transaction commits when the block ends, failed or not (a failed test's
    caller would otherwise hold its lock through the teardown's flush for two minutes)."""
    try:
        yield caller
    finally:
        caller.commit()


def test_a_held_workflow_dependent_does_not_stop_the_workers_claims_and_completions(
    start_worker, tmp_path
):
    """A backlog of 40 short jobs, and first (higher priority) a workflow job whose dependent a
    caller's transaction holds (``select_for_update()``; a ``signal_job()`` or ``cancel()``
    whose trigger ``check_constraints()`` ran early holds it the same way). The workflow job's
    completion must count that dependent down, so it waits for the caller: put off, as
    docs/concepts/worker.md#callers-transactions promises, "alone: the rest of its batch is
    written".

    But the worker's successes go out with its next claim, in one pipeline and one transaction
    (claiming.claim). The dependent's lock wait ends at lock_timeout and fails the claim with
    them; the successes are given back to the buffer and sent again with the next claim, which
    the backlog (the last claim came back full: want_capacity) makes due at once, every pass:
    nothing is claimed and nothing is written, the backlog's completions included, for as long
    as the caller holds its row. Only the caller's commit lets the worker go on."""
    wf = workflow()
    parent = wf.add("record", {"p": 1}, priority=10)
    wf.add("record", {"join": True}, depends_on=[parent])
    parent_id, join_id = (job.id for job in wf.enqueue())
    backlog = enqueue_jobs("record", 40)
    caller = Caller(lambda: BackgroundJob.objects.select_for_update().get(pk=join_id))

    with committed_at_the_end(caller):
        worker = start_worker("--concurrency", "2", settings=FAST)
        wait_until(lambda: ran_once([parent_id]), timeout=30, message="the workflow job's run")
        # While the caller holds the dependent: the backlog is claimed, run and written.
        wait_until(
            lambda: states(backlog)["done"] == len(backlog),
            timeout=6 * LEASE,
            message=f"the backlog done while the caller holds (now {dict(states(backlog))})",
        )
        assert job_row(parent_id)["state"] == "running"  # its completion waits for the caller
    wait_all_in_state([parent_id, join_id], "done", timeout=6 * LEASE)
    assert ran_once([*backlog, parent_id, join_id])
    worker.assert_alive()


def test_a_held_join_of_a_fan_in_does_not_cost_the_other_jobs_their_leases(start_worker, tmp_path):
    """The scene of tests/acceptance/test_caller_locks.py, with a fan-in workflow: 40 short jobs
    (queue emails, which only worker1 serves) and a join that depends on all of them, whose row
    a caller's transaction holds (``select_for_update()``) from before they run. Worker1 also
    runs three long jobs; worker2 idles beside it and sweeps. Worker1 has threads for all of
    them (no backlog: its completions are written on their own, not with a claim; finding 1).

    The 40 completions must count the join down, so they wait for the caller: put off, as
    designed. But each retry of them waits lock_timeout (0.2 s here, 1 s at the default
    HEARTBEAT_INTERVAL) for the batch and then once per job: 41 waits, 8 s here, in which
    worker1's loop renews no lease and refreshes no registry row. The long jobs' leases (4 s)
    lapse, worker1 looks stale (5 s), and worker2 takes them back and runs them again. At the
    defaults it takes a fan-in of 60 (60 x 1 s > LEASE); a caller holding several joins adds
    up the same way."""
    others_flag = tmp_path / "others"
    others = [slow(others_flag) for _ in range(3)]
    wf = workflow()
    parents = [wf.add("email", {"n": n}) for n in range(40)]
    wf.add("record", {"join": True}, depends_on=parents)
    *parent_ids, join_id = (job.id for job in wf.enqueue())
    caller = Caller(lambda: BackgroundJob.objects.select_for_update().get(pk=join_id))

    with committed_at_the_end(caller):
        worker1 = start_worker("--concurrency", "50", "--queues", "default,emails", settings=FAST)
        wait_until(
            lambda: states(others)["running"] == 3 and ran_once(others),
            timeout=30,
            message="the three long jobs running on worker1",
        )
        start_worker("--concurrency", "4", "--queues", "default", settings=FAST)
        wait_until(lambda: live_workers() == 2, timeout=30, message="worker2 in the registry")
        # The long jobs keep their leases while the caller holds the join: renewed past two
        # leases from then on, never taken back by worker2 (renewed_past fails at once if so).
        held_from = now()
        wait_until(
            lambda: renewed_past(others, held_from + 2 * _seconds(LEASE)),
            timeout=6 * LEASE,
            message="the long jobs' leases renewed past two leases while the caller holds",
        )
        assert states(parent_ids)["running"] == 40  # run, their completions put off
    wait_all_in_state([*parent_ids, join_id], "done", timeout=10 * LEASE)
    others_flag.touch()
    wait_all_in_state(others, "done", timeout=6 * LEASE)
    assert len(effects(others)) == 3, effects(others)
    worker1.assert_alive()


# A restart in place whose new image waits at its first import of these settings until the test
# lets it go (payload-free: the file's path comes with the environment): the window between the
# old image leaving the worker registry (shut_down's withdraw) and the new one entering it,
# held open at its exact point.
RESTART_SETTINGS = "tests.acceptance.settings_review_restart"


def test_a_restart_in_place_keeps_the_outcome_it_hands_over(start_worker, tmp_path, monkeypatch):
    """A job finished on a worker while a caller's transaction held its row: its success was
    put off (as designed) and, the worker giving up meanwhile (three keyed runs hang past their
    timeouts on two threads), handed to the new image with the restart
    (docs/concepts/shutdown.md: "an outcome it could not write | the new image writes it").

    The old image deletes its registry row as it stops, and the new one adds it again only on
    its first pass. In between the worker id looks gone: when the caller commits then, any
    worker's sweep takes the finished job back (LeaseExpired, its attempt counted) and the new
    image's write of the success is fenced out: the job runs a second time."""
    flag, gate = tmp_path / "finish", tmp_path / "restart-gate"
    monkeypatch.setenv("DBQUEUE_REVIEW_RESTART_GATE", str(gate))
    target = enqueue("slow-record", {"seconds": 120, "until_file": str(flag)}).id
    worker = start_worker("--concurrency", "2", settings=RESTART_SETTINGS)
    wait_until(lambda: ran_once([target]), timeout=30, message="the job running")
    # The caller's transaction: rolled back and closed should the test fail while it holds.
    with psycopg.connect(**connection_params("default")) as caller:
        caller.execute("SELECT 1 FROM dbqueue_job WHERE id = %s FOR UPDATE", [target])
        flag.touch()
        worker.wait_for_output("its row is locked by another transaction", timeout=30)
        worker_id = job_row(target)["worker_id"]
        for n in range(3):  # two threads: the third one hung past its timeout gives up
            enqueue(
                "serial-hang",
                {"account": f"acct-{n}", "until_file": str(tmp_path / "never")},
                max_attempts=1,
            )
        worker.wait_for_output("restarting in place", stream="stdout", timeout=60)
        # The old image stopped (and, today, deleted its registry row: shut_down's withdraw);
        # the new one waits at the gate and has run no statement yet.
        assert job_row(target)["state"] == "running"
        assert job_row(target)["worker_id"] == worker_id
        caller.execute(
            "UPDATE dbqueue_job SET leased_until = now() - interval '1 second' WHERE id = %s",
            [target],
        )  # its lease ran out while the caller held the row (it did, or does within LEASE)
        caller.commit()
    Sweeper().rescue()  # another worker's sweep, before the new image's first pass

    swept = job_row(target)
    gate.touch()
    assert (swept["state"], swept["errors"]) == ("running", []), swept
    worker.wait_for_output("restarted in place", stream="stdout", timeout=60)
    wait_all_in_state([target], "done", timeout=6 * LEASE)
    assert len(effects([target])) == 1, effects([target])


def test_a_held_limiter_row_does_not_stop_the_claims_of_other_queues(start_worker):
    """A worker serves a queue with a fleet-wide concurrency limit ("limited") and the plain
    "default" queue. A caller's transaction holds the limited queue's limiter row (a
    ``select_for_update()`` of it, an operator's script; the row is ours, and the design lists
    that among what must not stop a worker's claims of its other jobs). The worker's claim is
    one statement for all its queues, dbqueue_claim_within_limits(), which first locks the
    limiter rows of every limited queue it serves: the lock wait ends at lock_timeout and the
    whole claim fails, at every poll. The default queue's jobs, which no limit counts, are
    never claimed while the caller holds the row."""
    from django_dbqueue.models import Limiter
    from tests.acceptance.settings_flow import FLOW_DBQUEUE

    Limiter.objects.get_or_create(scope="queue", name="limited", part="")
    start_worker("--concurrency", "2", "--queues", "limited,default", settings=FLOW)
    wait_until(lambda: live_workers() == 1, timeout=30, message="the worker in the registry")
    caller = Caller(
        lambda: Limiter.objects.select_for_update().get(scope="queue", name="limited", part="")
    )
    with committed_at_the_end(caller):
        plain = [enqueue("record", {"n": n}).id for n in range(3)]
        wait_all_in_state(plain, "done", timeout=5 * FLOW_DBQUEUE["POLL_INTERVAL"] + LEASE)
    assert ran_once(plain)


FLOW = "tests.acceptance.settings_flow"
