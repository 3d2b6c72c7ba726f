"""Rows a caller's transaction holds that a worker's write or claim must change along with its
own job's (issue 35): a limiter row (migration 0028's limited claim) and a workflow dependent
of a job that fails dead (store FAIL_HELD_JOB). Each is held open with a real session, as in
tests/integration/test_review_held_waits.py; the worker's statements run on a ``Session`` with
the ``lock_timeout`` a worker sets, counting every wait that timeout ended."""

import psycopg
import pytest

from django_dbqueue import enqueue, store, workflow
from django_dbqueue.acks import Acknowledger
from django_dbqueue.connections import connection_params
from django_dbqueue.models import Limiter
from tests.held import Entry, worker_session
from tests.utils import job_row

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "host:3:limits"


@pytest.fixture
def session():
    session = worker_session()
    yield session
    session.close()


def flow_params(queue_conc, types=()):
    """The limited claim's parameters for the queues ("default", "emails"), ``queue_conc`` the
    concurrency limit of each; ``types``: ``[(name, concurrency)]``."""
    return {
        "q_conc": list(queue_conc),
        "q_rate_n": [None, None],
        "q_rate_period": [None, None],
        "q_rate_key": [None, None],
        "t_names": [name for name, _ in types],
        "t_conc": [conc for _, conc in types],
        "t_rate_n": [None for _ in types],
        "t_rate_period": [None for _ in types],
        "t_rate_key": [None for _ in types],
    }


def claim(db, flow):
    return store.claim(
        db,
        worker_id=WORKER,
        queues=["default", "emails"],
        limits=[10, 10],
        limit=10,
        token=store.new_token(),
        flow=flow,
    )


HOLD_LIMITER = (
    "SELECT 1 FROM dbqueue_limiter WHERE scope = %s AND name = %s AND part = '' FOR UPDATE"
)


def test_a_held_queue_limiter_leaves_out_its_queue_and_claims_the_others(session, callers):
    """The limited queue's row held: none of its jobs is started (its limit cannot be counted),
    the other queue's are claimed at once, without a lock wait, and the claim says to look
    again soon. Once the caller ends, the limited queue is claimed within its limit."""
    Limiter.objects.get_or_create(scope="queue", name="default", part="")
    limited = [enqueue("record", {"n": n}).id for n in range(3)]
    plain = [enqueue("email", {"n": n}).id for n in range(2)]
    flow = flow_params([1, None])
    caller = callers(HOLD_LIMITER, ["queue", "default"])

    rows = claim(session, flow)

    assert sorted(row.id for row in rows) == sorted(plain)
    assert session.lock_waits == 0
    assert rows.reopen_in is not None and 0 < rows.reopen_in <= 1.0
    assert {job_row(i)["state"] for i in limited} == {"pending"}
    caller.commit()
    rows = claim(session, flow)
    assert [row.id for row in rows] == limited[:1]  # the limit of 1, counted under its row


def test_a_held_type_limiter_leaves_out_that_type_in_every_queue(session, callers):
    """A limited type's row held: its jobs are left out of every queue's claim; the other
    types' jobs of the same queue are claimed."""
    Limiter.objects.get_or_create(scope="type", name="record", part="")
    limited = enqueue("record", {"n": 1}, queue="emails").id
    other = enqueue("email", {"n": 1}).id
    caller = callers(HOLD_LIMITER, ["type", "record"])

    rows = claim(session, flow_params([None, None], types=[("record", 5)]))

    assert [row.id for row in rows] == [other]
    assert session.lock_waits == 0
    assert job_row(limited)["state"] == "pending"
    caller.commit()
    rows = claim(session, flow_params([None, None], types=[("record", 5)]))
    assert [row.id for row in rows] == [limited]


def test_a_dead_end_whose_dependent_is_held_is_put_off_without_a_lock_wait(session, callers):
    """A workflow job's last attempt fails: its dead end cancels its dependent, which a caller
    holds. The failure is put off (kept, its lease renewed) with no lock wait on the worker's
    connection, and written once the caller ends: the dependent then ends cancelled."""
    wf = workflow()
    parent = wf.add("record", {"p": 1}, max_attempts=1)
    wf.add("record", {"d": 1}, depends_on=[parent])
    parent_id, dependent_id = (job.id for job in wf.enqueue())
    token = store.new_token()
    (row,) = store.claim(
        "default", worker_id=WORKER, queues=["default"], limits=[1], limit=1, token=token
    )
    assert row.id == parent_id
    acks = Acknowledger(
        worker_id=WORKER, batch=100, async_commit=False, unknown_type_delay=1, unknown_type_grace=1
    )
    caller = callers("SELECT 1 FROM dbqueue_job WHERE id = %s FOR UPDATE", [dependent_id])
    error = {"attempt": 1, "class": "ValueError", "message": "boom", "traceback": "", "worker": ""}
    acks.fail(Entry(parent_id, token), error, delay=0)

    assert acks.flush_once(session) == 0
    assert session.lock_waits == 0
    assert acks.pending() == 1
    assert job_row(parent_id)["state"] == "running"
    caller.commit()
    acks._take_due(float("inf"))  # its retry's time, without waiting for it
    assert acks.flush_once(session) == 1
    assert job_row(parent_id)["state"] == "dead"
    assert job_row(dependent_id)["state"] == "cancelled"


def test_a_release_ending_cancelled_whose_dependent_is_held_comes_back_busy(session, callers):
    """At a stop, a job whose cancel was asked for ends cancelled instead of going back, which
    cancels its workflow dependent. With that dependent held by a caller the hand-back says
    busy (tried again while the worker stops) without a lock wait; the other job of the same
    hand-back goes back now."""
    wf = workflow()
    parent = wf.add("record", {"p": 1})
    wf.add("record", {"d": 1}, depends_on=[parent])
    parent_id, dependent_id = (job.id for job in wf.enqueue())
    other_id = enqueue("record", {"o": 1}).id
    token = store.new_token()
    rows = store.claim(
        "default", worker_id=WORKER, queues=["default"], limits=[2], limit=2, token=token
    )
    assert sorted(row.id for row in rows) == sorted([parent_id, other_id])
    with psycopg.connect(**connection_params("default"), autocommit=True) as conn:
        conn.execute(
            "UPDATE dbqueue_job SET cancel_requested_at = now() WHERE id = %s", [parent_id]
        )
    caller = callers("SELECT 1 FROM dbqueue_job WHERE id = %s FOR UPDATE", [dependent_id])

    ended, busy = store.hand_back(session, [(parent_id, token), (other_id, token)])

    assert (ended, busy) == ({other_id: "pending"}, {parent_id})
    assert session.lock_waits == 0
    caller.commit()
    assert store.hand_back(session, [(parent_id, token)]) == ({parent_id: "cancelled"}, set())
    assert job_row(dependent_id)["state"] == "cancelled"


HOLD_ADVISORY = (
    "SELECT pg_advisory_lock(hashtextextended('dbqueue limiter' || chr(31) || %s || chr(31)"
    " || %s || chr(31) || '', 0))"
)


def test_a_limiters_advisory_lock_held_elsewhere_costs_a_bounded_wait_and_keeps_the_limit(
    session, callers
):
    """Any role that can connect may take the advisory lock of a limiter's key and keep it (a
    session lock, not a transaction's). The claim waits for it at most 200 ms, then counts the
    limit under the limiter's row lock alone: the queue is claimed within its limit of 1, a
    second claim while the first job runs gets nothing of it, and the other queue is claimed
    every time. Before migration 0028 the claim waited for the lock until lock_timeout failed it
    whole, at every poll."""
    Limiter.objects.get_or_create(scope="queue", name="default", part="")
    limited = [enqueue("record", {"n": n}).id for n in range(3)]
    plain = [enqueue("email", {"n": n}).id for n in range(2)]
    flow = flow_params([1, None])
    holder = psycopg.connect(**connection_params("default"), autocommit=True)
    try:
        holder.execute(HOLD_ADVISORY, ["queue", "default"])

        rows = claim(session, flow)
        assert session.lock_waits == 0
        assert sorted(row.id for row in rows) == sorted([limited[0], *plain])

        rows = claim(session, flow)  # the first limited job still runs: no room
        assert list(rows) == []
        assert {job_row(i)["state"] for i in limited[1:]} == {"pending"}
    finally:
        holder.close()
