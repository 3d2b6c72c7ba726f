"""Unique-while-active jobs and serial keys (docs/concepts/keys.md), against a real PostgreSQL.

Unique keys: the partial unique index decides, also between concurrent enqueuers on their own
connections; every statement that moves a job back to pending leaves the index alone. Serial
keys: the claim passes over a job while another of its key runs or an older one is pending,
also when that older one is being claimed on another connection right now.
"""

import datetime
import json
import threading

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_dbqueue import EnqueueError, Workflow, enqueue, enqueue_many, job, store
from django_dbqueue.connections import connection_params
from django_dbqueue.exceptions import JobRegistrationError
from django_dbqueue.registry import unregister
from django_dbqueue.store import claiming
from django_dbqueue.sweeper import Sweeper
from tests.utils import job_row, run_concurrently, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def claim(limit=10, worker="w", queues=("default",)):
    return store.claim(
        "default",
        worker_id=worker,
        queues=list(queues),
        limits=[limit] * len(queues),
        limit=limit,
        token=store.new_token(),
    )


def set_state(job_id, sql_set):
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE dbqueue_job SET {sql_set} WHERE id = %s", [job_id])


def finish(row):
    assert store.complete("default", [(row.id, _token(row.id), None)]) == {row.id}


def _token(job_id):
    return scalar("SELECT lease_token FROM dbqueue_job WHERE id = %s", [job_id])


def expire(job_id):
    set_state(job_id, "leased_until = now() - interval '1 second'")


# Unique while active ---------------------------------------------------------------------------


def test_active_key_returns_the_live_job_until_it_finished():
    first = enqueue("record", unique_key="report:1")
    assert first.created and job_row(first.id)["unique_while"] == "active"
    again = enqueue("record", {"other": 1}, unique_key="report:1")
    assert (again.id, again.created) == (first.id, False)
    (row,) = claim()
    assert enqueue("record", unique_key="report:1").id == first.id  # running holds it
    assert store.fail("default", job_id=row.id, token=_token(row.id), error={}, delay=0) == (
        "pending"
    )  # a retry keeps the key: nobody else could take it meanwhile
    assert enqueue("record", unique_key="report:1").id == first.id
    (row,) = claim()
    finish(row)
    fresh = enqueue("record", unique_key="report:1")
    assert fresh.created and fresh.id != first.id
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE unique_key = 'report:1'") == 2


def test_pending_key_is_free_once_the_job_started_and_its_retry_never_collides():
    first = enqueue("record", unique_key="sync:7", unique_while="pending")
    assert enqueue("record", unique_key="sync:7", unique_while="pending").id == first.id
    (row,) = claim()
    second = enqueue("record", unique_key="sync:7", unique_while="pending")
    assert second.created and second.id != first.id
    # Every way back to pending for the started job: none takes the key from the new holder.
    assert store.fail("default", job_id=row.id, token=_token(row.id), error={}, delay=0) == (
        "pending"
    )
    set_state(second.id, "run_after = now() + interval '1 hour'")
    (row,) = claim()
    assert row.id == first.id
    assert store.release("default", [(row.id, _token(row.id))]) == {row.id}
    (row,) = claim()
    assert store.release_unknown("default", worker="w", known=[]) == {row.id}
    (row,) = claim()
    expire(row.id)
    assert Sweeper("default").rescue()["rescued"] == 1
    set_state(first.id, "run_after = now()")
    (row,) = claim()
    assert store.defer_unknown_type(
        "default", job_id=row.id, token=_token(row.id), error={}, delay=0, grace=3600
    ) == ("pending")
    # Still one holder: the new job; the started one is pending again without the key.
    assert enqueue("record", unique_key="sync:7", unique_while="pending").id == second.id
    assert job_row(first.id)["unique_key"] == "sync:7"  # kept on the row, for the admin


def test_concurrent_enqueuers_on_their_own_connections_get_one_job():
    results = run_concurrently(
        8, lambda: enqueue("record", unique_key="race", unique_while="pending")
    )
    assert len({r.id for r in results}) == 1
    assert sorted(r.created for r in results) == [False] * 7 + [True]
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE unique_key = 'race'") == 1


def test_an_enqueue_that_lost_to_an_uncommitted_holder_returns_it_after_its_commit():
    other = psycopg.connect(**connection_params("default"))
    try:
        with other.cursor() as cursor:
            cursor.execute(
                "INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, "
                "attempts, max_attempts, lease_seconds, errors, created_at, unique_key, "
                "unique_while) VALUES ('record', 'default', '{}', 'pending', 0, now(), 0, 3, 5, "
                "'[]', now(), 'held', 'active') RETURNING id"
            )
            holder = cursor.fetchone()[0]
        results = []
        import threading

        thread = threading.Thread(
            target=lambda: (
                results.append(enqueue("record", unique_key="held")),
                connection.close(),
            )
        )
        thread.start()
        thread.join(0.5)
        assert thread.is_alive()  # waits for the holder's transaction
        other.commit()
        thread.join(10)
        assert [(r.id, r.created) for r in results] == [(holder, False)]
    finally:
        other.close()


def test_debounce_pushes_the_pending_job_back_and_takes_the_last_payload():
    soon = timezone.now() + datetime.timedelta(seconds=30)
    first = enqueue(
        "record", {"n": 1}, unique_key="idx", unique_while="pending", debounce=True, run_after=soon
    )
    later = enqueue(
        "record", {"n": 2}, unique_key="idx", unique_while="pending", debounce=True, delay=120
    )
    assert (later.id, later.created) == (first.id, False)
    row = job_row(first.id)
    assert row["payload"] == {"n": 2}
    assert row["run_after"] > soon + datetime.timedelta(seconds=60)
    set_state(first.id, "run_after = now()")
    (claimed,) = claim()
    fresh = enqueue("record", {"n": 3}, unique_key="idx", unique_while="pending", debounce=True)
    assert fresh.created and fresh.id != first.id
    assert claimed.payload == {"n": 2}


def test_debounce_does_not_touch_a_holder_of_another_type():
    first = enqueue("echo", unique_key="k", unique_while="pending")
    got = enqueue("record", {"x": 1}, unique_key="k", unique_while="pending", debounce=True)
    assert (got.id, got.created, got.type) == (first.id, False, "echo")
    assert job_row(first.id)["payload"] == {}


def test_job_defaults_compute_the_keys_from_the_payload():
    first = enqueue("unique-record", {"key": 5})
    assert job_row(first.id)["unique_key"] == "5"
    assert job_row(first.id)["unique_while"] == "pending"
    assert enqueue("unique-record", {"key": 5}).id == first.id
    assert enqueue("unique-record", {"key": 6}).id != first.id
    assert job_row(enqueue("unique-record", {}).id)["unique_key"] is None  # None: no key
    assert job_row(enqueue("serial-record", {"account": 3}).id)["serial_key"] == "3"
    assert job_row(enqueue("serial-record", {"account": 3}, serial_key="x").id)["serial_key"] == "x"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"unique_key": "a", "unique_while": "running"}, "unique_while must be 'pending' or"),
        ({"unique_while": "pending"}, "unique_while='pending' needs a unique_key"),
        ({"unique_key": "a", "debounce": True}, "debounce=True needs unique_while='pending'"),
        ({"unique_key": "a", "unique_while": "pending", "debounce": 1}, "debounce must be True"),
        ({"unique_key": "a", "idempotency_key": "b"}, "pass idempotency_key or unique_key"),
        ({"unique_key": 1.5}, "unique_key must be a str or an int, got float 1.5"),
        ({"unique_key": ""}, "unique_key must be a non-empty string"),
        ({"serial_key": ["a"]}, "serial_key must be a str or an int, got list ['a']"),
        ({"serial_key": "x" * 301}, "serial_key must be a non-empty string of at most 300"),
        ({"unique_key": "a", "depends_on": [1]}, "a job with depends_on cannot be unique"),
    ],
)
def test_bad_arguments_are_refused_naming_the_value(kwargs, message):
    with pytest.raises(EnqueueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        enqueue("record", **kwargs)
    assert scalar("SELECT count(*) FROM dbqueue_job") == 0


def test_job_key_callables_are_validated_at_registration_and_at_enqueue():
    with pytest.raises(JobRegistrationError, match="serial_key must be a callable"):
        job("bad-serial", serial_key="account")
    with pytest.raises(JobRegistrationError, match="unique_while must be 'pending' or 'active'"):
        job("bad-mode", unique_key=lambda p: p, unique_while="always")

    @job("keyed-badly", serial_key=lambda payload: payload["a"])
    def keyed_badly(ctx):
        pass

    @job("pending-mode", unique_while="pending")  # the mode of keys given to enqueue()
    def pending_mode(ctx):
        pass

    try:
        assert job_row(enqueue("pending-mode", unique_key="m").id)["unique_while"] == "pending"
        assert job_row(enqueue("pending-mode").id)["unique_key"] is None
        with pytest.raises(
            EnqueueError, match=r"serial_key\(payload\) must be a str or an int, got dict"
        ):
            enqueue("keyed-badly", {"a": {"b": 1}})
        with pytest.raises(EnqueueError, match=r"serial_key\(payload\) raised KeyError"):
            enqueue("keyed-badly", {})
    finally:
        unregister("keyed-badly")
        unregister("pending-mode")


def test_enqueue_many_and_workflows_take_serial_keys_but_refuse_unique_types():
    jobs = enqueue_many([{"type": "record", "serial_key": "a"}, ("serial-record", {"account": 9})])
    assert [job_row(j.id)["serial_key"] for j in jobs] == ["a", "9"]
    with pytest.raises(EnqueueError, match=r"jobs\[0\].*enqueue_many\(\) does not take unique"):
        enqueue_many([("unique-record", {"key": 1})])
    wf = Workflow()
    head = wf.add("serial-record", {"account": 4})
    wf.add("record", depends_on=[head], serial_key="s")
    ids = [j.id for j in wf.enqueue()]
    assert [job_row(i)["serial_key"] for i in ids] == ["4", "s"]
    wf = Workflow()
    wf.add("unique-record", {"key": 1})
    with pytest.raises(EnqueueError, match="a job of a workflow cannot be unique"):
        wf.enqueue()


def test_requeue_leaves_a_job_alone_while_another_holds_its_key():
    old = enqueue("record", unique_key="acct:1")
    set_state(old.id, "state = 'dead', finished_at = now()")
    older = enqueue("record", unique_key="acct:1")
    set_state(older.id, "state = 'cancelled', finished_at = now()")
    holder = enqueue("record", unique_key="acct:1")
    assert store.requeue("default", [old.id, older.id]) == {}
    assert store.requeue_blocked("default", [old.id, older.id]) == [
        (old.id, "acct:1", holder.id, "pending"),
        (older.id, "acct:1", holder.id, "pending"),
    ]
    store.cancel("default", [holder.id])
    # Two of the selection with one key: the newest is requeued, the other left alone.
    assert store.requeue("default", [old.id, older.id, holder.id]) == {holder.id: "default"}
    assert job_row(old.id)["state"] == "dead"
    assert enqueue("record", unique_key="acct:1").id == holder.id


def test_requeue_that_meets_a_holder_committed_meanwhile_does_not_abort_the_transaction():
    dead = enqueue("record", unique_key="late")
    set_state(dead.id, "state = 'dead', finished_at = now()")
    with transaction.atomic():
        enqueue("record", unique_key="late")  # a holder in the same transaction
        assert store.requeue("default", [dead.id]) == {}
        assert scalar("SELECT count(*) FROM dbqueue_job WHERE unique_key = 'late'") == 2


def test_requeue_racing_an_uncommitted_holder_retries_and_leaves_the_job_alone():
    import threading

    dead = enqueue("record", unique_key="race-requeue")
    set_state(dead.id, "state = 'dead', finished_at = now()")
    other = psycopg.connect(**connection_params("default"))
    try:
        with other.cursor() as cursor:  # a holder its snapshot cannot see yet
            cursor.execute(
                "INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, "
                "attempts, max_attempts, lease_seconds, errors, created_at, unique_key, "
                "unique_while) VALUES ('record', 'default', '{}', 'pending', 0, now(), 0, 3, 5, "
                "'[]', now(), 'race-requeue', 'active') RETURNING id"
            )
            holder = cursor.fetchone()[0]
        results = []
        thread = threading.Thread(
            target=lambda: (
                results.append(store.requeue("default", [dead.id])),
                connection.close(),
            )
        )
        thread.start()
        thread.join(0.5)
        assert thread.is_alive()  # its index insertion waits for the holder's transaction
        other.commit()
        thread.join(10)
        assert results == [{}]  # the unique violation was caught, the retry saw the holder
    finally:
        other.close()
    assert job_row(dead.id)["state"] == "dead"
    assert store.requeue_blocked("default", [dead.id]) == [
        (dead.id, "race-requeue", holder, "pending")
    ]


def test_a_started_pending_mode_job_is_requeued_without_the_key():
    first = enqueue("record", unique_key="p", unique_while="pending")
    (row,) = claim()
    store.fail("default", job_id=row.id, token=_token(row.id), error={}, delay=0, dead=True)
    holder = enqueue("record", unique_key="p", unique_while="pending")
    assert store.requeue("default", [first.id]) == {first.id: "default"}
    assert enqueue("record", unique_key="p", unique_while="pending").id == holder.id


# Serial keys -----------------------------------------------------------------------------------


def test_claim_runs_one_job_per_serial_key_in_enqueue_order():
    a1 = enqueue("record", serial_key="A")
    a2 = enqueue("record", serial_key="A")
    b1 = enqueue("record", serial_key="B")
    free = enqueue("record")
    claimed = {row.id: row for row in claim()}
    assert set(claimed) == {a1.id, b1.id, free.id}
    assert claim() == []
    finish(claimed[a1.id])
    (row,) = claim()
    assert row.id == a2.id


def test_keyed_jobs_are_claimed_only_for_free_threads():
    """A keyed job holds its key from its claim on: the prefetch part of a batch is unkeyed."""
    free = [enqueue("record").id for _ in range(3)]
    keyed = [enqueue("record", serial_key=f"k{i}").id for i in range(3)]
    rows = store.claim(
        "default",
        worker_id="w",
        queues=["default"],
        limits=[10],
        limit=10,
        token=store.new_token(),
        threads=2,
    )
    assert [r.id for r in rows] == free + keyed[:2]  # in the claim's order
    assert [r.keyed for r in rows] == [False, False, False, True, True] and rows.keyed == 2
    assert job_row(keyed[2])["state"] == "pending"  # left for another worker's free thread
    none = store.claim(
        "default",
        worker_id="w2",
        queues=["default"],
        limits=[10],
        limit=10,
        token=store.new_token(),
        threads=0,
    )
    assert none == []
    assert [r.id for r in claim()] == [keyed[2]]


def test_the_worker_hands_keyed_jobs_to_its_free_threads_first(fast_settings):
    """Claimed after an unkeyed job, the keyed one still goes to the free thread first, not
    behind the prefetched job."""
    from django_dbqueue.worker import Worker

    free = enqueue("record").id
    keyed = enqueue("record", serial_key="acct").id
    worker = Worker(concurrency=1, listen=False)
    try:
        assert worker.run_once() == (2, 2)  # one thread, one prefetched
        assert [e.ctx.id for e in worker.inflight.snapshot()] == [keyed, free]
    finally:
        worker.session.close()


def test_a_claim_without_free_threads_leaves_keyed_jobs_unlocked():
    """A busy worker's claim (no free thread) takes unkeyed jobs only and never locks a keyed
    one: held open on another connection, it does not make a concurrent claim skip them."""
    keyed = [enqueue("record", serial_key=f"k{i}").id for i in range(3)]
    free = enqueue("record").id
    statement, params = store.claim_statement(
        worker_id="busy",
        queues=["default"],
        limits=[10],
        limit=10,
        token=store.new_token(),
        threads=0,
    )
    with psycopg.connect(**connection_params("default")) as busy, busy.transaction():
        batch = store.claimed_rows(busy.execute(statement, params).fetchall())
        assert [r.id for r in batch] == [free]
        rows = store.claim(
            "default",
            worker_id="w",
            queues=["default"],
            limits=[10],
            limit=10,
            token=store.new_token(),
            threads=2,
        )
        assert [r.id for r in rows] == keyed[:2]  # none skipped; one left for others


def test_keyed_jobs_left_out_by_a_busy_claim_are_not_left_to_the_poll(fast_settings):
    """A claim made while every thread is busy (for the prefetch) leaves keyed jobs out: the
    worker must not take that for an empty queue. Here: 4 slow unkeyed jobs fill both threads
    and the prefetch; when two end, the claim has no free thread, finds nothing else, and the
    three keyed jobs behind must still run when the threads free up, not at the poll (an
    hour)."""
    from django_dbqueue.worker import Worker

    slow = [enqueue("serial-record", {"label": "slow", "sleep": 0.2}).id for _ in range(4)]
    keyed = [enqueue("record", serial_key=f"k{i}").id for i in range(3)]
    worker = Worker(concurrency=2, poll_interval=3600, listen=False)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: (
                scalar(
                    "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state = 'done'",
                    [slow + keyed],
                )
                == 7
            ),
            timeout=15,
            message="the slow jobs and the keyed ones behind them done",
        )
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_a_worker_claims_its_keys_next_job_when_the_keyed_one_ends(fast_settings):
    """The end of a keyed job makes its key's next job claimable and no notification says so:
    the worker that ran it claims again at once, not at its next poll (an hour here)."""
    from django_dbqueue.worker import Worker

    ids = [enqueue("record", serial_key="acct").id for _ in range(3)]
    worker = Worker(concurrency=2, poll_interval=3600, listen=False, max_jobs=3)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: (
                scalar(
                    "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state = 'done'", [ids]
                )
                == 3
            ),
            timeout=15,
            message="the three jobs of the key done",
        )
        assert worker.claims <= 6, worker.claims  # no poll: one claim per end, at most
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_a_retrying_older_job_holds_back_the_newer_ones_of_its_key():
    a1 = enqueue("record", serial_key="A")
    a2 = enqueue("record", serial_key="A")
    (row,) = claim()
    store.fail("default", job_id=row.id, token=_token(row.id), error={}, delay=3600)
    assert claim() == []  # a2 is due, a1 is not: a2 still waits
    set_state(a1.id, "run_after = now()")
    assert [r.id for r in claim()] == [a1.id]
    assert a2.id


def test_a_running_newer_job_holds_back_an_older_one_requeued_meanwhile():
    a1 = enqueue("record", serial_key="A")
    set_state(a1.id, "state = 'dead', finished_at = now()")
    a2 = enqueue("record", serial_key="A")
    (row,) = claim()
    assert row.id == a2.id
    store.requeue("default", [a1.id])
    assert claim() == []
    finish(row)
    assert [r.id for r in claim()] == [a1.id]


def test_the_lease_frees_the_key_of_a_dead_worker():
    a1 = enqueue("record", serial_key="A", max_attempts=1)
    a2 = enqueue("record", serial_key="A")
    (row,) = claim(worker="killed")
    assert claim() == []
    expire(row.id)
    assert Sweeper("default").rescue() == {"rescued": 0, "dead": 1, "cancelled": 0}
    assert [r.id for r in claim()] == [a2.id]
    assert job_row(a1.id)["state"] == "dead"


def test_waiting_workflow_jobs_do_not_block_their_key():
    wf = Workflow()
    head = wf.add("record")
    wf.add("record", depends_on=[head], serial_key="A")
    head_job, waiting = wf.enqueue()
    later = enqueue("record", serial_key="A")
    claimed = {r.id for r in claim()}
    assert claimed == {head_job.id, later.id}
    assert job_row(waiting.id)["state"] == "waiting"


def test_a_job_being_claimed_on_another_connection_holds_back_the_newer_one():
    a1 = enqueue("record", serial_key="A")
    a2 = enqueue("record", serial_key="A")
    other = psycopg.connect(**connection_params("default"))
    try:
        params = dict(
            store.claim_statement(
                worker_id="other", queues=["default"], limits=[10], limit=10, token=1
            )[1]
        )
        with other.cursor() as cursor:
            cursor.execute(claiming.CLAIM_JOBS, params)
            claimed = store.claimed_rows(cursor.fetchall())
            assert [r.id for r in claimed] == [a1.id]  # not committed yet
        assert claim() == []  # a1 locked (skipped), a2 behind a1 pending in this snapshot
        other.commit()
        assert claim() == []  # a1 running now
    finally:
        other.close()
    assert job_row(a2.id)["state"] == "pending"


def test_unkeyed_claim_keeps_its_index_and_its_estimate():
    with connection.cursor() as cursor:  # the history a claim must not read
        cursor.execute(
            """
            INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
                max_attempts, lease_seconds, errors, created_at, finished_at, serial_key)
            SELECT 'noop', 'default', '{}', 'done', 0, now(), 1, 10, 60, '[]', now(), now(),
                   'k' || (i % 50)
            FROM generate_series(1, 50000) AS i
            """
        )
    enqueue_many([("record", {})] * 2000)
    enqueue_many([{"type": "record", "serial_key": f"k{i % 5}"} for i in range(50)])
    plan = _claim_plan(claiming.CLAIM_JOBS)
    nodes = list(_nodes(plan))
    scans = [
        (n["Node Type"], n.get("Index Name"))
        for n in nodes
        if n.get("Relation Name") == "dbqueue_job"  # (dbqueue_queue: a few rows, pause flags)
    ]
    assert ("Index Scan", "dbqueue_job_claim_idx") in scans, scans
    assert not any(kind == "Seq Scan" for kind, _ in scans), scans
    # The planner charges the serial test almost nothing per row (an inline NOT EXISTS was
    # charged in full to every backlog row, which pushed big backlogs' claims into JIT).
    without = claiming.CLAIM_JOBS.replace(
        "AND (j.serial_key IS NULL\n"
        "               OR (%(threads)s::int > 0 AND dbqueue_serial_turn(j.serial_key::text, j.id)))",
        "",
    )
    assert without != claiming.CLAIM_JOBS
    assert plan["Total Cost"] < 1.2 * _claim_plan(without)["Total Cost"]
    # The function's probe reads the serial index, not the 50,000 finished rows of its keys.
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (FORMAT JSON) SELECT 1 FROM dbqueue_job AS o WHERE o.serial_key = 'k1' "
            "AND o.state IN ('pending', 'running') AND o.id <> 5 AND (o.state = 'running' "
            "OR o.id < 5)"
        )
        probe = cursor.fetchone()[0]
    probe = json.loads(probe) if isinstance(probe, str) else probe
    names = [n.get("Index Name") for n in _nodes(probe[0]["Plan"])]
    assert "dbqueue_job_serial_idx" in names, probe


def _claim_plan(statement):
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE dbqueue_job")
        cursor.execute(
            "EXPLAIN (FORMAT JSON) " + statement,
            store.claim_statement(
                worker_id="w", queues=["default"], limits=[10], limit=10, token=1
            )[1],
        )
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return plan[0]["Plan"]


def _nodes(node):
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)


# Admin and command ---------------------------------------------------------------------------


def test_admin_shows_filters_and_searches_the_keys(client):
    from django.contrib.auth.models import User
    from django.urls import reverse

    client.force_login(User.objects.create_superuser("root", password="pw"))
    unique = enqueue("record", unique_key="invoice:9", unique_while="pending")
    serial = enqueue("record", serial_key="acct-3")
    plain = enqueue("record")
    url = reverse("admin:django_dbqueue_backgroundjob_changelist")
    ids = lambda params: [o.id for o in client.get(url, params).context["cl"].result_list]  # noqa: E731
    assert ids({"flow": "unique"}) == [unique.id]
    assert ids({"flow": "serial"}) == [serial.id]
    assert ids({"q": "invoice:9"}) == [unique.id]
    assert ids({"q": "acct-3"}) == [serial.id]
    assert ids({"q": str(plain.id)}) == [plain.id]
    page = client.get(
        reverse("admin:django_dbqueue_backgroundjob_change", args=[unique.id])
    ).content.decode()
    assert "invoice:9" in page and "Flow control" in page
    claim()  # started: a pending-mode job no longer holds its key
    assert ids({"flow": "unique"}) == []
    page = client.get(
        reverse("admin:django_dbqueue_backgroundjob_change", args=[unique.id])
    ).content.decode()
    assert "no: it has started" in page


def test_admin_and_command_name_the_holder_of_a_requeued_jobs_key(client, capsys):
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.urls import reverse

    client.force_login(User.objects.create_superuser("root", password="pw"))
    dead = enqueue("record", unique_key="acct:5")
    set_state(dead.id, "state = 'dead', finished_at = now()")
    holder = enqueue("record", unique_key="acct:5")
    response = client.post(
        reverse("admin:django_dbqueue_backgroundjob_changelist"),
        {"action": "requeue", "_selected_action": [str(dead.id)]},
        follow=True,
    )
    assert [str(m) for m in response.context["messages"]] == [
        f"Job #{dead.id} was not requeued: its unique key 'acct:5' is held by job #{holder.id} "
        "(pending). Requeue it once that job has finished."
    ]
    call_command("jobqueue_requeue", "--ids", str(dead.id))
    err = capsys.readouterr().err
    assert f"job {dead.id}: its unique key 'acct:5' is held by job {holder.id} (pending)" in err
    assert job_row(dead.id)["state"] == "dead"
