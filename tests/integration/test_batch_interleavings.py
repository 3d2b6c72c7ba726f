"""Batch handlers (docs/batches.md) meeting faults and operators at the exact point: the top-up's
session ended after the main claim committed, an operator's cancel, requeue and delete of jobs of
a running batch and the sweeper taking one back (in both orders against the heartbeat), and a
timeout of a batch whose handler had marked some of its jobs. Real sessions, in-process workers;
the race is held open by the test (a gate the handler waits on, a hook at the statement)."""

import threading

import pytest
from django.db import connection

from django_dbqueue import cancel, enqueue_many, job, registry, store
from django_dbqueue.store.batches import CLAIM_MORE_OF_TYPE
from django_dbqueue.sweeper import Sweeper
from django_dbqueue.worker import Worker
from tests.integration.conftest import FAST
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def types():
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


@pytest.fixture
def run_worker():
    """Run a Worker built by the test (hooks in place first) on a thread; stopped at teardown."""
    running = []

    def run(worker):
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        running.append((worker, thread))
        return worker

    yield run
    for worker, _ in running:
        worker.stop()
    for _, thread in running:
        thread.join(15)
        assert not thread.is_alive(), "worker did not stop"


def enqueue_n(job_type, count):
    return [q.id for q in enqueue_many([(job_type, {"n": i}) for i in range(count)])]


def unfinished(ids):
    return scalar(
        "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) "
        "AND state NOT IN ('done', 'dead', 'cancelled')",
        [list(ids)],
    )


def wait_finished(ids, timeout=30):
    wait_until(lambda: unfinished(ids) == 0, timeout=timeout, message=f"{len(ids)} jobs to end")
    return {i: job_row(i) for i in ids}


def test_a_top_up_whose_session_is_ended_hands_the_main_claims_jobs_back(
    types, fast_settings, run_worker
):
    """(a) The main claim committed, then the top-up's session is ended by
    pg_terminate_backend: the main claim's jobs never reached the worker's books. They are
    handed back by the recovery after the reconnect (not left running until their lease
    expires), without spending an attempt, and each runs once."""
    runs = []

    @types("bi-topup-lost", batch_size=20)
    def handler(batch):
        runs.extend((j.id, j.attempt) for j in batch)

    ids = enqueue_n("bi-topup-lost", 10)
    worker = Worker(concurrency=1, queues=["default"])
    execute = worker.session.execute
    seen = []

    def hooked(statement, params):
        if statement == CLAIM_MORE_OF_TYPE and not seen:
            # Here, at the top-up: the main claim has committed; end this session's backend.
            held = scalar(
                "SELECT array_agg(id ORDER BY id) FROM dbqueue_job "
                "WHERE state = 'running' AND worker_id = %s",
                [worker.worker_id],
            )
            seen.append(held)
            pid = worker.session.connection().info.backend_pid
            assert scalar("SELECT pg_terminate_backend(%s)", [pid])
            wait_until(
                lambda: not scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]),
                message="the worker's backend to end",
            )
        return execute(statement, params)

    worker.session.execute = hooked
    run_worker(worker)
    rows = wait_finished(ids)
    assert seen and 0 < len(seen[0]) < 10  # the main claim took some, the top-up was to add more
    for row in rows.values():
        # Released by the recovery, not swept: no LeaseExpired error, the attempt not spent.
        assert (row["state"], row["attempts"], row["errors"]) == ("done", 1, [])
    assert sorted(runs) == sorted((i, 1) for i in ids)


@pytest.mark.parametrize("order", ["heartbeat-first", "settle-first"])
def test_operators_and_the_sweeper_on_jobs_of_a_running_batch_touch_only_those_jobs(
    types, settings, run_worker, order
):
    """(c) While a batch runs: A's cancel is asked for; B's lease runs out, the sweeper takes it
    back and it is claimed again under a new token; C's lease runs out on its last attempt
    (dead) and an operator deletes it; D likewise dead and an operator requeues it. Then the
    handler returns, marking every job done. The batch's settle (one completion statement)
    ends A cancelled, writes E and F done, and leaves B, C and D alone: in the order where the
    heartbeat saw B, C, D lost first (their outcomes discarded by the worker) and in the order
    where the settle reaches the database first (fenced by each job's lease token)."""
    settings.DBQUEUE = {
        **FAST,
        "LEASE": 60.0,
        # Nothing claimed ahead of the one thread: B and D, taken back, wait for it (pending).
        "PREFETCH": 0,
        # heartbeat-first: a beat comes after the 1 s leases ran out and marks them lost;
        # settle-first: no beat until the test is over.
        "HEARTBEAT_INTERVAL": 1.5 if order == "heartbeat-first" else 300.0,
    }
    gates = [threading.Event(), threading.Event()]  # the first call, the calls after it
    calls = []

    @types("bi-operators", batch_size=10)
    def handler(batch):
        calls.append(sorted((j.payload["n"], j.attempt) for j in batch))
        assert gates[min(len(calls), 2) - 1].wait(30), "the test never opened the gate"
        for j in batch:
            batch.succeed(j, {"n": j.payload["n"], "attempt": j.attempt})

    a, b, c, d, e, f = enqueue_n("bi-operators", 6)
    with_short_lease = [b, c, d]
    scalar(
        "UPDATE dbqueue_job SET lease_seconds = 1, "
        "max_attempts = CASE WHEN id = %s THEN 5 ELSE 1 END WHERE id = ANY(%s) RETURNING 1",
        [b, with_short_lease],
    )
    worker = run_worker(Worker(concurrency=1, queues=["default"]))
    try:
        wait_until(lambda: len(calls) == 1, message="the batch to start")
        assert len(calls[0]) == 6
        token = job_row(a)["lease_token"]
        assert cancel(a)[a] == "cancelling"

        # The sweeper takes B, C, D back (their 1 s leases end, no beat renews them in time),
        # as another worker's does once this one looks gone: its registry row stale (the
        # sweeper leaves a live worker's expired leases to it; docs/concepts/worker.md).
        def swept():
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE dbqueue_worker SET stale_at = now() - interval '1 second' "
                    "WHERE worker_id = %s",
                    [worker.worker_id],
                )
            Sweeper(worker.using).rescue()
            return (
                scalar(
                    "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND lease_token "
                    "IS DISTINCT FROM %s",
                    [with_short_lease, token],
                )
                == 3
            )

        wait_until(
            swept,
            timeout=15,
            message="the sweeper to take B, C and D back",
        )
        assert job_row(c)["state"] == "dead" and job_row(d)["state"] == "dead"
        assert job_row(b)["state"] == "pending"
        # Their next runs keep their leases (the test's gate holds them a while).
        scalar("UPDATE dbqueue_job SET lease_seconds = 60 WHERE id = ANY(%s) RETURNING 1", [[b, d]])
        assert store.delete_finished(worker.using, [c]) == {c}
        assert set(store.requeue(worker.using, [d])) == {d}
        held = {entry.ctx.id: entry for entry in worker.inflight.snapshot()}
        if order == "heartbeat-first":
            wait_until(
                lambda: all(held[i].lost for i in (b, d)),
                timeout=15,
                message="the heartbeat to see B and D lost",
            )
        else:
            assert not any(held[i].lost for i in with_short_lease)
        gates[0].set()
        wait_until(
            lambda: (
                scalar(
                    "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state IN "
                    "('done', 'cancelled')",
                    [[a, e, f]],
                )
                == 3
            ),
            message="the batch's settle",
        )
        # The settle is written (E and F are in its one statement): A cancelled, E and F done
        # by the first run; B and D, taken back and claimed again (the second call holds them
        # at its gate), are not written by the first run; C stays deleted.
        assert job_row(a)["state"] == "cancelled"
        for i in (e, f):
            assert (job_row(i)["state"], job_row(i)["result"]["attempt"]) == ("done", 1)
        assert scalar("SELECT count(*) FROM dbqueue_job WHERE id = %s", [c]) == 0
        for i in (b, d):
            row = job_row(i)
            assert row["state"] in ("pending", "running") and row["lease_token"] != token, row
        gates[1].set()
        rows = wait_finished([b, d])
    finally:
        for gate in gates:
            gate.set()
    assert rows[b]["state"] == "done" and rows[b]["attempts"] == 2
    assert rows[b]["result"] == {"n": 1, "attempt": 2}
    assert [err["class"] for err in rows[b]["errors"]] == ["LeaseExpired"]
    assert rows[d]["state"] == "done" and rows[d]["attempts"] == 1
    assert rows[d]["result"] == {"n": 3, "attempt": 1}
    if order == "settle-first":
        assert worker.acks.fenced >= 2  # B and D's completions of the first run matched nothing


def test_a_batch_past_its_timeout_keeps_the_marks_its_handler_made(types, start_worker):
    """(d) The handler marked some jobs, then hung past the batch's timeout: the marked jobs end
    by their marks (done with their result, dead, retried after their own delay); only the
    unmarked ones are given up and retried with the TimeoutError."""
    release = threading.Event()
    calls = []

    @types("bi-timeout-marks", batch_size=10, timeout=0.5, max_attempts=3)
    def handler(batch):
        calls.append(sorted((j.payload["n"], j.attempt) for j in batch))
        if len(calls) > 1:
            return
        by_n = {j.payload["n"]: j for j in batch}
        batch.succeed(by_n[0], {"kept": True})
        batch.fail(by_n[1], __import__("django_dbqueue").DiscardJob("malformed"))
        batch.retry(by_n[2], delay=0.05)
        release.wait(20)  # hangs past its timeout: jobs 3 and 4 are unmarked

    ids = enqueue_n("bi-timeout-marks", 5)
    try:
        worker = start_worker(concurrency=1, queues=["default"])
        rows = wait_finished(ids)
    finally:
        release.set()
    assert (rows[ids[0]]["state"], rows[ids[0]]["attempts"]) == ("done", 1)
    assert rows[ids[0]]["result"] == {"kept": True}
    assert (rows[ids[1]]["state"], rows[ids[1]]["attempts"]) == ("dead", 1)
    assert rows[ids[1]]["errors"][0]["class"].endswith("DiscardJob")
    assert (rows[ids[2]]["state"], rows[ids[2]]["attempts"]) == ("done", 2)
    assert [err["class"] for err in rows[ids[2]]["errors"]] == [
        "django_dbqueue.exceptions.RetryJob"
    ]
    for n in (3, 4):
        assert (rows[ids[n]]["state"], rows[ids[n]]["attempts"]) == ("done", 2)
        assert [err["class"] for err in rows[ids[n]]["errors"]] == ["TimeoutError"]
    assert calls[0] == [(n, 1) for n in range(5)]
    assert sorted(p for call in calls[1:] for p in call) == [(2, 2), (3, 2), (4, 2)]
    wait_until(lambda: worker.pool.hung == 0, message="the hung batch thread to return")


def test_jobs_handed_back_after_a_failed_top_up_do_not_count_against_max_jobs(types, fast_settings):
    """(a, continued) The main claim's jobs that the recovery hands back after the top-up's
    session was ended never ran here: a worker with ``max_jobs`` still runs that many."""
    runs = []

    @types("bi-topup-max", batch_size=20)
    def handler(batch):
        runs.extend(j.id for j in batch)

    ids = enqueue_n("bi-topup-max", 12)
    worker = Worker(concurrency=1, queues=["default"], max_jobs=10)
    execute = worker.session.execute
    ended = []

    def hooked(statement, params):
        if statement == CLAIM_MORE_OF_TYPE and not ended:
            pid = worker.session.connection().info.backend_pid
            ended.append(pid)
            assert scalar("SELECT pg_terminate_backend(%s)", [pid])
            wait_until(
                lambda: not scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]),
                message="the worker's backend to end",
            )
        return execute(statement, params)

    worker.session.execute = hooked
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", worker.run()), daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the worker did not stop at max_jobs"
    assert result["code"] == 0 and ended
    assert (
        scalar("SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state = 'done'", [ids])
        == 10
    )
    assert len(runs) == len(set(runs)) == 10
