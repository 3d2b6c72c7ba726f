"""Review of issue 35's worker-side changes (branch review-worker): the waits that ``SKIP
LOCKED`` cannot pass over, which the worker's ``lock_timeout`` now ends, still cost the worker
(and the fleet) more than the one job whose row a caller holds.

Each test is a finding, marked ``xfail(strict=True)``: it documents the bug and fails the suite
("XPASS strict") once the bug is fixed, so that the mark is taken off with the fix. The races are
held open with real sessions, as in tests/integration/test_held_rows.py: a caller's transaction
on a plain connection holds a row lock; the worker's statements run on a ``Session`` with the
``lock_timeout`` a worker sets (0.2 s, the bound at HEARTBEAT_INTERVAL <= 0.8 s)."""

import contextlib

import psycopg
import pytest

from django_dbqueue import enqueue, store, workflow
from django_dbqueue.acks import Acknowledger
from django_dbqueue.connections import BUSY_ERRORS, connection_params
from django_dbqueue.sweeper import Sweeper
from tests.held import Entry, worker_session
from tests.utils import job_row

pytestmark = pytest.mark.django_db(transaction=True)

DEAD = "host:1:killed"  # a worker that is gone: no row in the registry
LIVE = "host:2:live"


@pytest.fixture
def session():
    session = worker_session()
    yield session
    session.close()


def claim_all(worker, queue, count):
    """Claim ``count`` due jobs of ``queue`` for ``worker`` under one token."""
    token = store.new_token()
    rows = store.claim(
        "default", worker_id=worker, queues=[queue], limits=[count], limit=count, token=token
    )
    assert len(rows) == count
    return token


def expire(job_id, seconds_ago):
    with psycopg.connect(**connection_params("default"), autocommit=True) as conn:
        conn.execute(
            "UPDATE dbqueue_job SET leased_until = now() - %s * interval '1 second' WHERE id = %s",
            [seconds_ago, job_id],
        )


def test_a_held_dependent_does_not_stop_the_sweeper_taking_back_other_expired_leases(session, held):
    """A worker killed mid-job (gone from the registry) held two jobs: a workflow job on its
    last attempt, whose dependent a caller's transaction holds (a ``select_for_update()``, a
    ``signal_job()`` run early by ``check_constraints()``), and an unrelated job. Both leases
    expired, the workflow job's first (it comes first in every sweep: ORDER BY leased_until).

    Swept back to dead, the workflow job fires dbqueue_settle_dependents, whose lock of the
    dependent waits for the caller; the session's lock_timeout ends the whole statement, and
    the unrelated job, which nothing holds, stays ``running`` too. Every sweep of every worker
    fails the same way for as long as the caller holds its row: the dead worker's jobs never
    come back. (Before issue 35 the sweep waited on the worker's only connection instead.)"""
    wf = workflow()
    parent = wf.add("record", {"p": 1}, queue="emails", max_attempts=1)
    wf.add("record", {"d": 1}, depends_on=[parent])
    parent_id, dependent_id = (job.id for job in wf.enqueue())
    other_id = enqueue("record", {"o": 1}).id
    claim_all(DEAD, "emails", 1)
    claim_all(DEAD, "default", 1)
    expire(parent_id, 20)
    expire(other_id, 10)
    caller = held(dependent_id, strength="FOR UPDATE")

    sweeper = Sweeper(db=session)  # a live worker's sweep, on its own Session
    # What Maintenance.guarded does with a sweep that failed: logs it, tries again later.
    with contextlib.suppress(BUSY_ERRORS):
        sweeper.rescue()
    assert job_row(other_id)["state"] == "pending", "the unrelated expired job was not swept"
    caller.commit()


def test_a_held_join_costs_the_worker_one_lock_wait_per_flush_not_one_per_job(session, held):
    """A fan-in workflow: 12 jobs and a join that depends on all of them. The worker ran the 12;
    a caller's transaction holds the join's row. Each completion must count the join down, so
    none can be written while the caller holds it, and each one is put off (that much is the
    design). But the flush waits lock_timeout for the batch, then again for each of the 12 alone
    as it narrows the batch down, and the same again at every retry (0.1 s doubling to 2 s):
    13 x lock_timeout (13 s at the default HEARTBEAT_INTERVAL) during which the worker's only
    connection renews no lease, claims nothing and writes no other outcome. A successful job of
    the same batch that nothing holds is written after all of them.

    It asks that one flush waits for the held row at most once. Counted, not timed: each
    LockNotAvailable is a full lock_timeout on the worker's connection."""
    wf = workflow()
    parents = [wf.add("record", {"p": n}, queue="emails") for n in range(12)]
    wf.add("record", {"join": True}, depends_on=parents)
    *parent_ids, join_id = (job.id for job in wf.enqueue())
    other_id = enqueue("record", {"o": 1}).id
    token = claim_all(LIVE, "emails", 12)
    other_token = claim_all(LIVE, "default", 1)
    acks = Acknowledger(
        worker_id=LIVE, batch=100, async_commit=False, unknown_type_delay=1, unknown_type_grace=1
    )
    caller = held(join_id, strength="FOR UPDATE")
    for job_id in parent_ids:
        acks.succeed(Entry(job_id, token), None)
    acks.succeed(Entry(other_id, other_token), None)

    acks.flush_once(session)

    assert job_row(other_id)["state"] == "done"
    assert acks.pending() == 12  # put off, their leases kept: nothing lost (as designed)
    assert session.lock_waits <= 1, (
        f"one flush waited lock_timeout {session.lock_waits} times on the worker's connection"
    )
    caller.commit()
