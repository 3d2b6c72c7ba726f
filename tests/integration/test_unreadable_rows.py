"""Rows the worker cannot read (docs/handlers.md, "Rows Python cannot read"): a payload Python's
json refuses or misreads, a timestamp outside Python's years. Each poison row is written by
direct SQL (as anyone who can write the table could), in a claim with good jobs; the poison job
is dead at its first attempt with ``UnreadableJob`` naming the column and the reason, the good
ones run once, no other job is charged, and the worker goes on.

Every claim statement is covered: the plain claim (CLAIM_JOBS), the fair claim, the limited
claim (typed rows) and a batch's top-up, each through its fast path's failure and the read back
row by row.
"""

import json

import pytest
from django.db import connection

from django_dbqueue import enqueue, enqueue_many, signals
from django_dbqueue.worker import Worker
from tests.poison import POISON, unbounded
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _unbounded(transactional_db):
    """The timestamps written here are refused by the table since migration 0027
    (test_bounded_rows.py): its CHECKs are dropped for each test, as an owner of the table could
    drop them, to hold the worker and the admin to coping with such rows all the same."""
    with unbounded():
        yield


UNREADABLE = "django_dbqueue.exceptions.UnreadableJob"


def poison(job_id, kind):
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE dbqueue_job SET {POISON[kind][0]} WHERE id = %s", [job_id])


def effects_of(job_id):
    return scalar("SELECT count(*) FROM testapp_effect WHERE job_id = %s", [job_id])


def poison_row(job_id):
    """The poison job's state, attempts, whether it is finished and leased, and its errors:
    never its unreadable columns (job_row's ``SELECT *`` would fail on them)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, attempts, finished_at IS NOT NULL, leased_until IS NOT NULL, "
            "errors::text FROM dbqueue_job WHERE id = %s",
            [job_id],
        )
        state, attempts, finished, leased, errors = cursor.fetchone()
    return {
        "state": state,
        "attempts": attempts,
        "finished": finished,
        "leased": leased,
        "errors": json.loads(errors),
    }


def assert_dead_unreadable(job_id, kind, worker_id=None):
    row = poison_row(job_id)
    assert (row["state"], row["attempts"]) == ("dead", 1), row
    assert row["finished"] and not row["leased"]
    (error,) = row["errors"]
    assert error["class"] == UNREADABLE
    assert error["message"].startswith(POISON[kind][1]), error["message"]
    assert error["attempt"] == 1
    if worker_id is not None:
        assert error["worker"] == worker_id
    assert effects_of(job_id) == 0  # never run


@pytest.fixture
def idle_worker(fast_settings):
    """A worker whose pool is not started: its claim is driven by hand (run_once)."""
    workers = []

    def make(**kwargs):
        worker = Worker(**kwargs)
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        if worker.pool._threads:
            worker.stop()
            worker.pool.stop(timeout=5)
        worker.session.close()


def _run_claimed(worker, count):
    """Start the pool on what the worker claimed; write the ``count`` outcomes."""
    worker.pool.start()
    wait_until(lambda: worker.acks.pending() >= count, message=f"{count} outcomes")
    worker.acks.flush_once(worker.session)


def _claim_with_poison(idle_worker, kind, **worker_kwargs):
    good = [job.id for job in enqueue_many([("record", {"n": i}) for i in range(5)])]
    bad = enqueue("record", {"n": "poison"}).id
    poison(bad, kind)
    worker = idle_worker(concurrency=8, **worker_kwargs)
    return worker, good, bad


@pytest.mark.parametrize("kind", sorted(POISON))
def test_a_poison_row_fails_alone_dead_at_its_first_attempt(idle_worker, kind):
    dead = []
    signals.job_dead.connect(
        lambda sender, **kw: dead.append((kw["job_id"], kw["error"]["class"])),
        weak=False,
        dispatch_uid="t-unreadable",
    )
    try:
        worker, good, bad = _claim_with_poison(idle_worker, kind)
        claimed, _ = worker.run_once()
        assert claimed == 5  # one claim took all six; the five readable ones are handed out
        assert {e.ctx.id for e in worker.inflight.snapshot()} == set(good)
        assert worker.acks.flush_once(worker.session) == 1  # the poison job's failure
        assert_dead_unreadable(bad, kind, worker.worker_id)
        assert dead == [(bad, UNREADABLE)]
        # Its batch-mates: claimed once, charged one attempt, running under their lease.
        for job_id in good:
            assert (job_row(job_id)["state"], job_row(job_id)["attempts"]) == ("running", 1)
        _run_claimed(worker, 5)
        for job_id in good:
            row = job_row(job_id)
            assert (row["state"], row["attempts"], row["errors"]) == ("done", 1, [])
            assert effects_of(job_id) == 1
        assert worker.run_once()[0] == 0  # the poison row is not claimed again
        assert poison_row(bad)["attempts"] == 1
    finally:
        signals.job_dead.disconnect(dispatch_uid="t-unreadable")


@pytest.mark.parametrize("kind", ["payload-5000-digits", "created_at-bc", "run_after-bc"])
def test_the_running_worker_survives_a_poison_row_and_runs_the_rest(start_worker, kind):
    good = [job.id for job in enqueue_many([("record", {"n": i}) for i in range(5)])]
    bad = enqueue("record", {"n": "poison"}).id
    poison(bad, kind)
    worker = start_worker(concurrency=8)
    wait_until(
        lambda: (
            poison_row(bad)["state"] == "dead" and all(job_row(i)["state"] == "done" for i in good)
        ),
        message="the poison job dead and the others done",
    )
    assert_dead_unreadable(bad, kind)
    assert all(job_row(i)["attempts"] == 1 and effects_of(i) == 1 for i in good)
    # Still running, and still claiming: a job enqueued now runs.
    later = enqueue("record", {"n": "later"}).id
    wait_until(lambda: job_row(later)["state"] == "done", message="a later job done")
    assert worker.thread.is_alive() and "code" not in worker.result


def test_a_claim_whose_reply_decodes_is_never_read_back(idle_worker, monkeypatch):
    """The fast path stays one decode, with no read back, for readable rows at the edges: a
    4300-digit integer, 1e400 as jsonb stores it (an integer), 100 levels of nesting, year 1."""
    from django_dbqueue.store import claiming as store_claiming

    def no_read_back(*args, **kwargs):
        raise AssertionError("a readable claim was read back")

    monkeypatch.setattr(store_claiming, "reread_claimed", no_read_back)
    enqueue_many([("record", {"n": i}) for i in range(3)])
    edge = enqueue("record", {}).id
    with connection.cursor() as cursor:
        cursor.execute(
            """UPDATE dbqueue_job SET created_at = '0001-01-01 00:00:00+00',
                   payload = jsonb_build_object(
                       'digits', ('9' || repeat('0', 4299))::jsonb, 'big', '1e400'::jsonb,
                       'deep', (repeat('[', 100) || repeat(']', 100))::jsonb)
               WHERE id = %s""",
            [edge],
        )
    worker = idle_worker(concurrency=8)
    assert worker.run_once()[0] == 4 and not worker.acks.pending()
    (ctx,) = [e.ctx for e in worker.inflight.snapshot() if e.ctx.id == edge]
    assert ctx.payload["digits"] == 9 * 10**4299 and ctx.payload["big"] == 10**400
    assert ctx.enqueued_at.year == 1


def test_a_batch_top_up_reads_back_only_its_own_rows(idle_worker, fast_settings):
    """The poison row comes in a batch's top-up (store/batches.py), under the claim's token: the
    top-up's read back leaves out the jobs the claim itself took, and the batch runs the rest."""
    fast_settings.DBQUEUE = {**fast_settings.DBQUEUE, "PREFETCH": 0}
    ids = [job.id for job in enqueue_many([("accept-batch", {"n": i}) for i in range(10)])]
    bad = enqueue("accept-batch", {"n": "poison"}, priority=-1).id  # claimed last
    poison(bad, "payload-5000-digits")
    worker = idle_worker(concurrency=2)
    claimed, asked = worker.run_once()
    assert claimed < 10 and asked < 11, "the claim must leave the poison row to the top-up"
    assert len(worker.inflight.snapshot()) == 10  # the claim's own and the top-up's
    assert worker.acks.flush_once(worker.session) == 1
    assert_dead_unreadable(bad, "payload-5000-digits")
    _run_claimed(worker, 10)
    assert all(job_row(i)["state"] == "done" and job_row(i)["attempts"] == 1 for i in ids)
    # One call ran the ten (accept-batch records the size of its batch).
    assert (
        scalar(
            "SELECT count(*) FROM testapp_effect WHERE job_id = ANY(%s) AND worker = 'batch:10'",
            [ids],
        )
        == 10
    )


def test_the_fair_claim_fails_the_poison_row_alone(idle_worker, fast_settings):
    fast_settings.DBQUEUE = {**fast_settings.DBQUEUE, "QUEUES": {"default": {"fair": True}}}
    good = [
        job.id
        for job in enqueue_many(
            [{"type": "record", "payload": {"n": i}, "fair_key": f"t{i % 3}"} for i in range(5)]
        )
    ]
    bad = enqueue("record", {"n": "poison"}, fair_key="t1").id
    poison(bad, "created_at-year-10000")
    worker = idle_worker(concurrency=8)
    assert worker.fair == [True]
    claimed, _ = worker.run_once()
    assert claimed == 5
    worker.acks.flush_once(worker.session)
    assert_dead_unreadable(bad, "created_at-year-10000")
    _run_claimed(worker, 5)
    assert all(job_row(i)["state"] == "done" and job_row(i)["attempts"] == 1 for i in good)


@pytest.mark.parametrize("kind", ["payload-too-deep", "created_at-bc"])
def test_the_limited_claim_fails_the_poison_row_alone(idle_worker, fast_settings, kind):
    """CLAIM_LIMITED's typed rows: a created_at of 4000 BC as a typed value failed the fetch of
    the whole reply (psycopg's DataError), after the claim had committed."""
    fast_settings.DBQUEUE = {
        **fast_settings.DBQUEUE,
        "QUEUES": {"default": {"global_concurrency": 20}},
    }
    worker, good, bad = _claim_with_poison(idle_worker, kind)
    assert worker.flow is not None
    claimed, _ = worker.run_once()
    assert claimed == 5
    worker.acks.flush_once(worker.session)
    assert_dead_unreadable(bad, kind)
    _run_claimed(worker, 5)
    assert all(job_row(i)["state"] == "done" and job_row(i)["attempts"] == 1 for i in good)
