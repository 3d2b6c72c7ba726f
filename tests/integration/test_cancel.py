"""Cancelling (docs/concepts/cancelling.md) against the real database: what cancel() does to
each state, the mark turning every end of a run into ``cancelled`` (fenced by the lease token),
workflow dependents, the sweeper and the releases; then in-process workers: a cooperative
handler, the heartbeat backstop, an async handler, a job withdrawn before it started."""

import time

import pytest
from django.db import connection, transaction

from django_dbqueue import (
    JobCancelled,
    cancel,
    chain,
    enqueue,
    signals,
    store,
    workflow,
)
from django_dbqueue.sweeper import Sweeper
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ERROR = {"attempt": 1, "class": "ValueError", "message": "boom", "traceback": "", "worker": "w"}


def claim_one(job_id, token=7, worker="w1"):
    rows = store.claim(
        "default", worker_id=worker, queues=["default"], limits=[10], limit=10, token=token
    )
    assert job_id in [row.id for row in rows]
    return token


def state(job_id):
    return job_row(job_id)["state"]


def wait_state(job_id, expected, timeout=10):
    wait_until(
        lambda: state(job_id) == expected, timeout=timeout, message=f"job {job_id} {expected}"
    )
    return job_row(job_id)


def runs_of(job_id):
    return scalar("SELECT count(*) FROM testapp_effect WHERE job_id = %s", [job_id])


@pytest.fixture
def cancelled_signals():
    received = []
    signals.job_cancelled.connect(
        lambda sender, **kw: received.append(kw), weak=False, dispatch_uid="test-cancel"
    )
    yield received
    signals.job_cancelled.disconnect(dispatch_uid="test-cancel")


# --- the API -------------------------------------------------------------------------------


def test_cancel_says_what_became_of_each_job():
    pending = enqueue("noop")
    later = enqueue("noop", delay=3600)
    running = enqueue("record")
    claim_one(running.id)
    with connection.cursor() as cursor:  # claimed along with it: put the others back
        cursor.execute(
            "UPDATE dbqueue_job SET state = 'pending', leased_until = NULL, attempts = 0 "
            "WHERE id = ANY(%s)",
            [[pending.id, later.id]],
        )
    done = enqueue("noop")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET state = 'done', finished_at = now() WHERE id = %s", [done.id]
        )
    outcome = cancel([pending, later.id, running.id, done.id, 999_999_999], by="ops-script")
    assert outcome == {
        pending.id: "cancelled",
        later.id: "cancelled",
        running.id: "cancelling",
        done.id: "finished",
        999_999_999: "unknown",
    }
    row = job_row(pending.id)
    assert (row["state"], row["cancelled_by"]) == ("cancelled", "ops-script")
    assert row["finished_at"] and row["cancel_requested_at"]
    row = job_row(running.id)
    assert (row["state"], row["cancelled_by"]) == ("running", "ops-script")
    assert row["cancel_requested_at"] and row["leased_until"] and not row["finished_at"]
    assert job_row(done.id)["cancelled_by"] is None
    # Asking again keeps the first request and its author; a cancelled job is finished.
    first = row["cancel_requested_at"]
    assert cancel(running.id, by="someone-else") == {running.id: "cancelling"}
    row = job_row(running.id)
    assert (row["cancelled_by"], row["cancel_requested_at"]) == ("ops-script", first)
    assert cancel(pending.id) == {pending.id: "finished"}
    assert cancel([]) == {}


def test_cancel_defaults_to_api_and_rolls_back_with_the_caller():
    job = enqueue("noop")
    with pytest.raises(RuntimeError), transaction.atomic():
        assert cancel(job.id) == {job.id: "cancelled"}
        raise RuntimeError("roll back")
    assert state(job.id) == "pending"
    cancel(job.id)
    assert job_row(job.id)["cancelled_by"] == "api"


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "text"),
    [
        (("7",), {}, TypeError, "'7'"),
        ((True,), {}, TypeError, "True"),
        (([1, 2.5],), {}, TypeError, "2.5"),
        ((0,), {}, ValueError, "0 is not a job id"),
        ((2**63,), {}, ValueError, "is not a job id"),
        ((1,), {"by": ""}, ValueError, "by must be a non-empty string"),
        ((1,), {"by": "x" * 201}, ValueError, "at most 200 characters"),
        ((1,), {"by": "a\x00b"}, ValueError, "NUL"),
    ],
)
def test_cancel_refuses_bad_arguments_naming_them(args, kwargs, error, text):
    with pytest.raises(error, match=text.replace("(", r"\(").replace("*", r"\*")):
        cancel(*args, **kwargs)


# --- the mark turns every end of the run into cancelled -----------------------------------


def test_a_marked_job_that_succeeds_ends_cancelled_with_its_result_kept():
    job = enqueue("record")
    token = claim_one(job.id)
    cancel(job.id, by="me")
    # A zombie's completion (another token) is fenced out as always.
    assert store.complete("default", [(job.id, token + 1, '"late"')]) == set()
    assert store.complete_ending("default", [(job.id, token, '{"ok": 1}')]) == {job.id: "me"}
    row = job_row(job.id)
    assert (row["state"], row["result"], row["errors"]) == ("cancelled", {"ok": 1}, [])
    assert row["finished_at"] and row["leased_until"] is None


def test_an_unmarked_completion_is_unchanged():
    job = enqueue("record")
    token = claim_one(job.id)
    assert store.complete_ending("default", [(job.id, token, '"ok"')]) == {job.id: None}
    assert state(job.id) == "done"


def test_a_marked_job_that_fails_ends_cancelled_with_its_error_kept_and_no_retry():
    job = enqueue("record")  # attempts left: a failure would be retried
    token = claim_one(job.id)
    cancel(job.id, by="me")
    assert store.fail("default", job_id=job.id, token=token + 1, error=ERROR, delay=0) is None
    ended = store.fail_job("default", job_id=job.id, token=token, error=ERROR, delay=0)
    assert ended == ("cancelled", "me")
    row = job_row(job.id)
    assert row["state"] == "cancelled" and row["finished_at"]
    assert [e["message"] for e in row["errors"]] == ["boom"]
    assert row["attempts"] == 1


def test_end_cancelled_is_fenced_and_records_the_handler_when_nobody_asked():
    job = enqueue("record")
    token = claim_one(job.id)
    assert store.end_cancelled("default", job_id=job.id, token=token + 1) is None
    assert state(job.id) == "running"
    assert store.end_cancelled("default", job_id=job.id, token=token) == "handler"
    row = job_row(job.id)
    assert (row["state"], row["cancelled_by"]) == ("cancelled", "handler")


def test_the_heartbeat_says_which_held_jobs_are_marked():
    a, b = enqueue("record"), enqueue("record")
    token = claim_one(a.id)
    cancel(b.id)
    assert store.extend_leases("default", [(a.id, token), (b.id, token)]) == {
        a.id: False,
        b.id: True,
    }


def test_a_swept_marked_job_ends_cancelled_not_pending(cancelled_signals):
    job = enqueue("record")
    claim_one(job.id, worker="dead-worker")
    cancel(job.id, by="me")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET leased_until = now() - interval '1 second' WHERE id = %s",
            [job.id],
        )
    assert Sweeper("default").rescue() == {"rescued": 0, "dead": 0, "cancelled": 1}
    row = job_row(job.id)
    assert row["state"] == "cancelled" and row["errors"][-1]["class"] == "LeaseExpired"
    [sent] = cancelled_signals
    assert (sent["job_id"], sent["cancelled_by"], sent["worker_id"]) == (
        job.id,
        "me",
        "dead-worker",
    )


def test_a_marked_job_is_not_handed_back_by_a_release_but_cancelled():
    job, other = enqueue("record"), enqueue("record")
    token = claim_one(job.id)
    cancel(job.id)
    assert store.release_ending("default", [(job.id, token), (other.id, token)]) == {
        job.id: "cancelled",
        other.id: "pending",
    }
    assert state(job.id) == "cancelled" and job_row(job.id)["finished_at"]


def test_a_marked_job_of_an_unknown_type_or_unknown_to_its_worker_ends_cancelled():
    deferred, unknown = enqueue("record"), enqueue("record")
    token = claim_one(deferred.id)
    cancel([deferred.id, unknown.id])
    state_after = store.defer_unknown_type(
        "default", job_id=deferred.id, token=token, error=ERROR, delay=60, grace=3600
    )
    assert state_after == "cancelled" and job_row(deferred.id)["finished_at"]
    # After a lost connection the worker hands back what it held without knowing it.
    assert store.release_unknown("default", worker="w1", known=[]) == {unknown.id}
    assert state(unknown.id) == "cancelled"


def test_requeue_clears_the_mark_and_keeps_who_cancelled_in_the_history():
    job = enqueue("record")
    token = claim_one(job.id)
    cancel(job.id, by="admin:ann")
    store.complete("default", [(job.id, token, None)])
    assert store.requeue("default", [job.id]) == {job.id: "default"}
    row = job_row(job.id)
    assert (row["state"], row["cancel_requested_at"], row["cancelled_by"]) == (
        "pending",
        None,
        None,
    )
    assert "requeued from cancelled (cancelled by admin:ann)" in row["errors"][-1]["message"]


def test_the_schema_refuses_a_mark_on_a_pending_job():
    from django.db import IntegrityError

    job = enqueue("noop")
    with (
        pytest.raises(IntegrityError, match="dbqueue_job_cancel_mark_running"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("UPDATE dbqueue_job SET cancel_requested_at = now() WHERE id = %s", [job.id])


# --- workflows ----------------------------------------------------------------------------


def test_dependents_of_a_running_job_wait_for_its_end_then_are_cancelled():
    a, b, c = chain(("record", {}), ("echo", {}), ("echo", {}))
    token = claim_one(a.id)
    assert cancel(a.id) == {a.id: "cancelling"}
    assert [state(b.id), state(c.id)] == ["waiting", "waiting"]  # a still runs
    # Its handler succeeds; the job ends cancelled, and its dependents are cancelled, not
    # released (the workflow trigger), all the way down.
    assert store.complete_ending("default", [(a.id, token, '"ok"')]) == {a.id: "api"}
    assert [state(a.id), state(b.id), state(c.id)] == ["cancelled", "cancelled", "cancelled"]
    assert job_row(b.id)["errors"][-1]["class"] == "DependencyFailed"
    assert runs_of(b.id) == 0


def test_a_dependent_with_on_failure_run_is_released_by_a_cancelled_end():
    wf = workflow()
    first = wf.add("record")
    anyway = wf.add("echo", depends_on=[first], on_failure="run")
    ids = [j.id for j in wf.enqueue()]
    del first, anyway
    token = claim_one(ids[0])
    cancel(ids[0])
    store.fail("default", job_id=ids[0], token=token, error=ERROR, delay=0)
    assert [state(ids[0]), state(ids[1])] == ["cancelled", "pending"]


# --- in-process workers -------------------------------------------------------------------


def test_a_cooperative_handler_stops_at_once_and_its_job_ends_cancelled(
    start_worker, cancelled_signals
):
    start_worker(concurrency=2)
    job = enqueue("cooperative")
    wait_until(lambda: runs_of(job.id) == 1, message="the handler to start")
    asked = time.monotonic()
    assert cancel(job.id, by="me") == {job.id: "cancelling"}
    row = wait_state(job.id, "cancelled", timeout=5)
    assert time.monotonic() - asked < 2.0
    assert (row["cancelled_by"], row["errors"], row["result"]) == ("me", [], None)
    wait_until(lambda: cancelled_signals, message="the job_cancelled signal")
    [sent] = cancelled_signals
    assert (sent["job_id"], sent["cancelled_by"], sent["error"]) == (job.id, "me", None)
    assert sent["duration"] > 0


def test_the_heartbeat_tells_a_worker_that_does_not_listen(start_worker, settings):
    settings.DBQUEUE = {**settings.DBQUEUE, "HEARTBEAT_INTERVAL": 0.2}
    worker = start_worker(listen=False)
    job = enqueue("cooperative")
    wait_until(lambda: runs_of(job.id) == 1, message="the handler to start")
    asked = time.monotonic()
    cancel(job.id)
    wait_state(job.id, "cancelled", timeout=5)
    assert time.monotonic() - asked < 2.0
    assert worker.listening is None  # it does not listen: the heartbeat told it


def test_a_cancel_during_the_grace_period_reaches_the_handler_at_once(start_worker, settings):
    # The worker LISTENs on its own connection; while it stops, it still reads it.
    settings.DBQUEUE = {**settings.DBQUEUE, "HEARTBEAT_INTERVAL": 30, "SHUTDOWN_GRACE": 30}
    worker = start_worker(concurrency=2)
    job = enqueue("cooperative")
    wait_until(lambda: runs_of(job.id) == 1, message="the handler to start")
    worker.stop()  # graceful: the handler may run on for the grace period
    asked = time.monotonic()
    cancel(job.id)
    wait_state(job.id, "cancelled", timeout=10)
    assert time.monotonic() - asked < 2.0  # the heartbeat would have told it in 30 s


def test_an_async_handler_is_cancelled(start_worker, tmp_path):
    start_worker()
    started = tmp_path / "started"
    job = enqueue("async-cooperative", {"started_file": str(started)})
    wait_until(started.exists, message="the async handler to start")
    cancel(job.id)
    row = wait_state(job.id, "cancelled", timeout=5)
    assert (row["result"], row["errors"]) == (None, [])


def test_a_handler_that_ignores_the_cancel_runs_to_its_end_and_keeps_its_result(start_worker):
    start_worker()
    job = enqueue("ignores-cancel", {"seconds": 1.5})
    wait_until(lambda: runs_of(job.id) == 1, message="the handler to start")
    cancel(job.id)
    row = wait_state(job.id, "cancelled", timeout=10)
    assert row["result"] == {"ran_to_the_end": True, "saw_cancel": True}
    assert row["attempts"] == 1 and runs_of(job.id) == 1


def test_a_failure_on_the_way_out_keeps_the_error_and_is_not_retried(
    start_worker, cancelled_signals
):
    start_worker()
    job = enqueue("fails-when-cancelled")
    wait_until(lambda: runs_of(job.id) == 1, message="the handler to start")
    cancel(job.id)
    row = wait_state(job.id, "cancelled", timeout=5)
    [error] = row["errors"]
    assert error["message"] == "cleanup failed after the cancel"
    wait_until(lambda: cancelled_signals, message="the job_cancelled signal")
    assert cancelled_signals[0]["error"]["class"] == "ValueError"
    assert runs_of(job.id) == 1 and row["attempts"] == 1


def test_a_handler_raising_job_cancelled_cancels_its_own_job(start_worker):
    start_worker()
    job = enqueue("cancels-itself")
    row = wait_state(job.id, "cancelled")
    assert (row["cancelled_by"], row["errors"], row["attempts"]) == ("handler", [], 1)


def test_a_claimed_job_cancelled_before_it_started_never_starts(start_worker):
    # One thread, busy with a long run; the second job is claimed (prefetched) behind it.
    worker = start_worker(concurrency=1)
    busy = enqueue("cooperative")
    wait_until(lambda: runs_of(busy.id) == 1, message="the first handler to start")
    queued = enqueue("record")
    wait_until(
        lambda: state(queued.id) == "running" and len(worker.inflight) == 2,
        message="the second job to be claimed behind the first",
    )
    assert cancel(queued.id) == {queued.id: "cancelling"}
    wait_state(queued.id, "cancelled", timeout=5)
    assert state(busy.id) == "running"  # the thread never left the first run
    cancel(busy.id)
    wait_state(busy.id, "cancelled", timeout=5)
    assert runs_of(queued.id) == 0


def test_cancel_and_job_cancelled_are_public():
    import django_dbqueue

    assert "cancel" in django_dbqueue.__all__ and "JobCancelled" in django_dbqueue.__all__
    assert issubclass(JobCancelled, Exception)


def test_cancelled_jobs_are_counted_by_the_metrics(start_worker):
    from prometheus_client import REGISTRY

    from django_dbqueue import metrics

    def cancelled_total():
        labels = {"type": "cancels-itself", "queue": "default"}
        return REGISTRY.get_sample_value("dbqueue_jobs_cancelled_total", labels) or 0.0

    metrics.install()  # the process's counters (the table's gauges are not needed here)
    before = cancelled_total()
    start_worker()
    job = enqueue("cancels-itself")
    wait_state(job.id, "cancelled")
    wait_until(lambda: cancelled_total() == before + 1, message="the cancelled counter")


@pytest.mark.parametrize("stop", [False, True])
def test_an_atomic_handler_commits_or_rolls_back_and_ends_cancelled(
    start_worker, tmp_path, cancelled_signals, stop
):
    start_worker()
    started = tmp_path / "started"
    job = enqueue("atomic-cancellable", {"started_file": str(started), "stop": stop})
    wait_until(started.exists, message="the atomic handler to start")
    cancel(job.id, by="me")
    row = wait_state(job.id, "cancelled", timeout=5)
    if stop:  # JobCancelled: its writes rolled back, nothing kept
        assert (row["result"], runs_of(job.id)) == (None, 0)
    else:  # it returned: its writes and its result committed with the cancelled end
        assert (row["result"], runs_of(job.id)) == ({"kept": True}, 1)
    wait_until(lambda: cancelled_signals, message="the job_cancelled signal")
    assert cancelled_signals[0]["cancelled_by"] == "me"
