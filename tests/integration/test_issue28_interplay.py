"""Issue 28 review: where publish/subscribe, fair queues and batch handlers meet each other and
the older features, each against a real PostgreSQL (sessions held open where the order of two
sessions matters, both orders; in-process workers where a run is the promise).

Each test here is a suspicion that did not hold: the mechanism keeps the promise."""

import threading

import psycopg
import pytest

from django_dbqueue import (
    cancel,
    enqueue,
    enqueue_many,
    pause_queue,
    publish,
    registry,
    resume_queue,
    store,
)
from django_dbqueue.claiming import next_cursors
from django_dbqueue.connections import connection_params
from django_dbqueue.registry import JobType
from tests.integration.conftest import FAST
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

QUEUES = {"default": {}, "emails": {}, "tenants": {"fair": True}, "bulk": {}}


@pytest.fixture
def fast_fair(fast_settings):
    fast_settings.DBQUEUE = {**FAST, "QUEUES": dict(QUEUES)}
    names = []

    def register(name, func=lambda ctx: None, **options):
        registry.register(JobType(name=name, func=func, **options))
        names.append(name)

    yield register
    for name in names:
        registry.unregister(name)


def tenant(payload):
    return payload.get("tenant")


def finished(ids, timeout=20):
    def done():
        return scalar(
            "SELECT count(*) = 0 FROM dbqueue_job WHERE id = ANY(%s) "
            "AND state NOT IN ('done', 'dead', 'cancelled')",
            [list(ids)],
        )

    wait_until(done, timeout=timeout, message=f"{len(ids)} jobs to finish")
    return {i: job_row(i) for i in ids}


def session():
    return psycopg.connect(**connection_params("default"), autocommit=False)


def test_a_batch_handler_that_ignores_a_cancel_still_ends_that_job_cancelled(
    fast_fair, start_worker
):
    """The handler waits until one job's cancel reached it, then marks every job succeeded:
    the cancelled one ends ``cancelled`` (its result kept), the others ``done``."""
    started = threading.Event()

    def handler(batch):
        started.set()
        target = next(j for j in batch.jobs if j.payload["n"] == 2)
        wait_until(lambda: target.cancelled, timeout=15, message="the cancel to reach the run")
        for j in batch.jobs:
            batch.succeed(j, {"n": j.payload["n"]})

    fast_fair("review-batch-cancel", handler, queue="bulk", batch_size=5)
    ids = [j.id for j in enqueue_many([("review-batch-cancel", {"n": i}) for i in range(5)])]
    start_worker(queues=["bulk"], concurrency=1)
    assert started.wait(15)
    assert cancel(ids[2])[ids[2]] == "cancelling"
    rows = finished(ids)
    assert rows[ids[2]]["state"] == "cancelled"
    assert {rows[i]["state"] for i in ids if i != ids[2]} == {"done"}
    assert all(rows[i]["attempts"] == 1 for i in ids)


@pytest.mark.parametrize("first", ["claim", "top-up"])
def test_the_batch_top_up_and_a_fair_claim_held_open_never_take_one_job_twice(fast_fair, first):
    """A fair claim and another worker's batch top-up of the same type and queue, the first one
    held open (its rows locked, uncommitted) while the second runs, in both orders: SKIP LOCKED
    keeps them apart, and each job is running once, under the token of the claim that took it."""
    fast_fair("review-fair-batch", queue="tenants", batch_size=20, fair_key=tenant)
    ids = [
        j.id
        for j in enqueue_many(
            [("review-fair-batch", {"tenant": t}) for t in ["a"] * 10 + ["b"] * 5 + ["c"] * 5]
        )
    ]
    claim_stmt = store.claim_statement(
        worker_id="claimer",
        queues=["tenants"],
        limits=[6],
        limit=6,
        token=store.new_token(),
        fair=[True],
        cursors={},
    )
    top_up_stmt = store.claim_more_statement(
        worker_id="topper", queue="tenants", job_type="review-fair-batch", limit=10, token=7
    )
    order = [claim_stmt, top_up_stmt] if first == "claim" else [top_up_stmt, claim_stmt]
    conns = [session(), session()]
    got = []
    try:
        for conn, (statement, params) in zip(conns, order, strict=True):
            with conn.cursor() as cursor:
                cursor.execute(statement, params)
                got.append({row.id for row in store.claimed_rows(cursor.fetchall())})
        for conn in conns:
            conn.commit()
    finally:
        for conn in conns:
            conn.close()
    claimed, topped = got if first == "claim" else got[::-1]
    # Claim first: two of each key. Top-up first: it took a's ten (claim order), and the fair
    # claim, whose walk still counts a (its rows are locked, not gone), gets b's and c's shares.
    assert len(claimed) == (6 if first == "claim" else 4)
    assert len(topped) == 10
    assert not claimed & topped
    running = scalar(
        "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state = 'running' "
        "AND attempts = 1",
        [ids],
    )
    assert running == len(claimed | topped)


def test_a_paused_fair_queue_gives_nothing_to_the_fair_claim_nor_to_the_top_up(
    fast_fair, start_worker
):
    """Pause holds a fair queue's keyed, keyless and batch jobs alike; resume lets a worker
    run them all."""
    fast_fair("review-fair-plain", queue="tenants", fair_key=tenant)
    fast_fair("review-fair-batch", queue="tenants", batch_size=10, fair_key=tenant)
    pause_queue("tenants")
    ids = [enqueue("review-fair-plain", {"tenant": f"t{i}"}).id for i in range(3)]
    ids += [enqueue("review-fair-plain", {}).id]  # the shared key ''
    ids += [j.id for j in enqueue_many([("review-fair-batch", {"tenant": "b"})] * 15)]
    cursors = {}
    rows = store.claim(
        "default",
        worker_id="w",
        queues=["tenants"],
        limits=[10],
        limit=10,
        token=store.new_token(),
        fair=[True],
        cursors=cursors,
    )
    assert rows == []
    statement, params = store.claim_more_statement(
        worker_id="w", queue="tenants", job_type="review-fair-batch", limit=10, token=9
    )
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        assert store.claimed_rows(cursor.fetchall()) == []
    assert next_cursors(cursors, rows) == {}
    resume_queue("tenants")
    start_worker(queues=["tenants"], concurrency=2)
    rows = finished(ids)
    assert {row["state"] for row in rows.values()} == {"done"}


def test_an_event_reaches_a_batch_subscriber_and_a_serial_subscriber_once_each(
    fast_fair, start_worker
):
    """Twenty events (half of them published twice with the same idempotency key) to a batch
    subscriber and to a subscriber with a serial key: each event's job of each subscriber runs
    once, the batch ones in batches, the serial ones one at a time."""
    batches, serial_runs, overlap = [], [], []
    running = threading.Lock()

    def batch_handler(batch):
        batches.append([j.payload["n"] for j in batch])

    def serial_handler(ctx):
        if not running.acquire(blocking=False):
            overlap.append(ctx.id)
            return
        try:
            serial_runs.append(ctx.payload["n"])
        finally:
            running.release()

    fast_fair("review-sub-batch", batch_handler, queue="bulk", batch_size=8, subscribes=("r.evt",))
    fast_fair(
        "review-sub-serial",
        serial_handler,
        queue="bulk",
        serial_key=lambda p: "one",
        subscribes=("r.evt",),
    )
    job_ids = []
    for n in range(20):
        key = f"k{n}" if n % 2 else None
        event = publish("r.evt", {"n": n}, idempotency_key=key)
        job_ids += [j.id for j in event.jobs]
        if key:
            again = publish("r.evt", {"n": n}, idempotency_key=key)
            assert not again.created and {j.id for j in again.jobs} <= set(job_ids)
    assert len(job_ids) == 40
    start_worker(queues=["bulk"], concurrency=3)
    rows = finished(job_ids)
    assert {row["state"] for row in rows.values()} == {"done"}
    assert sorted(n for b in batches for n in b) == list(range(20))
    assert max(len(b) for b in batches) > 1
    assert sorted(serial_runs) == list(range(20)) and overlap == []
    assert serial_runs == list(range(20))  # a serial key starts in enqueue order
