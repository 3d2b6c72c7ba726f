"""A caller's transaction that holds rows of ours never holds up a worker's other jobs
(docs/concepts/worker.md#callers-transactions), statement by statement, with real sessions: a
plain connection holds a job's row lock (as a ``select_for_update()`` or a deferred trigger run
early by ``SET CONSTRAINTS ALL IMMEDIATE`` does) while the worker's statements run on a Session
of their own, as the worker's loop runs them.

Each race is held open at its exact point: the lock is taken, the worker's statement runs (and
must not wait: the Session's lock_timeout would fail it instead of hanging the test), the lock
is let go, and the statements that follow run in one order, then in the other."""

import pytest
from django.db import connection

from django_dbqueue import enqueue, store, workflow
from django_dbqueue.acks import Acknowledger
from django_dbqueue.connections import BUSY_ERRORS, Session
from django_dbqueue.sweeper import Sweeper
from tests.held import Entry, worker_session
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ERROR = {"attempt": 1, "class": "ValueError", "message": "boom", "traceback": "", "worker": "w"}
LIVE = "host:1:live"  # a worker with a fresh row in the registry


@pytest.fixture
def session():
    """The worker's own connection, with the lock_timeout a worker sets: a statement that
    waited for the held row would fail with LockNotAvailable after 0.2 s."""
    session = worker_session()
    yield session
    session.close()


def claim(count, worker=LIVE, queue="default"):
    """Enqueue ``count`` jobs and claim them under one token; returns ``(ids, token)``."""
    ids = [enqueue("record", {"n": n}, queue=queue).id for n in range(count)]
    token = store.new_token()
    rows = store.claim(
        "default", worker_id=worker, queues=[queue], limits=[count], limit=count, token=token
    )
    assert sorted(row.id for row in rows) == sorted(ids)
    return ids, token


def leased_until(job_id):
    return job_row(job_id)["leased_until"]


def expire(job_id):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET leased_until = now() - interval '1 second' WHERE id = %s",
            [job_id],
        )


def announce(worker, *, stale_in):
    """``worker``'s row in the registry, stale ``stale_in`` seconds from now (negative: stale)."""
    store.announce_worker(
        "default",
        worker=worker,
        host="host",
        pid=1,
        version="test",
        queues=["default"],
        concurrency=1,
        execution="thread",
        group_pid=None,
        state="running",
        stale=stale_in,
        expire=max(stale_in, 0) + 60,
        running=1,
    )


def test_a_session_of_a_worker_bounds_its_lock_waits(session):
    """Set on the connection when its backend is its own (never through a pooler)."""
    assert session.execute("SHOW lock_timeout", {}) == [("200ms",)]
    plain = Session("default")
    try:
        assert plain.execute("SHOW lock_timeout", {}) == [("0",)]
    finally:
        plain.close()


def test_the_heartbeat_passes_over_a_held_row_and_renews_the_others(session, held):
    (a, b, c), token = claim(3)
    before = {job_id: leased_until(job_id) for job_id in (a, b, c)}
    caller = held(a, strength="FOR UPDATE")  # Job.objects.select_for_update().get(id=a)

    kept, busy = store.renew_leases(session, [(a, token), (b, token), (c, token), (c, 1)])

    assert (set(kept), busy) == ({(b, token), (c, token)}, {(a, token)})
    assert leased_until(b) > before[b] and leased_until(c) > before[c]
    assert leased_until(a) == before[a]  # not renewed, and not lost: busy
    caller.commit()
    kept, busy = store.renew_leases(session, [(a, token)])
    assert (set(kept), busy) == ({(a, token)}, set())
    assert leased_until(a) > before[a]


def test_a_batch_of_completions_writes_the_free_rows_and_keeps_the_held_one(session, held):
    (a, b, c), token = claim(3)
    acks = Acknowledger(
        worker_id=LIVE, batch=100, async_commit=False, unknown_type_delay=1, unknown_type_grace=1
    )
    entries = {job_id: Entry(job_id, token) for job_id in (a, b, c)}
    caller = held(b)
    for entry in entries.values():
        acks.succeed(entry, '"ok"')

    assert acks.flush_once(session) == 2
    assert [job_row(i)["state"] for i in (a, b, c)] == ["done", "running", "done"]
    # Kept aside, its lease renewed with the rest until it is written, not lost nor fenced.
    assert (acks.pending(), acks.ready(), acks.fenced, acks.busy) == (1, 0, 0, 1)
    assert acks.pending_keys() == [(b, token)]
    assert acks.flush_once(session) == 0  # not due yet: no statement
    caller.commit()
    wait_until(lambda: flushed(acks, session), timeout=5, message="the put-off completion")
    assert job_row(b)["state"] == "done" and acks.pending() == 0 and acks.succeeded == 3


def test_a_failure_and_a_cancelled_end_wait_for_a_held_row_without_blocking(session, held):
    (a, b), token = claim(2)
    acks = Acknowledger(
        worker_id=LIVE, batch=100, async_commit=False, unknown_type_delay=1, unknown_type_grace=1
    )
    callers = [held(a), held(b)]
    acks.fail(Entry(a, token), ERROR, delay=0)
    acks.cancel(Entry(b, token))

    assert acks.flush_once(session) == 0
    assert (acks.pending(), acks.fenced) == (2, 0)
    for caller in callers:
        caller.commit()
    wait_until(lambda: flushed(acks, session), timeout=5, message="the put-off writes")
    assert (job_row(a)["state"], job_row(a)["attempts"]) == ("pending", 1)
    assert job_row(a)["errors"][0]["class"] == "ValueError"  # the error history is kept
    assert job_row(b)["state"] == "cancelled"


def test_a_completion_whose_workflow_dependent_is_held_is_written_once_it_is_free(session, held):
    """The dependent's countdown commits with the completion or not at all: the completion
    whose dependent's row a caller holds waits no longer than the lock_timeout, is put off,
    and releases the dependent once written (never left waiting). The others of the batch are
    written at once."""
    wf = workflow()
    parent = wf.add("record", {"p": 1}, queue="emails")
    wf.add("record", {"d": 1}, depends_on=[parent])
    parent_id, dependent = (job.id for job in wf.enqueue())
    (other,), token = claim(1)
    parent_token = store.new_token()
    store.claim(
        "default", worker_id=LIVE, queues=["emails"], limits=[1], limit=1, token=parent_token
    )
    assert job_row(parent_id)["state"] == "running"
    acks = Acknowledger(
        worker_id=LIVE, batch=100, async_commit=False, unknown_type_delay=1, unknown_type_grace=1
    )
    caller = held(dependent)
    acks.succeed(Entry(parent_id, parent_token), None)
    acks.succeed(Entry(other, token), None)

    assert acks.flush_once(session) == 1
    assert job_row(other)["state"] == "done"
    assert counted(parent_id, dependent) == ("running", "waiting")
    caller.commit()
    wait_until(lambda: flushed(acks, session), timeout=5, message="the put-off completion")
    assert counted(parent_id, dependent) == ("done", "pending")


def flushed(acks, session):
    """One flush (what the worker's loop does when an outcome put off is due): True once
    nothing is left to write."""
    acks.flush_once(session)
    return acks.pending() == 0


def counted(*job_ids):
    return tuple(job_row(job_id)["state"] for job_id in job_ids)


def test_releases_pass_over_held_rows(session, held):
    (a, b), token = claim(2)
    caller = held(a)
    assert store.hand_back(session, [(a, token), (b, token)]) == ({b: "pending"}, {a})
    caller.commit()
    assert store.hand_back(session, [(a, token)]) == ({a: "pending"}, set())

    (c, d), _token = claim(2, worker="host:2:lost", queue="emails")
    caller = held(c)
    released, busy = store.hand_back_unknown(session, worker="host:2:lost", known=[])
    assert (released, busy) == ({d}, {c})
    assert job_row(c)["state"] == "running"
    caller.commit()
    assert store.hand_back_unknown(session, worker="host:2:lost", known=[]) == ({c}, set())


@pytest.mark.parametrize("first", ["sweeper", "heartbeat"])
def test_a_live_workers_expired_lease_is_renewed_not_taken_back(session, held, first):
    """The lease of a job whose row a caller held past its end: when the caller commits, the
    sweeper (another worker's) and the heartbeat (its own worker's) run in either order. The
    worker is alive (its registry row is fresh) and still runs the job: the sweeper leaves it,
    the heartbeat renews it. It used to be taken back and run a second time beside the first."""
    (job_id,), token = claim(1)
    announce(LIVE, stale_in=30)
    caller = held(job_id)
    expire_under_lock(job_id, caller)
    sweeper = Sweeper()  # another worker's: no owner
    assert store.renew_leases(session, [(job_id, token)]) == ({}, {(job_id, token)})
    assert sweeper.rescue()["rescued"] == 0  # locked: passed over
    caller.commit()

    if first == "sweeper":
        assert sweeper.rescue() == {"rescued": 0, "dead": 0, "cancelled": 0}
        assert job_row(job_id)["state"] == "running"
    kept, busy = store.renew_leases(session, [(job_id, token)])
    assert (set(kept), busy) == ({(job_id, token)}, set())
    assert sweeper.rescue()["rescued"] == 0
    row = job_row(job_id)
    assert (row["state"], row["lease_token"], row["attempts"]) == ("running", token, 1)
    assert row["leased_until"] > now()


def test_an_expired_lease_is_taken_back_once_its_worker_is_gone_or_lets_it_go(session):
    """The other side of the rule: a worker whose registry row is stale (killed, hung, cut
    off) or gone loses its expired jobs to any sweeper; a live worker's own sweeper takes back
    the expired jobs of its own that it no longer holds (an outcome it gave up writing)."""
    (stale_job,), _ = claim(1, worker="host:3:stale")
    (gone_job,), _ = claim(1, worker="host:4:gone")
    (kept_job, dropped_job), token = claim(2)
    for job_id in (stale_job, gone_job, kept_job, dropped_job):
        expire(job_id)
    announce("host:3:stale", stale_in=-1)
    announce(LIVE, stale_in=30)

    assert Sweeper().rescue()["rescued"] == 2
    assert counted(stale_job, gone_job, kept_job, dropped_job) == (
        "pending",
        "pending",
        "running",
        "running",
    )
    own = Sweeper(owner=lambda: (LIVE, {token + 1}))  # holds neither of them any more
    own_known = Sweeper(owner=lambda: (LIVE, {token}))
    recovering = Sweeper(owner=lambda: None)  # lost its connection: cannot tell yet
    assert own_known.rescue()["rescued"] == 0
    assert recovering.rescue()["rescued"] == 0
    assert own.rescue()["rescued"] == 2
    assert job_row(kept_job)["errors"][0]["class"] == "LeaseExpired"  # the attempt counts


def test_a_wait_inside_a_statement_ends_at_the_lock_timeout(session, held):
    """What SKIP LOCKED cannot pass over (a trigger's or a function's wait) ends at the
    session's lock_timeout, as LockNotAvailable (BUSY_ERRORS), not as a lost connection."""
    (job_id,), _ = claim(1)
    caller = held(job_id)
    with pytest.raises(BUSY_ERRORS):
        session.execute("UPDATE dbqueue_job SET priority = 1 WHERE id = %(id)s", {"id": job_id})
    assert session.execute("SELECT 1", {}) == [(1,)]  # the connection is fine
    caller.commit()


def expire_under_lock(job_id, caller):
    """Make the held job's lease end in the past: written by the caller's own transaction (the
    only one that can write the row now), as if the lease had run out while it held the row."""
    caller.conn.execute(
        "UPDATE dbqueue_job SET leased_until = now() - interval '1 second' WHERE id = %s",
        [job_id],
    )


def now():
    return scalar("SELECT now()")
