"""Fair queues (docs/fairness.md): the fair claim takes jobs round-robin by fair key.

Against a real PostgreSQL: the order across keys, priority within a key, the keyless jobs as one
key, the option's validation, the claim's plan, and two sessions claiming one fair queue at once
(the first claim held open, uncommitted, while the second runs; both orders).
"""

import psycopg
import pytest
from django.db import connection

from django_dbqueue import (
    EnqueueError,
    JobRegistrationError,
    Workflow,
    checks,
    enqueue,
    enqueue_many,
    job,
    registry,
    store,
)
from django_dbqueue.claiming import next_cursors
from django_dbqueue.connections import connection_params
from django_dbqueue.registry import JobType
from tests.utils import scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

FAIR = {"QUEUES": {"default": {}, "emails": {}, "tenants": {"fair": True}}, "STATUS_INTERVAL": 0}


@pytest.fixture
def fair_settings(settings):
    settings.DBQUEUE = dict(FAIR)
    registry.register(
        JobType(name="fair-t", func=lambda ctx: None, queue="tenants", fair_key=_tenant)
    )
    yield settings
    registry.unregister("fair-t")


def _tenant(payload):
    return payload.get("tenant")


def add(tenant, count=1, priority=None):
    """``count`` jobs of ``tenant`` (None: no key) in the fair queue; their ids."""
    return [
        j.id
        for j in enqueue_many(
            [
                {"type": "fair-t", "payload": {"tenant": tenant}, "priority": priority}
                for _ in range(count)
            ]
        )
    ]


class Claimer:
    """A worker's claims of the fair queue, each committed, with its cursor carried along."""

    def __init__(self, worker="w"):
        self.worker = worker
        self.cursors = {}

    def statement(self, limit):
        return store.claim_statement(
            worker_id=self.worker,
            queues=["tenants"],
            limits=[limit],
            limit=limit,
            token=store.new_token(),
            fair=[True],
            cursors=self.cursors,
        )

    def claim(self, limit):
        rows = store.claim(
            "default",
            worker_id=self.worker,
            queues=["tenants"],
            limits=[limit],
            limit=limit,
            token=store.new_token(),
            fair=[True],
            cursors=self.cursors,
        )
        next_cursors(self.cursors, rows)
        return rows


def keys_of(rows):
    return [row.fair_key for row in rows]


def test_one_claim_serves_every_key_once_before_any_key_twice(fair_settings):
    add("big", 50)
    for i in range(5):
        add(f"t{i}")
    rows = Claimer().claim(6)
    assert sorted(keys_of(rows)) == ["big", "t0", "t1", "t2", "t3", "t4"]
    assert all(row.fair_pos > 0 for row in rows)


def test_claims_rotate_through_the_keys_from_where_the_last_one_stopped(fair_settings):
    big = add("big", 100)
    singles = [add(f"t{i:02}")[0] for i in range(10)]
    claimer = Claimer()
    seen = []
    for _ in range(4):  # 11 keys, 3 per claim: every key within ceil(11 / 3) = 4 claims
        seen += claimer.claim(3)
    assert {row.id for row in seen} >= set(singles)
    # The backlog's key had its turn too, and never more than one job per claim while other
    # keys waited.
    assert 1 <= sum(row.id in big for row in seen) <= 2
    # After the rotation only the backlog is left: a whole claim of it.
    assert keys_of(claimer.claim(3)) == ["big"] * 3


def test_priority_orders_the_jobs_within_a_key_not_across_keys(fair_settings):
    low = add("a", 2, priority=0)
    high = add("a", 1, priority=50)
    other = add("b", 1, priority=-50)
    rows = Claimer().claim(2)
    assert {row.id for row in rows} == {high[0], other[0]}
    rows = Claimer().claim(1)
    assert [row.id for row in rows] == [low[0]]


def test_jobs_without_a_key_share_one_key(fair_settings):
    keyless = add(None, 5)
    keyed = add("a", 5)
    assert scalar("SELECT fair_key FROM dbqueue_job WHERE id = %s", [keyless[0]]) == ""
    rows = Claimer().claim(4)
    assert sorted(row.id in keyless for row in rows) == [False, False, True, True]
    assert {row.fair_key for row in rows} == {"", "a"}
    assert set(keyless) & {row.id for row in rows} and set(keyed) & {row.id for row in rows}


def test_the_keyless_key_takes_its_turn_in_the_rotation(fair_settings):
    add(None, 3)
    for key in ("a", "b", "c"):
        add(key, 3)
    claimer = Claimer()
    served = [keys_of(claimer.claim(1))[0] for _ in range(8)]
    # One job per claim: a, b, c, the keyless jobs' shared key '', then round again.
    assert served == ["a", "b", "c", "", "a", "b", "c", ""]


def test_enqueue_stores_the_key_from_the_type_the_argument_and_every_path(fair_settings):
    one = enqueue("fair-t", {"tenant": 7})
    given = enqueue("fair-t", {"tenant": 7}, fair_key="override")
    none = enqueue("fair-t", {})
    [many] = enqueue_many([{"type": "fair-t", "payload": {}, "fair_key": 9}])
    wf = Workflow()
    first = wf.add("fair-t", {"tenant": "w1"})
    wf.add("fair-t", {"tenant": "w2"}, depends_on=[first])
    flow_ids = [j.id for j in wf.enqueue()]
    keys = dict(
        (i, scalar("SELECT fair_key FROM dbqueue_job WHERE id = %s", [i]))
        for i in [one.id, given.id, none.id, many.id, *flow_ids]
    )
    assert keys == {
        one.id: "7",
        given.id: "override",
        none.id: "",  # the shared key of a fair queue's jobs without one
        many.id: "9",
        flow_ids[0]: "w1",
        flow_ids[1]: "w2",
    }


def _fair_index_size():
    return scalar("SELECT pg_relation_size('dbqueue_job_fair_idx')")


def test_a_plain_job_writes_no_entry_in_the_fair_index(fair_settings):
    """The fair index holds the jobs with a key only (migration 0025): 2,000 plain jobs leave it
    as it was (its metapage), 2,000 keyed ones grow it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'dbqueue_job_fair_idx'")
        assert "fair_key IS NOT NULL" in cursor.fetchone()[0]
    empty = _fair_index_size()
    plain = enqueue_many([("noop", {}) for _ in range(2000)])
    assert (
        scalar(
            "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND fair_key IS NULL",
            [[j.id for j in plain]],
        )
        == 2000
    )
    assert _fair_index_size() == empty
    add("a", 2000)
    assert _fair_index_size() > empty


def sql_enqueue(payload, **options):
    args = ", ".join(f"{name} => %({name})s" for name in options)
    return scalar(
        f"SELECT dbqueue_enqueue('fair-t', %(payload)s::jsonb, queue => 'tenants'"
        f"{', ' + args if args else ''})",
        {"payload": payload, **options},
    )


def test_jobs_enqueued_in_sql_without_a_key_are_claimed_on_a_fair_queue(fair_settings):
    """dbqueue_enqueue() cannot read the settings, so its jobs have no fair key (NULL) and no
    entry in the fair index: the fair claim takes them when a plain claim would, as one more
    key after the walk, without moving the cursor."""
    alone = sql_enqueue('{"tenant": "sql"}')
    assert scalar("SELECT fair_key FROM dbqueue_job WHERE id = %s", [alone]) is None
    claimer = Claimer()
    [row] = claimer.claim(5)
    assert (row.id, row.fair_key) == (alone, None)
    assert claimer.cursors == {}
    # Behind a keyed backlog: a plain claim would reach it after the 30 older jobs; so does
    # the fair claim, sharing each claim with the backlog's key once it is among the first 5.
    add("big", 30)
    late = sql_enqueue('{"tenant": "sql"}')
    urgent = sql_enqueue('{"tenant": "sql"}', priority=50)
    first = claimer.claim(5)
    assert urgent in {r.id for r in first} and late not in {r.id for r in first}
    assert claimer.cursors == {"tenants": "big"}
    claims = 0
    while late not in {r.id for r in claimer.claim(5)}:
        claims += 1
        assert claims < 8, "the SQL-enqueued job was never claimed"
    # Not before the older jobs ahead of it: 30 of them, 4 taken beside the urgent one.
    assert claims == 5


def test_bad_keys_and_options_are_refused_with_what_was_wrong(fair_settings):
    with pytest.raises(EnqueueError, match=r"fair_key must be a str or an int, got list"):
        enqueue("fair-t", {}, fair_key=[1])
    with pytest.raises(EnqueueError, match=r"fair_key\(payload\) raised KeyError"):
        registry.register(
            JobType(name="fair-bad", func=lambda ctx: None, fair_key=lambda p: p["missing"])
        )
        try:
            enqueue("fair-bad", {})
        finally:
            registry.unregister("fair-bad")
    with pytest.raises(JobRegistrationError, match=r"fair_key must be a callable of the payload"):
        job("fair-not-callable", fair_key="tenant")


def test_checks_refuse_a_non_bool_fair_and_warn_when_a_limit_applies(settings):
    def check_settings():  # the testapp's "email" type needs its queue
        settings.DBQUEUE["QUEUES"]["emails"] = {}
        return checks.check_settings()

    settings.DBQUEUE = {"QUEUES": {"default": {}, "tenants": {"fair": "yes"}}}
    [message] = check_settings()
    assert message.id == "dbqueue.E003"
    assert "['tenants']['fair'] must be True or False, got 'yes'" in message.msg
    settings.DBQUEUE = {"QUEUES": {"default": {}, "tenants": {"fair": True}}}
    assert check_settings() == []
    # Another queue's limit leaves a worker of the fair queue alone fair: no warning (a worker
    # serving both logs it at start).
    settings.DBQUEUE = {"QUEUES": {"default": {"global_concurrency": 2}, "tenants": {"fair": True}}}
    assert check_settings() == []
    settings.DBQUEUE = {
        "QUEUES": {"default": {}, "tenants": {"fair": True, "global_concurrency": 3}}
    }
    [warning] = check_settings()
    assert warning.id == "dbqueue.W004" and "queue 'tenants' global_concurrency" in warning.msg
    registry.register(JobType(name="fair-limited", func=lambda ctx: None, global_concurrency=2))
    try:
        settings.DBQUEUE = {"QUEUES": {"default": {}, "tenants": {"fair": True}}}
        [warning] = check_settings()
    finally:
        registry.unregister("fair-limited")
    assert warning.id == "dbqueue.W004" and "job type 'fair-limited'" in warning.msg
    settings.DBQUEUE = {"QUEUES": {"default": {}, "tenants": {"fair": True, "fair_concurency": 2}}}
    [message] = check_settings()
    assert message.id == "dbqueue.E002"


def test_the_fair_claim_walks_its_index_whatever_the_backlog(fair_settings):
    add("big", 2000)
    for i in range(200):
        add(f"k{i:03}")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE dbqueue_job")
    statement, params = Claimer().statement(10)
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF) " + statement, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("ROLLBACK")
    assert "dbqueue_job_fair_idx" in plan
    assert "Seq Scan on dbqueue_job" not in plan
    # The walk probed about as many keys as it had slots, not the 201 keys.
    walk = [line for line in plan.splitlines() if "fair_key)::text > w.key" in line]
    assert walk, plan


def session():
    return psycopg.connect(**connection_params("default"), autocommit=False)


def claim_on(conn, claimer, limit):
    statement, params = claimer.statement(limit)
    with conn.cursor() as cursor:
        cursor.execute(statement, params)
        return store.claimed_rows(cursor.fetchall())


@pytest.mark.parametrize("first", ["a", "b"])
def test_two_sessions_claiming_at_once_never_take_a_job_twice(fair_settings, first):
    """The first claim is held open (its rows locked, uncommitted) while the second runs: the
    second passes over the locked rows (SKIP LOCKED) and takes the next jobs of the same keys,
    never one of the first's. Both orders, then both commit."""
    ids = add("big", 6) + add("x", 3) + add("y", 3)
    conns = {"a": session(), "b": session()}
    claimers = {"a": Claimer("a"), "b": Claimer("b")}
    second = "b" if first == "a" else "a"
    try:
        got_first = claim_on(conns[first], claimers[first], 3)
        got_second = claim_on(conns[second], claimers[second], 3)
        conns[first].commit()
        conns[second].commit()
    finally:
        for conn in conns.values():
            conn.close()
    ids_first = {row.id for row in got_first}
    ids_second = {row.id for row in got_second}
    assert len(ids_first) == 3 and len(ids_second) == 3
    assert not ids_first & ids_second
    assert sorted(keys_of(got_first)) == sorted(keys_of(got_second)) == ["big", "x", "y"]
    running = scalar(
        "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state = 'running'", [ids]
    )
    assert running == 6


def test_a_worker_serving_fair_and_plain_queues_runs_both(fair_settings, start_worker):
    fair_settings.DBQUEUE = {**FAIR, "POLL_INTERVAL": 0.05}
    fair_ids = add("big", 30) + add("small", 2)
    plain = [enqueue("noop", {}).id for _ in range(5)]
    worker = start_worker(queues=["default", "tenants"], concurrency=4)
    assert worker.fair == [False, True]
    wait_until(
        lambda: (
            scalar(
                "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state = 'done'",
                [fair_ids + plain],
            )
            == len(fair_ids + plain)
        ),
        timeout=20,
        message="every job done",
    )


@pytest.mark.parametrize("seed", [40, 0])
def test_the_fair_claim_planned_once_fits_a_small_and_a_large_table(fair_settings, seed):
    """The worker's Session plans CLAIM_FAIR once (connections.PlannedOnce): the generic plan
    made with the statistics of a small table of one key (``seed`` jobs; 0: an empty table,
    as when a worker starts before any job) still walks the fair index, never the table, once
    a backlog and many keys arrive (tests/integration/test_plans.py reads it the same way)."""
    from tests.integration.test_plans import Explained, scans

    add("a", seed)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE dbqueue_job")
    explained = Explained()
    explained.session.connection().execute(
        "SET auto_explain.log_analyze = on; SET auto_explain.log_timing = off", prepare=False
    )
    claimer = Claimer("plans")
    try:
        for run in range(8):
            if run == 6:  # the plan is made and kept by now: the table grows under it
                add("big", 3000)
                for i in range(300):
                    add(f"k{i:03}")
            rows, plan = explained.run(*claimer.statement(5))
            claimed = store.claimed_rows(rows)
            next_cursors(claimer.cursors, claimed)
            assert len(claimed) == (5 if seed or run >= 6 else 0), run
        assert len(claimed) == 5 and len(set(keys_of(claimed))) == 5
        generic = explained.session.execute(
            "SELECT generic_plans FROM pg_prepared_statements WHERE statement LIKE %(m)s",
            {"m": "%walk (queue, lim, cursor, pos, key, phase, served, open)%"},
        )
        assert generic and generic[0][0] == 8
    finally:
        explained.close()
    found = scans(plan)
    assert ("Seq Scan", "dbqueue_job", None) not in found
    assert any(index == "dbqueue_job_fair_idx" for _, _, index in found), found
    # Nothing reads the backlog: the first version's probe for keyless jobs, planned on the
    # small table, filtered the whole claim index (20,000 rows per claim on a 20,000 backlog), and the
    # per-key fetch, planned with one key's statistics, filtered the claim index (3,000 rows).
    assert _rows_read(plan) < 200, _rows_read(plan)


def _rows_read(plan):
    """The rows every scan of ``plan`` returned or filtered out, over all its loops."""
    loops = plan.get("Actual Loops", 1)
    own = 0
    if "Scan" in plan["Node Type"] and "Relation Name" in plan:
        own = (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * loops
    return own + sum(_rows_read(child) for child in plan.get("Plans", ()))
