"""The plans of the statements a worker's Session plans once (connections.PlannedOnce), and the array
literals its hot statements bind.

A generic plan is made once per connection, with the statistics of that moment, and then serves
every batch and every table size until the table is next analyzed. So these tests make the plan in
the states where a bad one was seen or is likely (statistics of an empty table, of a backlog
with nothing running) and check its shape, then that the same session still finds the right
rows once the table looks different. The plans are read with auto_explain, which logs the plan
an execution actually used (EXPLAIN of a statement with parameters would plan it for them),
including the plans of the statements run inside it (the workflow trigger's, a function's).
"""

import json

import hypothesis
import psycopg
import pytest
from django.db import connection
from hypothesis import given
from hypothesis import strategies as st

from django_dbqueue import chain, store
from django_dbqueue.connections import _PLAN_MODE, Session, connection_params
from django_dbqueue.store import operations
from tests.utils import job_row, scalar

pytestmark = pytest.mark.django_db(transaction=True)

FILL = """
INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
                         max_attempts, lease_seconds, errors, created_at)
SELECT 'noop', 'default', '{}', 'pending', 0, now() - interval '1 second', 0, 10, 60, '[]',
       now()
FROM generate_series(1, %s)
"""


def fill(n):
    with connection.cursor() as cursor:
        cursor.execute(FILL, [n])


def analyze():
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE dbqueue_job")


def run_for_a_while(n):
    """Jobs claimed by another worker and left running: a fleet's table."""
    with connection.cursor() as cursor:
        cursor.execute(
            """UPDATE dbqueue_job SET state = 'running', attempts = 1, worker_id = 'other',
                      lease_token = 1, started_at = now(), leased_until = now() + interval '1 h'
               WHERE id IN (SELECT id FROM dbqueue_job WHERE state = 'pending'
                            ORDER BY id LIMIT %s)""",
            [n],
        )


class Explained:
    """A Session whose executions log their plans to it (auto_explain, JSON)."""

    def __init__(self):
        self.session = Session("default")
        self.plans = []
        conn = self.session.connection()
        try:
            conn.execute("LOAD 'auto_explain'", prepare=False)
        except psycopg.errors.InsufficientPrivilege as exc:
            self.session.reset()
            pytest.skip(f"auto_explain needs LOAD, which this role may not run: {exc}")
        except psycopg.errors.UndefinedFile as exc:
            self.session.reset()
            pytest.skip(f"auto_explain is not installed on this server: {exc}")
        conn.execute(
            "SET auto_explain.log_min_duration = 0; SET auto_explain.log_format = json; "
            "SET auto_explain.log_level = notice; SET auto_explain.log_nested_statements = on",
            prepare=False,
        )
        conn.add_notice_handler(self._notice)

    def _notice(self, diag):
        text = diag.message_primary or ""
        if "plan:" in text:
            self.plans.append(json.loads(text[text.index("plan:") + 5 :])["Plan"])

    def run(self, statement, params):
        self.plans.clear()
        rows = self.session.execute(statement, params)
        assert self.plans, "auto_explain logged no plan"
        # The statement's own plan is logged last, after those of the statements it ran (the
        # plan-mode SETs log none).
        return rows, self.plans[-1]

    def close(self):
        self.session.reset()


MARKS = {  # a part of each statement's text that no other statement has
    "claim": "claimable AS MATERIALIZED",
    "complete": "completed AS (",
    "extend": "SET leased_until = now() + j.lease_seconds",
}


def prepared_plans(session):
    """``{statement: (generic plans, custom plans)}`` of the session's prepared statements."""
    rows = session.execute(
        "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements", {}
    )
    return {
        name: (generic, custom)
        for text, generic, custom in rows
        for name, mark in MARKS.items()
        if mark in text
    }


def scans(plan, relation=None):
    """Every scan of a table in ``plan``: (node type, relation, index or None). A bitmap index
    scan names no relation: it is reported with its bitmap heap scan's."""
    found = []
    relation = plan.get("Relation Name", relation)
    reads_table = "Relation Name" in plan or "Index Name" in plan  # not a CTE's or a function's
    if "Scan" in plan["Node Type"] and reads_table and relation is not None:
        found.append((plan["Node Type"], relation, plan.get("Index Name")))
    for child in plan.get("Plans", ()):
        found.extend(scans(child, relation if "Bitmap" in plan["Node Type"] else None))
    return found


def subplan(plan, name):
    """The part of ``plan`` named ``name`` (a CTE: ``"CTE completed"``)."""
    if plan.get("Subplan Name") == name:
        return plan
    for child in plan.get("Plans", ()):
        if (found := subplan(child, name)) is not None:
            return found
    return None


def claim_of(n, token):
    return store.claim_statement(
        worker_id="plans", queues=["default"], limits=[n], limit=n, token=token, threads=n
    )


def claim(explained, n, token):
    return explained.run(*claim_of(n, token))


def complete(session, rows, token):
    return session.run(*store.complete_statement([(row.id, token, None) for row in rows]))


@pytest.mark.parametrize(
    ("state", "batch"),
    [("empty", 1), ("empty", 50), ("backlog", 1), ("backlog", 50), ("fleet", 50)],
)
def test_claim_and_completion_plans_made_once_fit_every_table(state, batch):
    # Statistics as the plan is made: of an empty table (a fresh install), of a backlog with
    # nothing running (the state that rated the lease index at one row), of a busy fleet.
    if state == "empty":
        analyze()
        fill(8 * batch)
    else:
        fill(20_000)
        if state == "fleet":
            run_for_a_while(5_000)
        analyze()
    explained = Explained()
    try:
        for _ in range(7):  # a prepared statement's plan settles after its fifth run
            token = store.new_token()
            rows, claim_plan = claim(explained, batch, token)
            claimed = store.claimed_rows(rows)
            assert len(claimed) == batch
            rows, completion_plan = complete(explained, claimed, token)
            assert set(store.completed_endings(rows)) == {row.id for row in claimed}
        # The worker's Session planned each once and kept the plan: generic, seven runs.
        assert prepared_plans(explained.session) == {"claim": (7, 0), "complete": (7, 0)}
    finally:
        explained.close()

    claim_scans = scans(claim_plan)
    assert ("Index Scan", "dbqueue_job", "dbqueue_job_claim_idx") in claim_scans
    assert_completed_by_primary_key(completion_plan)


def probes(plan, index):
    """The scans of ``index`` in ``plan`` that look up a key (an ``Index Cond``), as opposed to
    a walk of the whole index with a filter, which a plan made on a small table can be."""
    found = []
    if plan.get("Index Name") == index and "Index Cond" in plan:
        found.append(plan["Index Cond"])
    for child in plan.get("Plans", ()):
        found.extend(probes(child, index))
    return found


def assert_completed_by_primary_key(completion_plan):
    """The completed rows (the ``completed`` UPDATE, which runs for every batch; the rest of the
    statement only for workflow jobs) are found by primary key, probed for the ids (an index
    condition, by index or bitmap scan): never by a walk of the running jobs, of the table, or
    of the whole primary key. The same for ``mine``, the worker's lock of the rows first."""
    for name in ("CTE completed", "CTE mine"):
        part = subplan(completion_plan, name)
        if part is None and name == "CTE mine":
            continue  # COMPLETE_JOBS, an atomic handler's, has no ``mine``
        assert part is not None, completion_plan
        found = [s for s in scans(part) if s[1] == "dbqueue_job"]
        assert found, part
        for node, _, index in found:
            assert node != "Seq Scan", part
            assert index != "dbqueue_job_lease_idx", part
        assert any("id" in cond for cond in probes(part, "dbqueue_job_pkey")), part


def test_a_completion_planned_while_the_queue_fills_probes_the_ids():
    # A worker started before its queue fills (the second drain harness of issue 37) makes its
    # generic plan on a small table, with the statistics it has then (a hundred rows here); the
    # plan is kept while the table grows, as long as nothing analyzes it (autovacuum off, or not
    # yet due). Joined to unnest() alone, the completion then walked the whole primary key at
    # every batch (benchmarks/results/2026-12-06-drain-two-ways.md).
    fill(100)
    analyze()
    explained = Explained()
    try:
        for _ in range(7):  # made and kept while the table is small and never analyzed
            token = store.new_token()
            rows, _ = claim(explained, 10, token)
            complete(explained, store.claimed_rows(rows), token)
            fill(10)
        fill(20_000)  # no ANALYZE: the plan stays
        token = store.new_token()
        rows, _ = claim(explained, 50, token)
        claimed = store.claimed_rows(rows)
        assert len(claimed) == 50
        rows, completion_plan = complete(explained, claimed, token)
        assert set(store.completed_endings(rows)) == {row.id for row in claimed}
        assert prepared_plans(explained.session) == {"claim": (8, 0), "complete": (8, 0)}
    finally:
        explained.close()
    assert_completed_by_primary_key(completion_plan)


def test_a_plan_made_on_a_small_table_still_finds_the_rows_of_a_big_one():
    fill(10)
    analyze()
    explained = Explained()
    try:
        for _ in range(6):  # made and kept while the table was small
            token = store.new_token()
            rows, _ = claim(explained, 1, token)
            complete(explained, store.claimed_rows(rows), token)
            fill(1)
        fill(20_000)
        run_for_a_while(5_000)
        analyze()
        token = store.new_token()
        rows, claim_plan = claim(explained, 50, token)
        claimed = store.claimed_rows(rows)
        assert len(claimed) == 50
        rows, completion_plan = complete(explained, claimed, token)
        assert set(store.completed_endings(rows)) == {row.id for row in claimed}
        assert ("Seq Scan", "dbqueue_job", None) not in scans(claim_plan), claim_plan
        assert_completed_by_primary_key(completion_plan)
        assert prepared_plans(explained.session) == {"claim": (7, 0), "complete": (7, 0)}
    finally:
        explained.close()
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'done'") == 56


def test_scans_reads_bitmap_index_scans_and_subplans():
    # The shapes auto_explain logs; a helper that missed them would let the tests above pass
    # a plan that walks the lease index through a bitmap.
    plan = {
        "Node Type": "Update",
        "Relation Name": "dbqueue_job",
        "Plans": [
            {
                "Node Type": "Bitmap Heap Scan",
                "Relation Name": "dbqueue_job",
                "Subplan Name": "CTE completed",
                "Plans": [
                    {"Node Type": "Bitmap Index Scan", "Index Name": "dbqueue_job_lease_idx"}
                ],
            },
            {"Node Type": "Function Scan", "Function Name": "unnest"},
        ],
    }
    assert scans(plan) == [
        ("Bitmap Heap Scan", "dbqueue_job", None),
        ("Bitmap Index Scan", "dbqueue_job", "dbqueue_job_lease_idx"),
    ]
    assert subplan(plan, "CTE completed") is plan["Plans"][0]
    with pytest.raises(AssertionError):
        assert_completed_by_primary_key(plan)


def test_workflow_statements_run_by_a_completion_planned_once_use_indexes():
    # A completion releases the dependents of the jobs it makes done (in its own statement)
    # and, through the workflow trigger, cancels those of a job cancelled while it ran: both
    # run under the session's generic plan mode, the trigger's statements too.
    fill(20_000)
    run_for_a_while(20_000)  # a fleet's table: the workflow's first jobs are the only pending
    analyze()
    first, then = chain(("echo", {}), ("echo", {}))
    doomed, after_doomed = chain(("echo", {}), ("echo", {}))
    explained = Explained()
    try:
        token = store.new_token()
        rows, _ = claim(explained, 2, token)
        claimed = store.claimed_rows(rows)
        assert {row.id for row in claimed} == {first.id, doomed.id}
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE dbqueue_job SET cancel_requested_at = now() WHERE id = %s", [doomed.id]
            )
        rows, completion_plan = complete(explained, claimed, token)
        nested = explained.plans[:-1]
        assert explained.session.generic is True
    finally:
        explained.close()
    assert store.completed_endings(rows) == {first.id: None, doomed.id: ""}
    assert job_row(then.id)["state"] == "pending"
    assert job_row(after_doomed.id)["state"] == "cancelled"
    assert job_row(after_doomed.id)["errors"][-1]["class"] == "DependencyFailed"
    assert nested, "the workflow trigger's statements logged no plan"
    assert_completed_by_primary_key(completion_plan)
    assert_jobs_found_by_primary_key([completion_plan, *nested])


def assert_jobs_found_by_primary_key(plans):
    """Each of the plans reads jobs, and finds every one by primary key (from the completed
    rows' ``dependents`` or from the edges). Statistics that saw no waiting job rate
    dbqueue_job_waiting_idx at one row: a plan allowed to match its predicate reads the whole
    index (every waiting job of every workflow) for each batch that releases a dependent, until
    the table is next analyzed."""
    for plan in plans:
        found = [s for s in scans(plan) if s[1] == "dbqueue_job" and s[0] != "Bitmap Heap Scan"]
        assert found, plan
        for _, _, index in found:
            assert index == "dbqueue_job_pkey", plan


def test_the_late_release_planned_once_finds_its_dependents_by_primary_key():
    # dbqueue_release_late() runs inside a completion, under its plan mode, for dependents the
    # completion's snapshot could not see (migration 0009); its plans are kept as the trigger's.
    fill(20_000)
    run_for_a_while(20_000)
    analyze()
    first, then = chain(("echo", {}), ("echo", {}))
    explained = Explained()
    try:
        conn = explained.session.connection()
        for statement in _PLAN_MODE[True]:  # the worker's mode for its completion
            conn.execute(statement, prepare=False)
        explained.plans.clear()
        woken = conn.execute(
            "SELECT * FROM dbqueue_release_late(%s, %s)", [[then.id], [first.id]], prepare=False
        ).fetchall()
        plans = list(explained.plans)
    finally:
        explained.close()
    assert woken == [(job_row(then.id)["queue"],)]
    assert job_row(then.id)["state"] == "pending"
    assert len(plans) == 3, plans  # its PERFORM, its RETURN QUERY, the SELECT that called it
    assert_jobs_found_by_primary_key(plans[:2])


def test_the_trigger_requeue_branch_planned_once_finds_its_jobs_by_primary_key():
    # A requeue of a cancelled dependency brings back the dependents its cancel cancelled; the
    # trigger's statements for it match 'cancelled' and 'dead', states of a partial index
    # (dbqueue_job_finished_idx) that statistics of a fleet's table rate at a few rows.
    fill(20_000)
    run_for_a_while(20_000)
    analyze()
    doomed, after_doomed = chain(("echo", {}), ("echo", {}))
    store.cancel("default", [doomed.id])
    assert job_row(after_doomed.id)["state"] == "cancelled"
    explained = Explained()
    try:
        conn = explained.session.connection()
        for statement in _PLAN_MODE[True]:
            conn.execute(statement, prepare=False)
        explained.plans.clear()
        moved = conn.execute(
            operations.REQUEUE_JOBS, {"ids": [doomed.id]}, prepare=False
        ).fetchall()
        plans = list(explained.plans)
    finally:
        explained.close()
    assert [row[0] for row in moved] == [doomed.id]
    assert job_row(after_doomed.id)["state"] == "waiting"
    # The trigger's PERFORM, UPDATE and recount of the dependents still waiting (migration
    # 0015), then the requeue itself.
    assert len(plans) == 4, plans
    assert_jobs_found_by_primary_key(plans[:3])


def test_session_switches_plan_mode_only_where_the_kind_of_statement_changes():
    fill(5)
    session = Session("default")
    try:
        token = store.new_token()
        claimed = store.claimed_rows(session.execute(*claim_of(5, token)))
        assert session.generic is True
        # Another statement between claims is planned for its own values again...
        assert session.execute("SHOW plan_cache_mode", {}) == [("force_custom_plan",)]
        assert session.generic is False
        assert session.execute("SHOW enable_seqscan", {}) == [("on",)]  # back as it was
        held = store.extend_leases(session, [(row.id, token) for row in claimed])
        assert set(held) == {row.id for row in claimed}
        # ... and the completion with the next claim, one pipeline, switches back once.
        statements_before = session.statements
        done, again = session.execute_pipelined(
            [
                store.complete_statement([(row.id, token, None) for row in claimed]),
                claim_of(5, token),
            ]
        )
        assert session.statements == statements_before + 2
        assert set(store.completed_endings(done)) == {row.id for row in claimed}
        assert store.claimed_rows(again) == []
        assert session.generic is True
        assert scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'done'") == 5
        # Claims and completions planned once, the lease extension for its own values.
        assert prepared_plans(session) == {"claim": (2, 0), "complete": (1, 0), "extend": (0, 1)}
    finally:
        session.reset()


def server_defaults():
    with psycopg.connect(**connection_params("default"), autocommit=True) as conn:
        return conn.execute("SHOW plan_cache_mode").fetchone()[0], conn.execute(
            "SHOW enable_seqscan"
        ).fetchone()[0]


def test_an_unprepared_session_never_switches():
    fill(2)
    session = Session("default", prepare=False)
    try:
        token = store.new_token()
        assert len(store.claimed_rows(session.execute(*claim_of(2, token)))) == 2
        assert session.generic is False
        # The settings a plain connection to this server has: the session changed none.
        found = (
            session.execute("SHOW plan_cache_mode", {})[0][0],
            session.execute("SHOW enable_seqscan", {})[0][0],
        )
        assert found == server_defaults()
    finally:
        session.reset()


# The hot statements' arrays travel as array literals (store.int_array, store.text_array):
# PostgreSQL must read back exactly what was meant, whatever the strings hold.
# Text holds no NUL, and a lone surrogate is not UTF-8 (json.dumps escapes them in results).
_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=30)


@hypothesis.settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.none(), _text, st.sampled_from(["NULL", "", " ", '"', "\\", "{,}"]))),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1)),
)
def test_array_literals_come_back_from_postgresql_unchanged(texts, ints):
    with psycopg.connect(**connection_params("default"), autocommit=True) as conn:
        back_texts, back_ints = conn.execute(
            "SELECT %s::text[], %s::bigint[]", [store.text_array(texts), store.int_array(ints)]
        ).fetchone()
    assert back_texts == texts
    assert back_ints == ints


def test_int_array_refuses_what_is_not_a_number():
    with pytest.raises(ValueError, match="invalid literal for int"):
        store.int_array([1, "2}; SELECT 1"])
