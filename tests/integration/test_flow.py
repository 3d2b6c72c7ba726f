"""Flow control in the claim: fleet-wide concurrency and rate limits, paused queues.

Real PostgreSQL, and a second real connection where the promise is about two claimers at once.
"""

import json
import threading
import time

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import django_dbqueue
from django_dbqueue import enqueue, enqueue_many, flow, registry, store
from django_dbqueue.connections import connection_params
from django_dbqueue.registry import JobType
from django_dbqueue.store import claiming
from tests.utils import scalar

pytestmark = pytest.mark.django_db(transaction=True)

NO_FLOW = {
    "q_conc": [None],
    "q_rate_n": [None],
    "q_rate_period": [None],
    "q_rate_key": [None],
    "t_names": [],
    "t_conc": [],
    "t_rate_n": [],
    "t_rate_period": [],
    "t_rate_key": [],
}


def limits(queue_conc=None, rate=None, types=()):
    """The limited claim's parameters for the queue "default" (``types``: JobType-like tuples
    ``(name, conc, rate)``)."""
    params = dict(NO_FLOW)
    params["q_conc"] = [queue_conc]
    if rate:
        params["q_rate_n"] = [rate["limit"]]
        params["q_rate_period"] = [float(rate["period"])]
        params["q_rate_key"] = [rate.get("key")]
    params["t_names"] = [t[0] for t in types]
    params["t_conc"] = [t[1] for t in types]
    params["t_rate_n"] = [t[2] and t[2]["limit"] for t in types]
    params["t_rate_period"] = [t[2] and float(t[2]["period"]) for t in types]
    params["t_rate_key"] = [t[2] and t[2].get("key") for t in types]
    return params


def claim(n, params, worker="w1", using="default"):
    return store.claim(
        using,
        worker_id=worker,
        queues=["default"],
        limits=[n],
        limit=n,
        token=store.new_token(),
        flow=params,
    )


def running(queue="default"):
    return scalar(
        "SELECT count(*) FROM dbqueue_job WHERE state = 'running' AND queue = %s", [queue]
    )


def finish(rows):
    store.complete("default", [(r.id, token_of(r.id), None) for r in rows])


def token_of(job_id):
    return scalar("SELECT lease_token FROM dbqueue_job WHERE id = %s", [job_id])


def test_queue_concurrency_limit_caps_running_jobs_and_says_it_held_the_claim():
    enqueue_many([("noop", {})] * 10)
    first = claim(4, limits(queue_conc=3))
    assert len(first) == 3 and first.held
    assert first.reopen_in is None  # no rate limit: nothing to wait for but a slot
    assert len(claim(4, limits(queue_conc=3), worker="w2")) == 0
    finish(first[:2])
    again = claim(10, limits(queue_conc=3), worker="w2")
    assert len(again) == 2 and again.held
    assert running() == 3


def test_an_expired_lease_still_holds_its_slot_until_swept():
    enqueue_many([("noop", {})] * 3)
    [job] = claim(1, limits(queue_conc=1))
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET leased_until = now() - interval '1 second' WHERE id = %s",
            [job.id],
        )
    assert claim(1, limits(queue_conc=1)) == []
    store.rescue_expired("default", limit=10, base=0.0, factor=1.0, cap=0.0)
    assert len(claim(1, limits(queue_conc=1))) == 1


def test_type_concurrency_counts_the_type_in_every_queue():
    enqueue_many([("noop", {})] * 5 + [("echo", {})] * 5)
    enqueue("noop", {}, queue="emails")
    store.claim(
        "default",
        worker_id="x",
        queues=["emails"],
        limits=[1],
        limit=1,
        token=1,
    )  # one noop runs in another queue
    got = claim(10, limits(types=[("noop", 2, None)]))
    types = sorted(r.type for r in got)
    assert types == ["echo"] * 5 + ["noop"], types
    assert got.held


def test_two_claimers_serialise_on_the_limiter_and_the_second_sees_the_first():
    """The READ COMMITTED trap: the second claim waits for the first's limiter lock, then
    counts with a fresh snapshot the running jobs the first committed."""
    enqueue_many([("noop", {})] * 20)
    params = limits(queue_conc=5)
    with psycopg.connect(**connection_params("default"), autocommit=False) as other:
        first = other.execute(
            *store.claim_statement(
                worker_id="first",
                queues=["default"],
                limits=[5],
                limit=5,
                token=7,
                flow=params,
            )
        ).fetchall()
        assert len([r for r in first if r[0] is not None]) == 5  # not committed yet
        result = {}

        def second_claim():
            from django.db import connections

            try:
                result["rows"] = claim(5, params)
            finally:
                connections.close_all()

        second = threading.Thread(target=second_claim)
        second.start()
        second.join(0.5)
        assert second.is_alive(), "the second claim did not wait for the limiter lock"
        other.commit()
        second.join(10)
    assert result["rows"] == [] and result["rows"].held
    assert running() == 5


def test_concurrent_claimers_never_exceed_the_limit():
    enqueue_many([("noop", {})] * 200)
    params = limits(queue_conc=7)
    peak = []
    stop = threading.Event()

    def hammer(name):
        from django.db import connections

        try:
            while not stop.is_set():
                rows = claim(3, params, worker=name)
                peak.append(running())
                if rows:
                    store.complete("default", [(r.id, token_of(r.id), None) for r in rows[:1]])
        finally:
            connections.close_all()

    threads = [threading.Thread(target=hammer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # the load's duration, not a wait for a condition
    stop.set()
    for t in threads:
        t.join(10)
    assert peak and max(peak) <= 7, max(peak)


def test_rate_limit_takes_at_most_n_per_period_and_says_when_it_reopens():
    enqueue_many([("noop", {})] * 10)
    params = limits(rate={"limit": 3, "period": 2})
    first = claim(10, params)
    assert len(first) == 3
    assert first.reopen_in is not None and 1.5 < first.reopen_in <= 2.0
    second = claim(10, params, worker="w2")
    assert second == [] and 1.0 < second.reopen_in <= 2.0
    starts = scalar(
        "SELECT cardinality(starts) FROM dbqueue_limiter WHERE scope = 'queue' AND name = 'default'"
    )
    assert starts == 3
    # the window slides: pretend the starts happened 2 s ago
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_limiter SET starts = ARRAY(SELECT s - interval '2.1 seconds' "
            "FROM unnest(starts) AS s)"
        )
    assert len(claim(10, params)) == 3


def test_keyed_rate_limit_partitions_by_payload_field_and_missing_field_shares_one():
    enqueue_many(
        [("noop", {"account_id": 1})] * 4 + [("noop", {"account_id": "2"})] * 4 + [("noop", {})] * 4
    )
    params = limits(rate={"limit": 2, "period": 60, "key": "account_id"})
    got = claim(20, params)
    accounts = sorted(str(r.payload.get("account_id")) for r in got)
    assert accounts == ["1", "1", "2", "2", "None", "None"], accounts
    assert got.reopen_in is not None and got.reopen_in > 50


def test_type_rate_limit_applies_across_queues():
    enqueue_many([("noop", {})] * 5)
    params = limits(types=[("noop", None, {"limit": 2, "period": 60})])
    assert len(claim(10, params)) == 2
    assert claim(10, params) == []


def test_pause_stops_both_claims_and_resume_wakes_the_workers():
    enqueue_many([("noop", {})] * 4)
    django_dbqueue.pause_queue("default", by="test")
    assert claim(10, None) == []
    assert claim(10, limits(queue_conc=5)) == []
    with psycopg.connect(**connection_params("default"), autocommit=True) as listener:
        listener.execute("LISTEN dbqueue")
        django_dbqueue.resume_queue("default", by="test")
        notes = list(listener.notifies(timeout=2, stop_after=1))
    assert [n.payload for n in notes] == ["4:default"]
    assert len(claim(10, None)) == 4
    row = scalar("SELECT changed_by FROM dbqueue_queue WHERE name = 'default'")
    assert row == "test"


def test_pause_refuses_a_queue_not_in_settings():
    with pytest.raises(flow.UnknownQueue, match="'nope' is not in DBQUEUE"):
        django_dbqueue.pause_queue("nope")


def test_unlimited_claim_is_one_statement_and_keeps_its_plan_with_the_pause_filter():
    enqueue_many([("noop", {})] * 20)
    with CaptureQueriesContext(connection) as queries:
        claim(10, None)
    assert len(queries) == 1
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE dbqueue_job")
        statement, params = store.claim_statement(
            worker_id="w", queues=["default"], limits=[10], limit=10, token=1
        )
        assert statement == claiming.CLAIM_JOBS  # no limit configured: the plain claim
        cursor.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    text = json.dumps(plan)
    assert "dbqueue_job_claim_idx" in text
    # the pause probe: an index lookup per queue, joined before the lateral scan of the queue
    nodes = [(n["Node Type"], n.get("Relation Name")) for n in _walk(plan[0]["Plan"])]
    # the pause probe runs in its own CTE, before (not after) the queue's lateral scan
    cte = [n for n in _walk(plan[0]["Plan"]) if n.get("Subplan Name") == "CTE claimable"]
    assert cte and "dbqueue_queue" in json.dumps(cte), nodes


def test_limited_claim_is_one_statement():
    enqueue_many([("noop", {})] * 3)
    with CaptureQueriesContext(connection) as queries:
        claim(10, limits(queue_conc=2))
    assert len(queries) == 1


def test_worker_routes_only_limited_configurations_through_the_function(settings):
    settings.DBQUEUE = {"QUEUES": {"default": {}, "emails": {"global_concurrency": 2}}}
    from django_dbqueue.conf import get_settings

    assert flow.claim_params(get_settings(), ["default"]) is None
    params = flow.claim_params(get_settings(), ["default", "emails"])
    assert params["q_conc"] == [None, 2]
    registry.register(JobType(name="limited-t", func=lambda ctx: None, global_concurrency=1))
    try:
        assert flow.claim_params(get_settings(), ["default"])["t_names"] == ["limited-t"]
    finally:
        registry.unregister("limited-t")


def test_a_worker_with_fleet_wide_limits_claims_only_for_its_free_threads(settings):
    """A job claimed under a fleet-wide limit takes the fleet's slot at once: a worker never
    claims one ahead of a free thread (no prefetch), so an idle worker can take it instead."""
    from django_dbqueue.worker import Worker

    settings.DBQUEUE = {"QUEUES": {"default": {"global_concurrency": 10}}}
    enqueue_many([("noop", {})] * 10)
    worker = Worker(concurrency=3, listen=False)
    try:
        assert worker.prefetch == 0
        claimed, asked = worker.run_once()
        assert (claimed, asked) == (3, 3)
        assert running() == 3  # seven slots of the limit left for the rest of the fleet
        assert worker.run_once() == (0, 0)  # every thread busy: no claim at all
    finally:
        worker.session.close()
    rows = claim(10, limits(queue_conc=10), worker="w2")
    assert len(rows) == 7 and not any(r.keyed for r in rows)


def test_the_limited_claim_says_which_jobs_are_keyed():
    keyed = enqueue("noop", serial_key="acct").id
    free = enqueue("noop").id
    rows = claim(10, limits(queue_conc=10))
    assert {r.id: r.keyed for r in rows} == {keyed: True, free: False} and rows.keyed


def _walk(node):
    yield node
    for child in node.get("Plans", []):
        yield from _walk(child)


def test_a_full_partition_with_a_long_backlog_does_not_hide_the_others():
    enqueue_many([("noop", {"account_id": 1})] * 1500 + [("noop", {"account_id": 2})] * 3)
    params = limits(rate={"limit": 2, "period": 60, "key": "account_id"})
    got = claim(10, params)
    accounts = sorted(r.payload["account_id"] for r in got)
    assert accounts == [1, 1, 2, 2], accounts


def test_keyed_type_rate_limit_and_type_concurrency_together():
    enqueue_many([("noop", {"k": "a"})] * 5 + [("noop", {"k": "b"})] * 5 + [("echo", {})] * 3)
    params = limits(types=[("noop", 3, {"limit": 2, "period": 60, "key": "k"})])
    got = claim(20, params)
    noops = sorted(r.payload["k"] for r in got if r.type == "noop")
    assert noops == ["a", "a", "b"], noops  # concurrency 3 binds before the b partition's 2nd
    assert sum(r.type == "echo" for r in got) == 3
    assert got.held


def test_burst_workers_held_back_by_a_limit_wait_for_their_turn_and_drain_it(settings):
    from django_dbqueue.worker import Worker
    from tests.integration.conftest import FAST

    settings.DBQUEUE = {**FAST, "QUEUES": {"default": {"global_concurrency": 2}, "emails": {}}}
    jobs = [j.id for j in enqueue_many([("sleep", {"seconds": 0.05})] * 12)]
    workers = [Worker(burst=True, concurrency=4, listen=False) for _ in range(2)]
    threads = [threading.Thread(target=w.run) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert (
        scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'done' AND id = ANY(%s)", [jobs])
        == 12
    )
    started = scalar(
        "SELECT max(n) FROM (SELECT (SELECT count(*) FROM dbqueue_job AS o WHERE o.id = ANY(%s) "
        "AND o.started_at <= j.started_at AND o.finished_at > j.started_at) AS n "
        "FROM dbqueue_job AS j WHERE j.id = ANY(%s)) AS x",
        [jobs, jobs],
    )
    assert started <= 2, started


def test_running_counts_read_the_running_index_not_the_history():
    """The limited claim counts running jobs per queue and per type (migration 0010): with 50,000
    finished rows, both counts are index scans of the running jobs' partial index."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
                max_attempts, lease_seconds, errors, created_at, finished_at)
            SELECT 'noop', 'default', '{}', 'done', 0, now(), 1, 10, 60, '[]', now(), now()
            FROM generate_series(1, 50000)
            """
        )
        cursor.execute("ANALYZE dbqueue_job")
        for column in ("queue", "type"):
            cursor.execute(
                "EXPLAIN (FORMAT JSON) SELECT count(*) FROM dbqueue_job AS j "
                f"WHERE j.state = 'running' AND j.{column} = %s",
                ["default" if column == "queue" else "noop"],
            )
            plan = cursor.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            scans = [
                n.get("Index Name") for n in _walk(plan[0]["Plan"]) if "Scan" in n["Node Type"]
            ]
            assert scans == ["dbqueue_job_lease_idx"], scans


def test_a_later_pass_of_the_limited_claim_never_takes_a_job_twice():
    # One job of account A ahead of a backlog of B that fills the first pass's bound: the second
    # pass must not pick A's job again (this transaction's own lock does not make SKIP LOCKED
    # skip it), which would spend two of A's starts on one job.
    enqueue_many(
        [{"type": "record", "payload": {"acct": "A"}, "priority": 5}]
        + [{"type": "record", "payload": {"acct": "B"}}] * 1100
    )
    params = dict(
        store.claim_statement(worker_id="w", queues=["default"], limits=[50], limit=50, token=7)[1]
    )
    params.update(
        q_conc=[None],
        q_rate_n=[10],
        q_rate_period=[60.0],
        q_rate_key=["acct"],
        t_names=[],
        t_conc=[],
        t_rate_n=[],
        t_rate_period=[],
        t_rate_key=[],
    )
    with connection.cursor() as cursor:
        cursor.execute(claiming.CLAIM_LIMITED, params)
        claimed = store.claimed_rows(cursor.fetchall())
        cursor.execute("SELECT part, cardinality(starts) FROM dbqueue_limiter ORDER BY part")
        starts = dict(cursor.fetchall())
    assert len(claimed) == len({row.id for row in claimed}) == 11
    assert starts == {"A": 1, "B": 10}
