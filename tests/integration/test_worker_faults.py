"""The worker's single passes driven directly: lost prefetched jobs, outcomes that raced a reply,
claims whose reply was lost, shutdown order, async timeouts, assume_role.

Each test builds a ``Worker`` without starting its loop, so that it can put the worker in the
exact state the fault needs, then calls ``run_once()``, ``heartbeat.beat_once()``,
``acks.flush_once()`` or ``_recover()`` as the loop would.
"""

import pytest
from django.db import connection

from django_dbqueue import enqueue, registry, shutdown, signals, store
from django_dbqueue.connections import connect
from django_dbqueue.exceptions import JobRegistrationError
from django_dbqueue.sweeper import Sweeper
from django_dbqueue.worker import Worker
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def idle_worker(fast_settings):
    """A worker whose pool is not started: claimed jobs wait in its local queue."""
    workers = []

    def make(**kwargs):
        worker = Worker(**kwargs)
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.session.close()


def _expire_and_reclaim_elsewhere(job_id):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET leased_until = now() - interval '1 second' WHERE id = %s",
            [job_id],
        )
    assert Sweeper("default").rescue()["rescued"] == 1
    with connection.cursor() as cursor:
        cursor.execute("UPDATE dbqueue_job SET run_after = now() WHERE id = %s", [job_id])
    (row,) = store.claim(
        "default", worker_id="other", queues=["default"], limits=[1], limit=1, token=42
    )
    assert row.id == job_id


def test_a_prefetched_job_whose_lease_was_lost_is_never_started(idle_worker):
    lost_job = enqueue("record")
    kept_job = enqueue("record")
    worker = idle_worker(concurrency=1)
    assert worker.run_once()[0] == 2  # both claimed: one to run, one prefetched
    _expire_and_reclaim_elsewhere(lost_job.id)
    kept, lost = worker.heartbeat.beat_once(worker.session)
    assert (kept, lost) == (1, 1)
    worker.pool.start()
    wait_until(lambda: worker.acks.pending() == 1, message="the kept job's outcome")
    worker.acks.flush_once(worker.session)
    worker.stop()
    worker.pool.stop(timeout=5)
    assert job_row(kept_job.id)["state"] == "done"
    # The lost one was never run here: no effect row, and it is still the other worker's.
    assert scalar("SELECT count(*) FROM testapp_effect WHERE job_id = %s", [lost_job.id]) == 0
    assert job_row(lost_job.id)["worker_id"] == "other"


def test_the_heartbeat_reports_no_loss_for_a_job_that_finished_meanwhile(idle_worker, caplog):
    job = enqueue("noop")
    worker = idle_worker(concurrency=1)
    worker.run_once()
    (entry,) = worker.inflight.snapshot()
    worker.acks.succeed(entry)  # finished, outcome not written yet
    worker.finished(entry)
    assert worker.heartbeat.beat_once(worker.session) == (1, 0)  # still renewed, not "lost"
    assert worker.acks.flush_once(worker.session) == 1
    assert worker.heartbeat.beat_once(worker.session) == (0, 0)
    assert "lease lost" not in caplog.text
    assert job_row(job.id)["state"] == "done"


def test_a_retried_completion_whose_first_try_committed_is_reported_not_fenced(idle_worker):
    seen = []
    signals.job_succeeded.connect(
        lambda sender, **kw: seen.append(kw["job_id"]), weak=False, dispatch_uid="t-readback"
    )
    try:
        job = enqueue("noop")
        worker = idle_worker(concurrency=1)
        worker.run_once()
        (entry,) = worker.inflight.snapshot()
        worker.acks.succeed(entry, '"ok"')
        # The first try committed, but its reply was lost with the connection.
        assert store.complete("default", [(job.id, entry.token, '"ok"')]) == {job.id}
        assert worker.acks.flush_once(worker.session) == 1  # matched nothing, read back as ours
        assert (worker.acks.succeeded, worker.acks.fenced) == (1, 0)
        assert seen == [job.id]
    finally:
        signals.job_succeeded.disconnect(dispatch_uid="t-readback")


def test_a_retried_failure_whose_first_try_committed_still_sends_its_signal(idle_worker):
    seen = []
    signals.job_dead.connect(
        lambda sender, **kw: seen.append(kw["job_id"]), weak=False, dispatch_uid="t-readback2"
    )
    try:
        job = enqueue("noop", max_attempts=1)
        worker = idle_worker(concurrency=1)
        worker.run_once()
        (entry,) = worker.inflight.snapshot()
        error = {"attempt": 1, "class": "E", "message": "m", "traceback": "", "worker": "w"}
        worker.acks.fail(entry, error, delay=0)
        store.fail("default", job_id=job.id, token=entry.token, error=error, delay=0)
        worker.acks.flush_once(worker.session)
        assert (worker.acks.dead, worker.acks.fenced) == (1, 0)
        assert seen == [job.id]
        assert len(job_row(job.id)["errors"]) == 1
    finally:
        signals.job_dead.disconnect(dispatch_uid="t-readback2")


def test_after_a_lost_connection_jobs_held_without_knowing_are_released(idle_worker):
    known_job, lost_reply_job = enqueue("noop"), enqueue("noop")
    worker = idle_worker(concurrency=1, max_jobs=1)
    assert worker.run_once()[0] == 1
    # A claim that committed while its reply was lost: the row says this worker holds it.
    store.claim(
        "default",
        worker_id=worker.worker_id,
        queues=["default"],
        limits=[1],
        limit=1,
        token=store.new_token(),
    )
    worker._lost_connection()
    assert worker._recover() == {lost_reply_job.id}
    row = job_row(lost_reply_job.id)
    assert (row["state"], row["attempts"], row["worker_id"]) == ("pending", 0, None)
    assert job_row(known_job.id)["state"] == "running"


def test_a_stop_writes_finished_outcomes_before_releasing(idle_worker):
    finished_job, unstarted_job = enqueue("noop"), enqueue("noop")
    worker = idle_worker(concurrency=1)
    worker.run_once()
    entries = {e.ctx.id: e for e in worker.inflight.snapshot()}
    worker.acks.succeed(entries[finished_job.id])  # it finished during the grace period
    shutdown.release(worker, list(entries.values()), "test")
    assert job_row(finished_job.id)["state"] == "done"
    assert job_row(unstarted_job.id)["state"] == "pending"
    assert job_row(unstarted_job.id)["attempts"] == 0


def test_an_async_handler_past_its_timeout_is_cancelled_and_its_thread_is_free(start_worker):
    worker = start_worker(concurrency=1)
    hung = enqueue("async-hang")
    row = None

    def dead():
        nonlocal row
        row = job_row(hung.id)
        return row["state"] == "dead"

    wait_until(dead, message="the async job cancelled at its timeout")
    assert row["errors"][0]["class"] == "TimeoutError"
    assert "coroutine was cancelled" in row["errors"][0]["message"]
    after = enqueue("noop")  # the only thread was not lost to it
    wait_until(lambda: job_row(after.id)["state"] == "done", message="next job")
    assert worker.pool.hung == 0


def test_atomic_async_handlers_are_refused_at_registration():
    with pytest.raises(JobRegistrationError, match="atomic=True needs a plain"):

        @registry.job("atomic-async", atomic=True)
        async def handler(ctx):
            return None

    assert registry.get("atomic-async") is None


def test_the_workers_own_connections_honour_assume_role(settings):
    with connection.cursor() as cursor:
        cursor.execute(
            "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'dbqueue_assumed')"
            " THEN CREATE ROLE dbqueue_assumed; END IF; END $$"
        )
        cursor.execute("SELECT current_user")
        (login_user,) = cursor.fetchone()
        cursor.execute("GRANT dbqueue_assumed TO CURRENT_USER")
    options = connection.settings_dict.setdefault("OPTIONS", {})
    options["assume_role"] = "dbqueue_assumed"
    try:
        with connect("default") as conn:
            assert conn.execute("SELECT current_user").fetchone()[0] == "dbqueue_assumed"
    finally:
        del options["assume_role"]
    with connect("default") as conn:
        assert conn.execute("SELECT current_user").fetchone()[0] == login_user
