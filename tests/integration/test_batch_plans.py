"""The plan of the batch top-up (``CLAIM_MORE_OF_TYPE``, store/batches.py), read with auto_explain
as an execution really used it (tests/integration/test_plans.py does the same for the claim): it
walks the queue's claim index, never the whole table, and updates the rows it chose by primary
key; in the table states where a bad plan is likely (a big table whose statistics are still an
empty one's, a backlog with nothing running, a busy fleet, a queue shared with a backlog of other
types). The top-up is planned for each execution's values (it is not ``PlannedOnce``): on a table
of a few rows the planner rightly reads it whole, which these tests do not hold against it.
"""

import pytest
from django.db import connection

from django_dbqueue import store
from tests.integration.test_plans import Explained, analyze, fill, run_for_a_while, scans, subplan
from tests.utils import scalar

pytestmark = pytest.mark.django_db(transaction=True)


def top_up(explained, n, token, job_type="noop"):
    return explained.run(
        *store.claim_more_statement(
            worker_id="plans", queue="default", job_type=job_type, limit=n, token=token
        )
    )


def fill_other(n):
    """A backlog of another type in the same queue, due before the batch type's jobs."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET type = 'other', run_after = run_after - interval '1 minute' "
            "WHERE id IN (SELECT id FROM dbqueue_job ORDER BY id LIMIT %s)",
            [n],
        )


@pytest.mark.parametrize(
    ("state", "batch"),
    [("stale", 1), ("stale", 100), ("backlog", 100), ("fleet", 100), ("shared", 100)],
)
def test_the_top_up_walks_the_claim_index_and_updates_by_primary_key(state, batch):
    if state == "stale":
        analyze()  # the statistics of an empty table (a fresh install), then a backlog
        fill(20_000)
    else:
        fill(20_000)
        if state == "fleet":
            run_for_a_while(5_000)
        if state == "shared":
            fill_other(15_000)  # 5,000 of the batch type behind 15,000 of another
        analyze()
    explained = Explained()
    try:
        for _ in range(3):
            token = store.new_token()
            rows, plan = top_up(explained, batch, token)
            claimed = store.claimed_rows(rows)
            assert len(claimed) == batch
            assert {row.type for row in claimed} == {"noop"}
    finally:
        explained.close()
    found = scans(plan)
    assert ("Seq Scan", "dbqueue_job", None) not in found, plan
    chosen = subplan(plan, "CTE chosen")
    assert chosen is not None, plan
    chosen_scans = [s for s in scans(chosen) if s[1] == "dbqueue_job"]
    assert chosen_scans and all(node != "Seq Scan" for node, _, _ in chosen_scans), chosen
    assert ("Index Scan", "dbqueue_job", "dbqueue_job_claim_idx") in chosen_scans, chosen
    # The update of the chosen rows: primary-key probes (one per id, or one bitmap of them),
    # never a walk of the table or of another index.
    updated = [s for s in found if s not in chosen_scans and s[1] == "dbqueue_job"]
    assert updated and {index for _, _, index in updated} <= {None, "dbqueue_job_pkey"}, plan
    assert any(index == "dbqueue_job_pkey" for _, _, index in updated), plan
    assert scalar(
        "SELECT count(*) FROM dbqueue_job WHERE state = 'running' AND worker_id = 'plans'"
    ) == (3 * batch)


def test_a_paused_queue_gives_the_top_up_nothing():
    fill(10)
    scalar(
        "INSERT INTO dbqueue_queue (name, paused) VALUES ('default', true) "
        "ON CONFLICT (name) DO UPDATE SET paused = true RETURNING 1"
    )
    explained = Explained()
    try:
        rows, _ = top_up(explained, 5, store.new_token())
    finally:
        explained.close()
    assert len(store.claimed_rows(rows)) == 0
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'running'") == 0


def fill_fair(big, keys):
    """A fair queue's backlog: ``big`` jobs of one key, then one job of each of ``keys`` keys,
    every one of the batch type."""
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after,
                   attempts, max_attempts, lease_seconds, errors, created_at, fair_key)
               SELECT 'noop', 'default', '{}', 'pending', 0, now(), 0, 10, 60, '[]', now(),
                      CASE WHEN g <= %(big)s THEN 'big' ELSE 'k' || lpad(g::text, 6, '0') END
               FROM generate_series(1, %(n)s) AS g""",
            {"big": big, "n": big + keys},
        )


@pytest.mark.parametrize("state", ["stale", "backlog"])
def test_the_fair_top_up_walks_the_fair_index_not_the_backlog(state):
    """The top-up on a fair queue (CLAIM_MORE_FAIR, store/fair.py): round-robin from the cursor,
    planned for its values; it reads about the keys it serves, not one key's 20,000 jobs."""
    from tests.integration.test_fair_queues import _rows_read

    if state == "stale":
        analyze()
    fill_fair(20_000, 300)
    if state == "backlog":
        analyze()
    explained = Explained()
    try:
        cursor = ""
        for _ in range(3):
            rows, plan = explained.run(
                *store.claim_more_statement(
                    worker_id="plans",
                    queue="default",
                    job_type="noop",
                    limit=50,
                    token=store.new_token(),
                    fair_cursor=cursor,
                )
            )
            claimed = store.claimed_rows(rows)
            assert len(claimed) == 50
            keys = [row.fair_key for row in claimed]
            assert len(set(keys)) == 50, keys  # one job of each of 50 keys
            cursor = max(row.fair_key for row in claimed if row.fair_key != "big")
    finally:
        explained.close()
    assert ("Seq Scan", "dbqueue_job", None) not in scans(plan), _seq_scans(plan)
    assert _rows_read(plan) < 1_000, _rows_read(plan)


def _seq_scans(plan, where="top"):
    """Where ``plan`` reads dbqueue_job whole: the names of the CTEs and loops it happens in."""
    where = plan.get("Subplan Name", where)
    found = []
    if plan["Node Type"] == "Seq Scan" and plan.get("Relation Name") == "dbqueue_job":
        found.append(
            (
                where,
                plan.get("Filter"),
                plan.get("Actual Loops"),
                plan.get("Rows Removed by Filter"),
            )
        )
    for child in plan.get("Plans", ()):
        found.extend(_seq_scans(child, where))
    return found
