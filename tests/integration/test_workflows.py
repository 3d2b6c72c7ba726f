"""Workflows against the real database: the waiting state, release, failure cascade, requeue,
results, and the refusals at enqueue. Workers run in-process (see conftest.start_worker)."""

import threading

import psycopg
import pytest
from django.db import connection, connections, transaction

from django_dbqueue import (
    EnqueueError,
    chain,
    enqueue,
    group,
    store,
    workflow,
)
from django_dbqueue.connections import connection_params
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def state(job_id):
    return job_row(job_id)["state"]


def wait_state(job_id, expected, timeout=10):
    wait_until(
        lambda: state(job_id) == expected, timeout=timeout, message=f"job {job_id} {expected}"
    )
    return job_row(job_id)


def runs_of(job_id):
    return scalar("SELECT count(*) FROM testapp_effect WHERE job_id = %s", [job_id])


def test_chain_runs_in_order_and_waiting_jobs_are_not_claimable(start_worker):
    a, b, c = chain(("echo", {"n": 1}), ("echo", {"n": 2}), ("collect", {}))
    assert [state(a.id), state(b.id), state(c.id)] == ["pending", "waiting", "waiting"]
    assert job_row(b.id)["waiting_on"] == 1 and job_row(a.id)["dependents"] == [b.id]
    # The claim does not see waiting jobs.
    claimed = store.claim(
        "default", worker_id="t", queues=["default"], limits=[10], limit=10, token=1
    )
    assert [row.id for row in claimed] == [a.id]
    store.release("default", [(a.id, 1)])
    start_worker()
    row = wait_state(c.id, "done")
    assert row["result"] == {str(b.id): {"n": 2}}
    assert job_row(b.id)["started_at"] >= job_row(a.id)["finished_at"]
    assert row["started_at"] >= job_row(b.id)["finished_at"]


def test_group_callback_runs_once_after_all_members_with_their_results(start_worker):
    *members, callback = group(*[("echo", {"i": i}) for i in range(5)], then=("collect", {}))
    assert state(callback.id) == "waiting" and job_row(callback.id)["waiting_on"] == 5
    start_worker(concurrency=4)
    row = wait_state(callback.id, "done")
    assert row["result"] == {str(m.id): {"i": i} for i, m in enumerate(members)}
    assert runs_of(callback.id) == 1
    assert all(job_row(m.id)["finished_at"] <= row["started_at"] for m in members)


def test_dag_with_diamond_and_atomic_completion(start_worker):
    wf = workflow()
    top = wf.add("atomic-echo", {"top": 1})
    left = wf.add("atomic-echo", {"left": 1}, depends_on=[top])
    right = wf.add("echo", {"right": 1}, depends_on=[top])
    wf.add("collect", depends_on=[left, right])
    ids = [j.id for j in wf.enqueue()]
    assert [state(i) for i in ids] == ["pending", "waiting", "waiting", "waiting"]
    start_worker(concurrency=2)
    row = wait_state(ids[3], "done")
    assert row["result"] == {str(ids[1]): {"left": 1}, str(ids[2]): {"right": 1}}


def test_depends_on_existing_jobs_and_done_ones_count_as_satisfied(start_worker):
    first = enqueue("echo", {"x": 1})
    start_worker()
    wait_state(first.id, "done")
    second = enqueue("echo", {"y": 2})
    later = enqueue("collect", depends_on=[first, second.id])
    wait_state(later.id, "done")
    assert job_row(later.id)["result"] == {str(first.id): {"x": 1}, str(second.id): {"y": 2}}


def test_workflow_rolls_back_with_the_callers_transaction():
    before = scalar("SELECT count(*) FROM dbqueue_job")
    with pytest.raises(RuntimeError), transaction.atomic():
        group(("echo", {}), ("echo", {}), then=("collect", {}))
        raise RuntimeError("the caller's transaction fails")
    assert scalar("SELECT count(*) FROM dbqueue_job") == before
    assert scalar("SELECT count(*) FROM dbqueue_dependency") == 0


def test_one_round_trip(django_assert_num_queries):
    with django_assert_num_queries(1):
        group(*[("echo", {"i": i}) for i in range(10)], then=("collect", {}))


def test_cycle_refused_naming_the_jobs():
    wf = workflow()
    a = wf.add("echo")
    b = wf.add("echo", depends_on=[a])
    c = wf.add("noop", depends_on=[b])
    a.after(c)
    with pytest.raises(
        EnqueueError,
        match=r"cycle: echo #0 -> noop #2 -> echo #1 -> echo #0 \(each waits for the next\)",
    ):
        wf.enqueue()
    with pytest.raises(EnqueueError, match="depends on itself"):
        a.after(a)
    assert scalar("SELECT count(*) FROM dbqueue_job") == 0


def test_unknown_and_failed_dependency_ids_refused_nothing_written():
    dead = enqueue("echo")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET state = 'dead', finished_at = now() WHERE id = %s", [dead.id]
        )
    with pytest.raises(EnqueueError, match=r"unknown job id\(s\) 987654321") as info:
        enqueue("collect", depends_on=[dead, 987654321])
    assert f"#{dead.id} (dead)" in str(info.value)
    assert scalar("SELECT count(*) FROM dbqueue_job") == 1
    assert scalar("SELECT count(*) FROM dbqueue_dependency") == 0
    assert job_row(dead.id)["dependents"] is None


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"depends_on": ["x"]}, "a dependency must be"),
        ({"depends_on": 5}, "depends_on must be a list"),
        ({"on_failure": "run"}, "needs depends_on"),
        ({"depends_on": [], "on_failure": "maybe"}, "on_failure must be"),
        ({"depends_on": [], "idempotency_key": "k"}, "cannot have an idempotency_key"),
    ],
)
def test_bad_arguments_refused(bad, message):
    with pytest.raises(EnqueueError, match=message):
        enqueue("echo", **bad)
    assert scalar("SELECT count(*) FROM dbqueue_job") == 0


def test_dead_dependency_cancels_dependents_transitively_with_the_reason(start_worker):
    wf = workflow()
    bad = wf.add("discard")
    child = wf.add("echo", depends_on=[bad])
    grandchild = wf.add("record", depends_on=[child])
    anyway = wf.add("collect", depends_on=[bad], on_failure="run")
    ids = [j.id for j in wf.enqueue()]
    start_worker()
    wait_state(ids[0], "dead")
    row = wait_state(ids[1], "cancelled")
    assert row["errors"][-1]["class"] == "DependencyFailed"
    assert f"#{ids[0]} (discard) is dead" in row["errors"][-1]["message"]
    row = wait_state(ids[2], "cancelled")
    assert f"#{ids[1]} (echo) is cancelled" in row["errors"][-1]["message"]
    assert runs_of(ids[2]) == 0
    # on_failure="run": it runs, and sees the failed dependency's result as None.
    assert wait_state(ids[3], "done")["result"] == {str(ids[0]): None}
    del bad, child, grandchild, anyway


def test_cancelling_a_waiting_job_cancels_its_dependents():
    a, b, c = chain(("echo", {}), ("echo", {}), ("echo", {}))
    assert store.cancel("default", [b.id]) == {b.id}
    assert state(c.id) == "cancelled" and state(a.id) == "pending"
    assert job_row(c.id)["errors"][-1]["class"] == "DependencyFailed"


def test_requeued_dependency_brings_back_what_it_cancelled_and_releases_it(start_worker):
    a, b, c = chain(("discard", {}), ("echo", {"b": 1}), ("echo", {"c": 1}))
    worker = start_worker()
    wait_state(a.id, "dead")
    wait_state(c.id, "cancelled")
    worker.stop()
    worker.thread.join(15)
    # Make it succeed this time: a job type swap is not possible, so requeue into a worker
    # that completes it by hand.
    store.requeue("default", [a.id])
    assert state(a.id) == "pending"
    assert [state(b.id), state(c.id)] == ["waiting", "waiting"]
    assert job_row(b.id)["errors"][-1]["class"] == "DependencyRequeued"
    assert job_row(c.id)["waiting_on"] == 1
    claimed = store.claim(
        "default", worker_id="t", queues=["default"], limits=[1], limit=1, token=7
    )
    assert [r.id for r in claimed] == [a.id]
    assert store.complete("default", [(a.id, 7, None)]) == {a.id}
    assert state(b.id) == "pending"
    start_worker()
    assert wait_state(c.id, "done")["result"] == {"c": 1}


def test_a_dependent_with_another_dead_dependency_stays_cancelled_on_requeue():
    wf = workflow()
    one, two = wf.add("echo"), wf.add("echo")
    after = wf.add("echo", depends_on=[one, two])
    ids = [j.id for j in wf.enqueue()]
    store.cancel("default", [ids[0], ids[1]])
    assert state(ids[2]) == "cancelled"
    store.requeue("default", [ids[0]])
    assert state(ids[2]) == "cancelled"
    store.requeue("default", [ids[1]])
    assert state(ids[2]) == "waiting" and job_row(ids[2])["waiting_on"] == 2
    del one, two, after


def test_two_dependencies_completing_at_the_same_instant_release_once():
    """Two connections complete the two members of a chord at the same time: the second one
    blocks on the callback's row lock inside its completion until the first commits, then counts
    down from the first one's result. The callback becomes pending exactly once."""
    for round_ in range(6):
        _complete_both_at_once(late_first=bool(round_ % 2))


def _complete_both_at_once(*, late_first):
    first, second, callback = group(("echo", {}), ("echo", {}), then=("echo", {}))
    tokens = {}
    for _ in (first, second):
        token = store.new_token()
        claimed = store.claim(
            "default", worker_id="t", queues=["default"], limits=[1], limit=1, token=token
        )
        tokens[claimed[0].id] = token
    assert set(tokens) == {first.id, second.id}
    # Alternate which member finishes first.
    early, late = (second, first) if late_first else (first, second)
    early_done, release_early = threading.Event(), threading.Event()
    results, pids = {}, {}

    def complete(job_id, hold):
        try:
            pids[job_id] = scalar("SELECT pg_backend_pid()")
            with transaction.atomic():
                results[job_id] = store.complete("default", [(job_id, tokens[job_id], None)])
                if hold:
                    early_done.set()
                    release_early.wait(10)
        finally:
            connections["default"].close()

    holder = threading.Thread(target=complete, args=(early.id, True))
    holder.start()
    assert early_done.wait(10)
    waiter = threading.Thread(target=complete, args=(late.id, False))
    waiter.start()
    # The late completion is blocked on a row lock (the callback's), not finished.
    wait_until(
        lambda: (
            late.id in pids
            and scalar(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pids[late.id]]
            )
            == "Lock"
        ),
        message="the late completion waits for the callback's row lock",
    )
    assert state(callback.id) == "waiting"
    release_early.set()
    holder.join(20)
    waiter.join(20)
    assert results == {early.id: {early.id}, late.id: {late.id}}
    row = job_row(callback.id)
    assert (row["state"], row["waiting_on"]) == ("pending", 0)
    store.cancel("default", [callback.id])  # out of the next round's claims


def test_a_dependent_added_while_its_dependency_completes_is_released():
    """A workflow adds a dependent to a running job; its commit (the deferred link of migration
    0015) and the job's completion both wait for the job's row, the commit first. The commit
    links the dependent to the job still running; the completion, whose snapshot is older than
    that commit, reads the new dependent in the row's ``dependents`` but cannot see its row:
    dbqueue_release_late() counts it again and releases it."""
    running = enqueue("echo", {})
    token = store.new_token()
    assert [
        r.id
        for r in store.claim(
            "default", worker_id="t", queues=["default"], limits=[1], limit=1, token=token
        )
    ] == [running.id]
    added, commit = threading.Event(), threading.Event()
    holder, pids, results = {}, {}, {}

    def enqueue_after():
        try:
            pids["enqueuer"] = scalar("SELECT pg_backend_pid()")
            with transaction.atomic():
                holder["job"] = enqueue("echo", {"after": 1}, depends_on=[running])
                added.set()
                commit.wait(10)
        finally:
            connections["default"].close()

    def complete():
        try:
            pids["completer"] = scalar("SELECT pg_backend_pid()")
            results["done"] = store.complete("default", [(running.id, token, None)])
        finally:
            connections["default"].close()

    def waits_on_lock(name):
        return name in pids and scalar(
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
            [pids[name]],
        )

    with psycopg.connect(**connection_params("default")) as held:
        held.execute("SELECT 1 FROM dbqueue_job WHERE id = %s FOR NO KEY UPDATE", [running.id])
        enqueuer = threading.Thread(target=enqueue_after)
        enqueuer.start()
        assert added.wait(10)
        commit.set()
        wait_until(lambda: waits_on_lock("enqueuer"), message="the commit waits for the row")
        completer = threading.Thread(target=complete)
        completer.start()
        wait_until(lambda: waits_on_lock("completer"), message="the completion waits after it")
        held.rollback()
    enqueuer.join(20)
    completer.join(20)
    assert results["done"] == {running.id}
    assert job_row(running.id)["dependents"] == [holder["job"].id]
    row = job_row(holder["job"].id)
    assert (row["state"], row["waiting_on"]) == ("pending", 0)


def test_waiting_is_counted_apart_from_scheduled_in_status_and_metrics():
    import datetime

    from django.utils import timezone

    from django_dbqueue import metrics

    later = timezone.now() + datetime.timedelta(hours=1)
    enqueue("echo", run_after=later)
    group(("echo", {}), ("echo", {}), then=("collect", {}))
    entry = store.status("default", ["default"])["default"]
    assert (entry["pending"], entry["scheduled"], entry["waiting"]) == (2, 1, 1)
    rows = store.metrics_snapshot("default")
    gauges = {(name, label): value for kind, name, label, value in rows if kind == "queue"}
    assert gauges[("default", "waiting")] == 1.0
    assert gauges[("default", "scheduled")] == 1.0
    del metrics


def test_deleting_a_finished_job_deletes_its_edges():
    a, b = chain(("echo", {}), ("echo", {}))
    store.cancel("default", [a.id])
    assert state(b.id) == "cancelled"
    assert store.delete_finished("default", [b.id]) == {b.id}
    assert scalar("SELECT count(*) FROM dbqueue_dependency") == 0
    assert store.prune("default", state="cancelled", age=0, limit=10) == 1
