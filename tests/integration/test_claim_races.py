"""The claim's races, each held open with real sessions at the exact point (issue 25).

- Serial keys: an older job of a key that becomes pending (a requeue, a workflow release) while
  a claim of a newer one is still uncommitted must not be claimed beside it, by the plain claim
  nor by the limited one; nor may one claim take two jobs of a key.
- Limited claims: two claims that meet new rate partitions in opposite orders never wait for
  each other (they used to end in ``deadlock detected``); the concurrency limit holds across
  three claimers held open at the limiter; a job enqueued while a claim waited for the limiter
  comes back marked keyed.

Sessions are psycopg connections opened here; a claim held open is a transaction left open.
Where a claim must wait, the test waits for PostgreSQL to report it blocked (pg_blocking_pids),
never for a fixed time.
"""

import threading

import psycopg
import pytest
from django.db import connection, transaction

from django_dbqueue import Workflow, enqueue, enqueue_many, store
from django_dbqueue.connections import connection_params
from django_dbqueue.store import operations
from tests.integration.test_flow import NO_FLOW, limits
from tests.utils import scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def session():
    return psycopg.connect(**connection_params("default"), autocommit=False)


def claim_on(conn, queues=("default",), limit=10, flow=None, worker="other"):
    """Run a claim on ``conn`` without committing it; the claimed ids."""
    statement, params = store.claim_statement(
        worker_id=worker,
        queues=list(queues),
        limits=[limit] * len(queues),
        limit=limit,
        token=store.new_token(),
        flow=flow,
    )
    with conn.cursor() as cursor:
        cursor.execute(statement, params)
        return store.claimed_rows(cursor.fetchall())


def claim(queues=("default",), limit=10, flow=None, worker="w"):
    """A claim on Django's connection, committed."""
    return store.claim(
        "default",
        worker_id=worker,
        queues=list(queues),
        limits=[limit] * len(queues),
        limit=limit,
        token=store.new_token(),
        flow=flow,
    )


def running_of(key):
    return scalar(
        "SELECT count(*) FROM dbqueue_job WHERE serial_key = %s AND state = 'running'", [key]
    )


def make_dead(job_id):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET state = 'dead', finished_at = now() WHERE id = %s", [job_id]
        )


def finish(job_id):
    token = scalar("SELECT lease_token FROM dbqueue_job WHERE id = %s", [job_id])
    assert store.complete("default", [(job_id, token, None)]) == {job_id}


def blocked_on(pid, blocker_pid):
    return blocker_pid in scalar("SELECT pg_blocking_pids(%s)", [pid])


def keyed_rate(key="acct"):
    return limits(rate={"limit": 100, "period": 60, "key": key})


# Serial keys -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["plain", "limited"])
@pytest.mark.parametrize("requeue_open", [False, True], ids=["requeue-after", "requeue-around"])
def test_an_older_job_requeued_during_a_newer_ones_claim_is_not_claimed_beside_it(
    path, requeue_open
):
    """A (older) is dead, B (newer) pending. X claims B and stays uncommitted; A is requeued
    (committed after X began, or begun before X and committed after it); Z claims: in Z's
    snapshot B is pending, not running, and A is older, so the old test let Z take A."""
    flow = keyed_rate() if path == "limited" else None
    older = enqueue("record", {"acct": 1}, serial_key="K")
    make_dead(older.id)
    newer = enqueue("record", {"acct": 2}, serial_key="K")
    operator = session()
    x = session()
    try:
        if requeue_open:  # the requeue begins first and commits while X is open
            with operator.cursor() as cursor:
                cursor.execute(operations.REQUEUE_JOBS, {"ids": [older.id]})
        assert [r.id for r in claim_on(x, flow=flow)] == [newer.id]
        if requeue_open:
            operator.commit()
        else:
            assert store.requeue("default", [older.id]) == {older.id: "default"}
        assert claim(flow=flow) == []  # Z: B is being claimed
        x.commit()
        assert claim(flow=flow) == []  # Z: B runs
        assert running_of("K") == 1
    finally:
        operator.close()
        x.close()
    finish(newer.id)
    assert [r.id for r in claim(flow=flow)] == [older.id]


def test_an_aborted_claim_of_the_newer_job_leaves_the_older_one_its_turn():
    older = enqueue("record", serial_key="K")
    make_dead(older.id)
    newer = enqueue("record", serial_key="K")
    x = session()
    try:
        assert [r.id for r in claim_on(x)] == [newer.id]
        store.requeue("default", [older.id])
        assert claim() == []
        x.rollback()  # the claim of B is lost (its connection died, say)
        assert [r.id for r in claim()] == [older.id]  # A first: older and pending
    finally:
        x.close()
    assert running_of("K") == 1


@pytest.mark.parametrize("path", ["plain", "limited"])
def test_an_older_job_released_by_its_workflow_during_a_newer_ones_claim_waits(settings, path):
    settings.DBQUEUE = {"QUEUES": {"default": {}, "emails": {}}}
    flow = keyed_rate() if path == "limited" else None
    wf = Workflow()
    head = wf.add("record", queue="emails")
    wf.add("record", {"acct": 1}, depends_on=[head], serial_key="K")
    head_job, waiting = wf.enqueue()
    newer = enqueue("record", {"acct": 2}, serial_key="K")
    x = session()
    try:
        assert [r.id for r in claim_on(x, flow=flow)] == [newer.id]
        (head_row,) = claim(queues=["emails"])
        finish(head_row.id)  # releases the waiting (older) job of K, committed
        assert scalar("SELECT state FROM dbqueue_job WHERE id = %s", [waiting.id]) == "pending"
        assert claim(flow=flow) == []
        x.commit()
        assert claim(flow=flow) == []
    finally:
        x.close()
    assert running_of("K") == 1
    finish(newer.id)
    assert [r.id for r in claim(flow=flow)] == [waiting.id]
    assert head_job.id


def test_one_claim_never_takes_two_jobs_of_a_key():
    """The turn test of a later statement of the same claim (the limited claim scans each queue
    with a fresh snapshot) sees an older job requeued after it approved a newer one: it must
    still refuse it, though the approved one is neither running nor older."""
    older = enqueue("record", serial_key="K")
    make_dead(older.id)
    newer = enqueue("record", serial_key="K")
    x = session()
    try:
        with x.cursor() as cursor:
            for _ in range(2):  # the same job again: a re-check of its row says yes again
                cursor.execute("SELECT dbqueue_serial_turn('K', %s)", [newer.id])
                assert cursor.fetchone()[0] is True
            store.requeue("default", [older.id])
            cursor.execute("SELECT dbqueue_serial_turn('K', %s)", [older.id])
            assert cursor.fetchone()[0] is False
    finally:
        x.close()


def test_the_limited_claim_holds_only_the_keys_of_the_jobs_it_takes():
    """Its job-by-job scan fetches rows ten at a time: the turn test there would have held the
    keys of jobs it never reached, and a second claim would have found them all busy."""
    flow = keyed_rate()
    jobs = [enqueue("record", {"acct": i}, serial_key=f"K{i}") for i in range(5)]
    x = session()
    try:
        assert [r.id for r in claim_on(x, limit=1, flow=flow)] == [jobs[0].id]
        assert [r.id for r in claim(limit=4, flow=flow)] == [j.id for j in jobs[1:]]
    finally:
        x.close()


# Limited claims --------------------------------------------------------------------------------

QUEUES = ("qa", "qb", "qc")


def _partition_flow(scope, order):
    params = dict(NO_FLOW)
    n = len(order)
    if scope == "queue":
        params.update(
            q_conc=[None] * n,
            q_rate_n=[5] * n,
            q_rate_period=[60.0] * n,
            q_rate_key=["k"] * n,
        )
    else:
        params.update(
            q_conc=[None] * n,
            q_rate_n=[None] * n,
            q_rate_period=[None] * n,
            q_rate_key=[None] * n,
            t_names=["record"],
            t_conc=[None],
            t_rate_n=[5],
            t_rate_period=[60.0],
            t_rate_key=["k"],
        )
    return params


@pytest.mark.parametrize("scope", ["queue", "type"])
def test_claims_meeting_new_partitions_in_opposite_orders_never_deadlock(settings, scope):
    """T holds a new partition of qc, uncommitted (a claim left open). X claims qa, qc, qb and
    Y qb, qc, qa: each creates its first partition, then meets T's. They used to wait for T,
    then for each other's new rows: ``deadlock detected``. Now neither waits for anyone."""
    settings.DBQUEUE = {"QUEUES": {q: {} for q in QUEUES}}
    for queue, key in zip(QUEUES, ("a", "b", "c"), strict=True):
        enqueue("record", {"k": key}, queue=queue)
    orders = {"X": ["qa", "qc", "qb"], "Y": ["qb", "qc", "qa"]}
    t = session()
    conns = {name: session() for name in orders}
    results, errors = {}, {}

    def run(name):
        try:
            flow = _partition_flow(scope, orders[name])
            results[name] = claim_on(conns[name], orders[name], flow=flow, worker=name)
            conns[name].commit()
        except Exception as exc:  # reported below, on the test's thread
            errors[name] = exc
            conns[name].rollback()

    try:
        assert len(claim_on(t, ["qc"], flow=_partition_flow(scope, ["qc"]), worker="T")) == 1
        threads = {name: threading.Thread(target=run, args=(name,)) for name in orders}
        for thread in threads.values():
            thread.start()
        t_pid = t.info.backend_pid
        pids = [c.info.backend_pid for c in conns.values()]
        wait_until(
            lambda: all(
                not threads[n].is_alive() or blocked_on(pids[i], t_pid)
                for i, n in enumerate(orders)
            ),
            message="both claims finished, or both waiting for T",
        )
        t.commit()
        for thread in threads.values():
            thread.join(30)
            assert not thread.is_alive()
    finally:
        for conn in (t, *conns.values()):
            conn.close()
    assert errors == {}, errors
    got = sorted(r.payload["k"] for rows in results.values() for r in rows)
    assert got == ["a", "b"]  # c: T's; each claim took its own first queue's job


def test_the_limit_holds_across_three_claimers_held_open_at_the_limiter(settings):
    """X claims 2 of a queue limited to 3 and stays open; Y and Z (one of them claiming through
    another queue that shares the type's limit) wait for X's limiter lock, then count with a
    fresh snapshot: together they start 1 more, never 2 or 4."""
    settings.DBQUEUE = {"QUEUES": {"default": {}, "emails": {}}}
    enqueue_many([("record", {})] * 6)
    enqueue_many([{"type": "record", "queue": "emails"}] * 6)
    flow = dict(
        NO_FLOW,
        t_names=["record"],
        t_conc=[3],
        t_rate_n=[None],
        t_rate_period=[None],
        t_rate_key=[None],
    )
    x = session()
    others = {"Y": session(), "Z": session()}
    queues = {"Y": ["default"], "Z": ["emails"]}
    results = {}

    def run(name):
        results[name] = claim_on(others[name], queues[name], limit=2, flow=flow, worker=name)
        others[name].commit()

    try:
        assert len(claim_on(x, limit=2, flow=flow, worker="X")) == 2
        threads = [threading.Thread(target=run, args=(n,)) for n in others]
        for thread in threads:
            thread.start()
        x_pid = x.info.backend_pid
        wait_until(
            lambda: all(blocked_on(c.info.backend_pid, x_pid) for c in others.values()),
            message="Y and Z waiting for X's limiter lock",
        )
        x.commit()
        for thread in threads:
            thread.join(30)
    finally:
        for conn in (x, *others.values()):
            conn.close()
    assert sum(len(r) for r in results.values()) == 1
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'running'") == 3


def test_a_job_committed_while_the_limited_claim_waited_comes_back_keyed():
    """The job's transaction began before the claim's statement (so it is due: its run_after is
    older than the claim's now()) and committed while the claim waited for the limiter: the
    claim's snapshot misses it, the function's statements after the lock see it. Whether it is
    keyed must come from there, not from that snapshot."""
    flow = limits(queue_conc=5)
    holder = session()
    conn = session()
    result = {}

    def run():
        result["rows"] = claim_on(conn, flow=flow, worker="late")
        conn.commit()

    try:
        assert claim_on(holder, flow=flow, worker="holder") == []  # holds the limiter row
        thread = threading.Thread(target=run)
        with transaction.atomic():
            job = enqueue("record", serial_key="K")
            thread.start()
            wait_until(
                lambda: blocked_on(conn.info.backend_pid, holder.info.backend_pid),
                message="the claim waiting for the limiter",
            )
        holder.commit()
        thread.join(30)
    finally:
        holder.close()
        conn.close()
    rows = result["rows"]
    assert [(r.id, r.keyed) for r in rows] == [(job.id, True)] and rows.keyed == 1


def test_the_previous_releases_call_still_claims_without_the_new_column():
    """Workers of the previous release (a rolling deploy) call dbqueue_claim_limited() and read
    its twelve columns; it now runs the fixed claim."""
    job = enqueue("record", serial_key="K")
    params = {
        **store.claim_statement(
            worker_id="old", queues=["default"], limits=[5], limit=5, token=3, flow=limits(5)
        )[1]
    }
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT * FROM dbqueue_claim_limited(%(queues)s::text[], %(limits)s::int[], "
            "%(limit)s, %(worker)s, %(token)s, %(q_conc)s::int[], %(q_rate_n)s::int[], "
            "%(q_rate_period)s::float8[], %(q_rate_key)s::text[], %(t_names)s::text[], "
            "%(t_conc)s::int[], %(t_rate_n)s::int[], %(t_rate_period)s::float8[], "
            "%(t_rate_key)s::text[])",
            params,
        )
        got = cursor.fetchall()
        assert len(cursor.description) == 12
    assert [row[0] for row in got] == [job.id]


@pytest.mark.parametrize("partition", ["new", "existing"])
def test_a_keyed_rate_limit_holds_across_claims_held_open(partition):
    """X takes the 2 starts of a partition and stays open: a claim meanwhile passes the
    partition over (it is being created, or locked) and says to look again soon; after X's
    commit the window is full. Never 3 starts, never a wait."""
    flow = limits(rate={"limit": 2, "period": 60, "key": "acct"})
    if partition == "existing":
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO dbqueue_limiter (scope, name, part) VALUES ('queue', 'default', '1')"
            )
    enqueue_many([("record", {"acct": 1})] * 5)
    x = session()
    try:
        assert len(claim_on(x, flow=flow, worker="X")) == 2
        with connection.cursor() as cursor:  # a claim that waits for X fails, not hangs
            cursor.execute("SET lock_timeout = '5s'")
        during = claim(flow=flow, worker="Y")
        assert during == [] and during.reopen_in is not None and during.reopen_in < 1
        x.commit()
        after = claim(flow=flow, worker="Y")
        assert after == [] and after.reopen_in > 50
    finally:
        x.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'running'") == 2
