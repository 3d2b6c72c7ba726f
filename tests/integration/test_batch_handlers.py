"""Batch handlers (docs/batches.md) against the real database, with in-process workers: the
jobs of a batch type reach one call together, and each one settles on its own (retries, dead
letters, results, timeouts, cancels)."""

import threading

import pytest

from django_dbqueue import (
    Batch,
    DiscardJob,
    JobRegistrationError,
    RetryJob,
    cancel,
    enqueue_many,
    job,
    registry,
)
from django_dbqueue.claiming import claim
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def types():
    """Register handlers for one test; unregistered after it."""
    names = []

    def register(name, **options):
        def decorator(func):
            job(name, **options)(func)
            names.append(name)
            return func

        return decorator

    yield register
    for name in names:
        registry.unregister(name)


def enqueue_n(job_type, count, **payload_extra):
    return [
        q.id for q in enqueue_many([(job_type, {"n": i, **payload_extra}) for i in range(count)])
    ]


def states(ids):
    with_rows = [job_row(i) for i in ids]
    return {row["id"]: row for row in with_rows}


def wait_finished(ids, timeout=20):
    def finished():
        left = scalar(
            "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) "
            "AND state NOT IN ('done', 'dead', 'cancelled')",
            [list(ids)],
        )
        return left == 0

    wait_until(finished, timeout=timeout, message=f"{len(ids)} jobs to finish")
    return states(ids)


def test_one_bad_item_of_a_hundred_is_retried_alone(types, start_worker):
    calls = []

    @types("index-doc", batch_size=100)
    def index(batch):
        calls.append([(j.id, j.attempt) for j in batch.jobs])
        for j in batch.jobs:
            if j.payload["n"] == 37 and j.attempt == 1:
                batch.fail(j, ValueError("the search index refused document 37"))
            else:
                batch.succeed(j, {"indexed": j.payload["n"]})

    ids = enqueue_n("index-doc", 100)
    start_worker(concurrency=2)
    rows = wait_finished(ids)
    bad = ids[37]
    assert {r["state"] for r in rows.values()} == {"done"}
    assert rows[bad]["attempts"] == 2
    assert [e["class"] for e in rows[bad]["errors"]] == ["ValueError"]
    assert "document 37" in rows[bad]["errors"][0]["message"]
    others = [r for i, r in rows.items() if i != bad]
    assert all(r["attempts"] == 1 and r["errors"] == [] for r in others)
    assert rows[ids[5]]["result"] == {"indexed": 5}
    # All hundred reached one call (the claim's few, topped up to the batch size); the bad one
    # ran again alone.
    assert max(len(c) for c in calls) == 100
    assert calls[-1] == [(bad, 2)]
    assert sum(len(c) for c in calls) == 101


def test_a_handler_that_raises_fails_every_job_of_its_batch_once(types, start_worker):
    sizes = []

    @types("index-raise", batch_size=10)
    def index(batch):
        sizes.append(len(batch))
        if any(j.attempt == 1 for j in batch):
            raise ConnectionError("the bulk endpoint is down")

    ids = enqueue_n("index-raise", 10)
    start_worker(concurrency=1)
    rows = wait_finished(ids)
    for row in rows.values():
        assert row["state"] == "done"
        assert row["attempts"] == 2
        assert [e["class"] for e in row["errors"]] == ["ConnectionError"]
    assert sizes[0] == 10


def test_each_job_reaches_its_own_dead_letter_and_its_own_retry_delay(types, start_worker):
    @types("index-dead", batch_size=20, max_attempts=2)
    def index(batch):
        for j in batch.jobs:
            n = j.payload["n"]
            if n == 0:
                batch.fail(j, "always refused")  # dead after its second attempt
            elif n == 1:
                batch.fail(j, DiscardJob("malformed document"))  # dead at once
            elif n == 2 and j.attempt == 1:
                batch.retry(j, delay=0.05)  # again, after its own delay
            elif n == 3 and j.attempt == 1:
                batch.fail(j, RetryJob(0.05, "rate limited"))

    ids = enqueue_n("index-dead", 8)
    start_worker(concurrency=2)
    rows = wait_finished(ids)
    assert (rows[ids[0]]["state"], rows[ids[0]]["attempts"]) == ("dead", 2)
    assert [e["message"] for e in rows[ids[0]]["errors"]] == ["always refused"] * 2
    assert (rows[ids[1]]["state"], rows[ids[1]]["attempts"]) == ("dead", 1)
    assert rows[ids[1]]["errors"][0]["class"].endswith("DiscardJob")
    for n in (2, 3):
        assert (rows[ids[n]]["state"], rows[ids[n]]["attempts"]) == ("done", 2)
    for n in range(4, 8):
        assert (rows[ids[n]]["state"], rows[ids[n]]["attempts"], rows[ids[n]]["errors"]) == (
            "done",
            1,
            [],
        )


def test_a_batch_past_its_timeout_is_given_up_and_every_job_retried(types, start_worker):
    release = threading.Event()
    calls = []

    @types("index-slow", batch_size=10, timeout=0.3)
    def index(batch):
        calls.append(sorted(j.id for j in batch))
        if any(j.attempt == 1 for j in batch):
            release.wait(20)  # hangs past its timeout

    try:
        ids = enqueue_n("index-slow", 10)
        worker = start_worker(concurrency=1)
        rows = wait_finished(ids)
        for row in rows.values():
            assert (row["state"], row["attempts"]) == ("done", 2)
            assert [e["class"] for e in row["errors"]] == ["TimeoutError"]
        assert calls[0] == sorted(ids)
        # The hung thread was replaced once for the batch, not once per job.
        assert worker.pool.hung == 1
    finally:
        release.set()
    wait_until(lambda: worker.pool.hung == 0, message="the hung batch thread to return")


def test_a_cancel_of_one_job_in_a_running_batch_is_seen_and_ends_only_it(types, start_worker):
    started = threading.Event()
    seen = []

    @types("index-cancel", batch_size=10)
    def index(batch):
        started.set()
        target = next(j for j in batch.jobs if j.payload["n"] == 4)
        wait_until(lambda: batch.cancelled(target), timeout=15, message="the cancel")
        seen.append([j.id for j in batch.jobs if batch.cancelled(j)])

    ids = enqueue_n("index-cancel", 10)
    start_worker(concurrency=1)
    assert started.wait(15)
    assert cancel(ids[4])[ids[4]] == "cancelling"
    rows = wait_finished(ids)
    assert seen == [[ids[4]]]
    assert rows[ids[4]]["state"] == "cancelled"
    assert all(rows[i]["state"] == "done" for i in ids if i != ids[4])


def test_jobs_of_a_batch_type_claimed_alone_still_reach_the_handler_as_a_batch(
    types, fast_settings
):
    """In process mode (or any run of one job) the handler gets a batch of one."""
    from django_dbqueue.execution import run_handler
    from django_dbqueue.worker import Worker

    got = []

    @types("index-one", batch_size=5)
    def index(batch):
        assert isinstance(batch, Batch)
        got.append(len(batch))
        batch.succeed(batch.jobs[0], "ok")

    enqueue_n("index-one", 1)
    worker = Worker(concurrency=1)
    try:
        worker.pool.runs_batches = False  # as ProcessPool: no grouping
        claim(worker)
        (entry,) = worker.inflight.snapshot()
        assert entry.batch is None
        outcome = run_handler(entry.ctx, entry.token, conf=worker.conf, worker_id="w")
        assert (outcome.kind, outcome.result, got) == ("success", '"ok"', [1])
    finally:
        worker.session.close()


def test_a_batch_takes_one_slot_and_the_plain_jobs_beside_it_still_run(types, fast_settings):
    """A claim of a batch type tops its batch up to batch_size, under one lease token; the
    batch occupies one slot, so the worker still claims plain jobs of the same queue."""
    from django_dbqueue.worker import Worker

    @types("index-slot", batch_size=50)
    def index(batch):
        pass

    ids = enqueue_n("index-slot", 60)
    worker = Worker(concurrency=2, queues=["default"])
    worker.pool.submit = lambda units: None  # the pool is not started: look at what it gets
    try:
        _, asked = claim(worker)
        assert asked == 4  # 2 threads + 2 prefetched
        held = worker.inflight.snapshot()
        batches = {e.batch for e in held}
        assert len(held) == 50 and len(batches) == 1  # one batch, filled to its size
        assert worker.inflight.occupied() == 1
        assert (
            scalar("SELECT count(DISTINCT lease_token) FROM dbqueue_job WHERE state = 'running'")
            == 1
        )
        # The next claim: the 10 left make a second batch (two threads were free).
        claim(worker)
        held = worker.inflight.snapshot()
        assert len(held) == 60 and worker.inflight.occupied() == 2
        assert sorted(e.ctx.id for e in held) == sorted(ids)
    finally:
        worker.session.close()


def test_a_queue_concurrency_caps_a_batch_job_by_job(types, settings):
    from django_dbqueue.worker import Worker
    from tests.integration.conftest import FAST

    settings.DBQUEUE = {**FAST, "QUEUES": {"default": {}, "bulk": {"concurrency": 7}}}

    @types("index-capped", batch_size=50, queue="bulk")
    def index(batch):
        pass

    enqueue_n("index-capped", 20)
    worker = Worker(concurrency=2, queues=["bulk"])
    worker.pool.submit = lambda units: None
    try:
        claim(worker)
        assert len(worker.inflight.snapshot()) == 7
    finally:
        worker.session.close()


def test_a_batch_type_on_a_fair_queue_fills_its_batch_round_robin(types, settings):
    """A batch type (batch_size=50) on a fair queue: tenant "big" has a backlog of 200, then 40
    other tenants enqueue one job each. The worker's claim (2 threads + 2 prefetched) takes 4
    keys round-robin, then the top-up goes on round-robin from there (store/fair.py
    CLAIM_MORE_FAIR): every waiting tenant's job is in this batch of 50, and big's backlog
    fills the rest (in claim order, once every key had its share). The plain top-up filled it
    with 46 of big's jobs, and the 40 tenants waited for 10 more claims."""
    from django_dbqueue import enqueue
    from django_dbqueue.worker import Worker
    from tests.integration.conftest import FAST

    settings.DBQUEUE = {**FAST, "QUEUES": {"default": {}, "emails": {}, "tenants": {"fair": True}}}

    @types("index-fair", batch_size=50, queue="tenants", fair_key=lambda p: p["tenant"])
    def index(batch):
        pass

    big = [j.id for j in enqueue_many([("index-fair", {"tenant": "big"}) for _ in range(200)])]
    singles = {enqueue("index-fair", {"tenant": f"t{i:02}"}).id for i in range(40)}
    worker = Worker(concurrency=2, queues=["tenants"])
    worker.pool.submit = lambda units: None  # look at what the pool would get
    try:
        claim(worker)
        held = worker.inflight.snapshot()
        batch_ids = {e.ctx.id for e in held}
        assert len(held) == 50 and len({e.batch for e in held}) == 1
        served = len(singles & batch_ids)
        assert served == 40, (
            f"the batch of 50 holds {served} of the 40 waiting tenants' jobs and "
            f"{50 - served} of big's backlog"
        )
        # big's ten are its first ten in claim order, under the claim's one lease token.
        assert sorted(batch_ids - singles) == big[:10]
        tokens = "SELECT count(DISTINCT lease_token) FROM dbqueue_job WHERE state = 'running'"
        assert scalar(tokens) == 1
    finally:
        worker.session.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 0}, "batch_size must be from 1 to 1000"),
        ({"batch_size": 1001}, "batch_size must be from 1 to 1000"),
        ({"batch_size": "10"}, "batch_size must be an int from 1 to 1000"),
        ({"batch_size": True}, "batch_size must be an int"),
        ({"batch_size": 10, "atomic": True}, "without atomic=True"),
    ],
)
def test_bad_batch_options_are_refused_at_registration(options, message):
    with pytest.raises(JobRegistrationError, match=message):

        @job("bad-batch", **options)
        def handler(batch):
            pass

    assert registry.get("bad-batch") is None


def test_an_async_batch_handler_is_refused():
    with pytest.raises(JobRegistrationError, match="needs a plain \\(sync\\) function"):

        @job("bad-async-batch", batch_size=10)
        async def handler(batch):
            pass

    assert registry.get("bad-async-batch") is None
