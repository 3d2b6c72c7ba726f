"""The store's statements against real PostgreSQL: claim order and SKIP LOCKED, the claim's plan,
fencing by (id, attempt), the sweeper, release."""

import datetime
import json
import threading

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_dbqueue import enqueue, enqueue_many, store
from django_dbqueue.connections import connection_params
from django_dbqueue.store import claiming
from django_dbqueue.sweeper import Sweeper
from tests.utils import job_row, run_concurrently, scalar

pytestmark = pytest.mark.django_db(transaction=True)


_tokens = {}


def claim(n=10, queues=("default",), limits=None, worker="w1"):
    token = _tokens[worker] = store.new_token()
    return store.claim(
        "default",
        worker_id=worker,
        queues=list(queues),
        limits=limits or [n] * len(queues),
        limit=n,
        token=token,
    )


def token(worker="w1"):
    """The lease token of ``worker``'s last claim."""
    return _tokens[worker]


def expire(job_id):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET leased_until = now() - interval '1 second' WHERE id = %s",
            [job_id],
        )


def test_claim_sets_running_lease_attempt_and_worker():
    job = enqueue("record", {"a": 1})
    (row,) = claim(worker="host:1:abc")
    assert (row.id, row.attempt, row.payload) == (job.id, 1, {"a": 1})
    stored = job_row(job.id)
    assert stored["state"] == "running" and stored["worker_id"] == "host:1:abc"
    lease = (stored["leased_until"] - stored["started_at"]).total_seconds()
    assert lease == pytest.approx(stored["lease_seconds"], abs=0.01)


def test_claim_order_priority_then_run_after_then_id():
    low = enqueue("noop", priority=-5)
    a = enqueue("noop")
    b = enqueue("noop")
    high = enqueue("noop", priority=50)
    future = enqueue("noop", priority=100, delay=3600)
    rows = claim(10)
    assert [r.id for r in sorted(rows, key=lambda r: (-r.priority, r.id))] == [
        high.id,
        a.id,
        b.id,
        low.id,
    ]
    assert future.id not in {r.id for r in rows}
    assert claim(10) == []


def test_claim_respects_limits_and_per_queue_caps():
    enqueue_many([("noop", {})] * 5 + [("email", {})] * 5)
    rows = claim(6, queues=("default", "emails"), limits=[6, 2])
    by_queue = {q: sum(1 for r in rows if r.queue == q) for q in ("default", "emails")}
    assert len(rows) == 6 and by_queue["emails"] <= 2


def test_claim_skips_rows_locked_by_another_transaction():
    first, second = enqueue("noop"), enqueue("noop")
    with psycopg.connect(**connection_params("default")) as other:
        other.execute("SELECT id FROM dbqueue_job WHERE id = %s FOR UPDATE", [first.id])
        # Not waiting on the locked row: the claim returns at once with the other one.
        assert [r.id for r in claim(10)] == [second.id]
        other.rollback()
    assert [r.id for r in claim(10)] == [first.id]


def test_concurrent_claims_never_share_a_job():
    enqueue_many([("noop", {})] * 2000)
    claimed = {}
    errors = []

    def worker(name):
        try:
            while rows := claim(25, worker=name):
                for r in rows:
                    claimed.setdefault(r.id, []).append(name)
        except Exception as exc:  # pragma: no cover - surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(claimed) == 2000
    assert all(len(v) == 1 for v in claimed.values())
    assert len({v[0] for v in claimed.values()}) > 1, "only one thread ever got work"


def test_claim_is_one_statement():
    enqueue_many([("noop", {})] * 3)
    with CaptureQueriesContext(connection) as queries:
        claim(10)
    assert len(queries) == 1


def _plan_nodes(node):
    yield node
    for child in node.get("Plans", []):
        yield from _plan_nodes(child)


def test_claim_plan_uses_the_partial_index_with_100k_finished_rows():
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
                max_attempts, lease_seconds, errors, created_at, finished_at)
            SELECT 'noop', 'default', '{}', 'done', 0, now(), 1, 10, 60, '[]', now(), now()
            FROM generate_series(1, 100000)
            """
        )
    enqueue_many([("noop", {})] * 20)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE dbqueue_job")
        cursor.execute(
            "EXPLAIN (FORMAT JSON) " + claiming.CLAIM_JOBS,
            {
                "worker": "w",
                "queues": ["default"],
                "limits": [10],
                "limit": 10,
                "threads": 10,
                "token": 1,
                "commit": "off",
            },
        )
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    nodes = list(_plan_nodes(plan[0]["Plan"]))
    scans = [
        (n["Node Type"], n.get("Index Name"))
        for n in nodes
        if n.get("Relation Name") == "dbqueue_job"
    ]
    assert ("Index Scan", "dbqueue_job_claim_idx") in scans, scans
    assert not any(kind == "Seq Scan" for kind, _ in scans), scans
    assert len(claim(10)) == 10


def claim_plan_scans():
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (FORMAT JSON) " + claiming.CLAIM_JOBS,
            {
                "worker": "w",
                "queues": ["default"],
                "limits": [10],
                "limit": 10,
                "threads": 10,
                "token": 1,
                "commit": "off",
            },
        )
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return [
        (n["Node Type"], n.get("Index Name"))
        for n in _plan_nodes(plan[0]["Plan"])
        if n.get("Relation Name") == "dbqueue_job"
    ]


def test_claim_updates_its_rows_by_primary_key_on_a_small_table():
    """A quiet queue after retention: a few hundred rows. Joined to the chosen ids, the UPDATE
    hashed the whole table (a sequential scan per claim); it probes the primary key instead."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
                max_attempts, lease_seconds, errors, created_at, finished_at)
            SELECT 'noop', 'default', '{}', 'done', 0, now(), 1, 10, 60, '[]', now(), now()
            FROM generate_series(1, 300)
            """
        )
    enqueue_many([("noop", {})] * 3)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE dbqueue_job")
    scans = claim_plan_scans()
    assert ("Index Scan", "dbqueue_job_pkey") in scans, scans
    assert not any(kind == "Seq Scan" for kind, _ in scans), scans
    assert len(claim(10)) == 3


def test_zombie_cannot_complete_or_fail_a_reclaimed_job():
    job = enqueue("record")
    (_zombie,) = claim(worker="zombie")
    expire(job.id)
    assert Sweeper("default").rescue() == {"rescued": 1, "dead": 0, "cancelled": 0}
    with connection.cursor() as cursor:  # make it due now despite the sweeper's backoff
        cursor.execute("UPDATE dbqueue_job SET run_after = now() WHERE id = %s", [job.id])
    (holder,) = claim(worker="holder")
    assert holder.attempt == 2
    # The zombie wakes up and reports: every write is fenced out.
    assert store.complete("default", [(job.id, token("zombie"), None)]) == set()
    error = {"attempt": 1, "class": "X", "message": "late", "traceback": "", "worker": "zombie"}
    assert store.fail("default", job_id=job.id, token=token("zombie"), error=error, delay=0) is None
    assert not store.extend_leases("default", [(job.id, token("zombie"))])
    assert store.release("default", [(job.id, token("zombie"))]) == set()
    row = job_row(job.id)
    assert (row["state"], row["worker_id"], row["attempts"]) == ("running", "holder", 2)
    assert store.complete("default", [(job.id, token("holder"), '"ok"')]) == {job.id}
    row = job_row(job.id)
    assert (row["state"], row["result"]) == ("done", "ok")
    assert [e["class"] for e in row["errors"]] == ["LeaseExpired"]


def test_fail_retries_then_dies_keeping_every_error():
    job = enqueue("fail", max_attempts=2)
    for attempt in (1, 2):
        (row,) = claim()
        error = {
            "attempt": attempt,
            "class": "ValueError",
            "message": f"m{attempt}",
            "traceback": "tb",
            "worker": "w1",
        }
        state = store.fail("default", job_id=job.id, token=token("w1"), error=error, delay=0)
        assert state == ("pending" if attempt == 1 else "dead")
    row = job_row(job.id)
    assert row["state"] == "dead" and row["finished_at"] is not None
    assert [e["message"] for e in row["errors"]] == ["m1", "m2"]
    assert all(e["at"] and e["worker"] == "w1" for e in row["errors"])


def test_fail_with_delay_and_discard():
    job = enqueue("noop")
    claim()
    err = {"attempt": 1, "class": "E", "message": "", "traceback": "", "worker": "w"}
    store.fail("default", job_id=job.id, token=token("w1"), error=err, delay=120)
    row = job_row(job.id)
    assert row["state"] == "pending"
    failed_at = datetime.datetime.fromisoformat(row["errors"][0]["at"])
    assert (row["run_after"] - failed_at).total_seconds() == pytest.approx(120, abs=1)
    other = enqueue("noop")
    claim()
    assert (
        store.fail("default", job_id=other.id, token=token("w1"), error=err, delay=0, dead=True)
        == "dead"
    )


def test_sweeper_rescues_or_kills_expired_jobs_and_records_why():
    keep = enqueue("noop", max_attempts=3)
    last = enqueue("noop", max_attempts=1)
    live = enqueue("noop")
    claim(3)
    expire(keep.id)
    expire(last.id)
    assert Sweeper("default").rescue() == {"rescued": 1, "dead": 1, "cancelled": 0}
    assert job_row(keep.id)["state"] == "pending"
    dead = job_row(last.id)
    assert dead["state"] == "dead" and dead["errors"][0]["class"] == "LeaseExpired"
    assert "lease expired" in dead["errors"][0]["message"]
    assert job_row(live.id)["state"] == "running"


def test_concurrent_sweepers_split_the_work(settings):
    settings.DBQUEUE = {"QUEUES": {"default": {}, "emails": {}}, "SWEEP_BATCH": 50}
    enqueue_many([("noop", {})] * 600)
    claim(600)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE dbqueue_job SET leased_until = now() - interval '1 second'")
    totals = run_concurrently(4, lambda: Sweeper("default").run_once()["rescued"])
    assert sum(totals) == 600
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'pending'") == 600
    assert scalar("SELECT max(jsonb_array_length(errors)) FROM dbqueue_job") == 1


def test_release_gives_the_attempt_back():
    job = enqueue("noop")
    (_row,) = claim()
    assert store.release("default", [(job.id, token("w1"))]) == {job.id}
    stored = job_row(job.id)
    assert (stored["state"], stored["attempts"], stored["leased_until"]) == ("pending", 0, None)


def test_check_constraints_hold_the_state_machine():
    from django.db import IntegrityError, transaction

    job = enqueue("noop")
    bad_updates = [
        "UPDATE dbqueue_job SET state = 'running' WHERE id = %s",  # running without a lease
        "UPDATE dbqueue_job SET state = 'done' WHERE id = %s",  # finished without finished_at
        "UPDATE dbqueue_job SET state = 'lost' WHERE id = %s",
        "UPDATE dbqueue_job SET priority = 1000 WHERE id = %s",
        "UPDATE dbqueue_job SET attempts = max_attempts + 1 WHERE id = %s",
        "UPDATE dbqueue_job SET attempts = max_attempts WHERE id = %s",  # pending, none left
        "UPDATE dbqueue_job SET leased_until = now() WHERE id = %s",  # pending with a lease
    ]
    for statement in bad_updates:
        with pytest.raises(IntegrityError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(statement, [job.id])


def test_same_attempt_number_handed_out_again_is_still_fenced_by_the_token():
    """A requeue resets attempts, so attempt 1 can be claimed twice: the stale worker's writes
    must still miss the new holder's claim."""
    job = enqueue("record", max_attempts=1)
    (stale,) = claim(worker="A")
    expire(job.id)
    assert Sweeper("default").rescue() == {"rescued": 0, "dead": 1, "cancelled": 0}
    assert store.requeue("default", [job.id]) == {job.id: "default"}
    (fresh,) = claim(worker="B")
    assert stale.attempt == fresh.attempt == 1
    err = {"attempt": 1, "class": "E", "message": "late", "traceback": "", "worker": "A"}
    assert not store.extend_leases("default", [(job.id, token("A"))])
    assert (
        store.fail("default", job_id=job.id, token=token("A"), error=err, delay=0, dead=True)
        is None
    )
    assert store.complete("default", [(job.id, token("A"), None)]) == set()
    assert store.release("default", [(job.id, token("A"))]) == set()
    assert job_row(job.id)["state"] == "running"
    assert store.complete("default", [(job.id, token("B"), None)]) == {job.id}


def test_same_worker_same_attempt_is_fenced_by_the_token():
    """(id, attempt, worker) can repeat for one worker: a requeue resets attempts and the same
    worker claims the job again. Its first run's late writes must miss the second claim."""
    job = enqueue("record", max_attempts=1)
    claim(worker="A")
    first = token("A")
    expire(job.id)
    assert Sweeper("default").rescue() == {"rescued": 0, "dead": 1, "cancelled": 0}
    assert store.requeue("default", [job.id]) == {job.id: "default"}
    claim(worker="A")
    second = token("A")
    assert first != second
    assert not store.extend_leases("default", [(job.id, first)])
    assert store.complete("default", [(job.id, first, '"late"')]) == set()
    assert store.release("default", [(job.id, first)]) == set()
    assert job_row(job.id)["state"] == "running"
    assert store.complete("default", [(job.id, second, '"ok"')]) == {job.id}
    assert store.read_back("default", [job.id]) == {job.id: ("done", second)}


def test_release_unknown_hands_back_only_what_the_worker_does_not_know():
    """A claim whose reply was lost: the worker holds rows it never heard of."""
    known_job, unknown_job, other_job = (enqueue("noop") for _ in range(3))
    claim(1, worker="A")
    known = token("A")
    claim(1, worker="A")  # the lost claim
    claim(1, worker="B")
    released = store.release_unknown("default", worker="A", known=[known])
    assert released == {unknown_job.id}
    assert job_row(unknown_job.id)["state"] == "pending"
    assert job_row(unknown_job.id)["attempts"] == 0
    assert job_row(known_job.id)["state"] == job_row(other_job.id)["state"] == "running"
