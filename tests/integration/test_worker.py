"""The worker in-process: retries, dead letters, timeouts, heartbeats, wake-ups, shutdown.

Workers run on background threads against the real database; tests wait on the database state
with deadlines.
"""

import threading

import pytest
from django.db import connection

from django_dbqueue import enqueue, enqueue_many, signals, store
from django_dbqueue.context import JobContext
from django_dbqueue.inflight import Entry
from django_dbqueue.worker import Worker
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def state_of(job_id):
    return job_row(job_id)["state"]


def wait_state(job_id, state, timeout=10):
    wait_until(lambda: state_of(job_id) == state, timeout=timeout, message=f"job {job_id} {state}")
    return job_row(job_id)


def test_runs_jobs_and_stores_results(start_worker):
    start_worker()
    echo = enqueue("echo", {"hello": ["world", 1]})
    async_job = enqueue("async-echo", {"async": True})
    assert wait_state(echo.id, "done")["result"] == {"hello": ["world", 1]}
    assert wait_state(async_job.id, "done")["result"] == {"async": True}


def test_retries_on_backoff_then_dead_with_every_error_kept(start_worker):
    dead = []
    signals.job_dead.connect(lambda sender, **kw: dead.append(kw), weak=False, dispatch_uid="t")
    try:
        start_worker()
        job = enqueue("fail")  # max_attempts=3
        row = wait_state(job.id, "dead")
    finally:
        signals.job_dead.disconnect(dispatch_uid="t")
    assert row["attempts"] == 3
    assert [e["attempt"] for e in row["errors"]] == [1, 2, 3]
    for entry in row["errors"]:
        assert entry["class"] == "ValueError"
        assert entry["message"].startswith("boom on attempt")
        assert "Traceback" in entry["traceback"] and "jobs.py" in entry["traceback"]
        assert entry["at"] and entry["worker"]
    assert dead and dead[0]["job_id"] == job.id and dead[0]["error"]["class"] == "ValueError"


def test_transient_failure_then_success(start_worker):
    start_worker()
    job = enqueue("fail-then-succeed", {"succeed_on": 3})
    row = wait_state(job.id, "done")
    assert row["attempts"] == 3 and row["result"] == {"attempt": 3}
    assert len(row["errors"]) == 2


def test_retry_job_asks_for_its_own_delay(start_worker):
    start_worker()
    job = enqueue("retry-later", {"delay": 600})
    row = wait_until(lambda: (r := job_row(job.id))["errors"] and r, message="first failure")
    assert row["state"] == "pending"
    failed_at = __import__("datetime").datetime.fromisoformat(row["errors"][0]["at"])
    assert (row["run_after"] - failed_at).total_seconds() == pytest.approx(600, abs=2)
    assert row["errors"][0]["message"] == "provider said later"


def test_discard_goes_straight_to_dead(start_worker):
    start_worker()
    job = enqueue("discard")
    row = wait_state(job.id, "dead")
    assert row["attempts"] == 1 and row["errors"][0]["message"] == "payload is unusable"


def _insert_unknown_type(age_seconds):
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
               max_attempts, lease_seconds, errors, created_at)
               VALUES ('os.system', 'default', '{}', 'pending', 0, now(), 0, 2, 60, '[]',
                       now() - %s * interval '1 second')
               RETURNING id""",
            [age_seconds],
        )
        return cursor.fetchone()[0]


def test_a_young_job_of_unknown_type_waits_for_a_worker_that_knows_it(start_worker):
    """A rolling deploy: new code enqueued a type this (old) worker does not have. It goes back
    without spending an attempt, for a later claim, and the worker keeps working."""
    ghost = _insert_unknown_type(0)
    worker = start_worker()
    wait_until(lambda: job_row(ghost)["errors"], message="the deferral recorded")
    row = job_row(ghost)
    assert row["state"] == "pending" and row["attempts"] == 0
    assert row["errors"][0]["class"] == "LookupError"
    assert "no handler is registered for job type 'os.system'" in row["errors"][0]["message"]
    delay = scalar(
        "SELECT EXTRACT(EPOCH FROM run_after - now()) FROM dbqueue_job WHERE id = %s", [ghost]
    )
    assert 50 < delay <= 60  # UNKNOWN_TYPE_DELAY
    after = enqueue("noop")
    wait_state(after.id, "done")  # the worker is still working
    assert worker.thread.is_alive() and worker.acks.deferred == 1


def test_an_old_job_of_unknown_type_is_dead_at_once(start_worker):
    """Older than UNKNOWN_TYPE_GRACE: not a deploy in progress but a removed handler."""
    ghost = _insert_unknown_type(7200)
    worker = start_worker()
    row = wait_state(ghost, "dead")
    assert row["attempts"] == 1 and len(row["errors"]) == 1
    assert row["errors"][0]["class"] == "LookupError"
    assert worker.thread.is_alive() and worker.acks.dead == 1


def test_timeout_gives_the_run_up_and_retries(start_worker, settings):
    from django_dbqueue import job, registry

    @job("too-slow", timeout=0.2, max_attempts=2)
    def too_slow(ctx):
        import time

        time.sleep(1.0)

    try:
        start_worker()
        queued = enqueue("too-slow")
        row = wait_state(queued.id, "dead", timeout=15)
        assert [e["class"] for e in row["errors"]] == ["TimeoutError", "TimeoutError"]
        assert "longer than its timeout of 0.2s" in row["errors"][0]["message"]
    finally:
        registry.unregister("too-slow")


def test_heartbeat_keeps_a_long_job_alive_past_its_lease(start_worker, fast_settings):
    from django_dbqueue import job, registry

    @job("long", lease=0.5)
    def long(ctx):
        import time

        time.sleep(1.5)

    try:
        start_worker()
        queued = enqueue("long")
        row = wait_state(queued.id, "done", timeout=10)
        assert row["attempts"] == 1 and row["errors"] == []
    finally:
        registry.unregister("long")


def test_notification_wakes_an_idle_worker(start_worker, fast_settings):
    fast_settings.DBQUEUE = {**fast_settings.DBQUEUE, "POLL_INTERVAL": 60}
    worker = start_worker()
    wait_until(lambda: worker.listening is not None and worker.listening.is_set(), message="LISTEN")
    # Let the loop settle into its 60 s idle wait.
    wait_until(lambda: worker.claimed_total == 0 and worker.free_slots() > 0)
    job = enqueue("noop")
    wait_state(job.id, "done", timeout=2)  # far sooner than the 60 s poll


def test_poll_finds_jobs_whose_notification_was_missed(start_worker, fast_settings):
    fast_settings.DBQUEUE = {**fast_settings.DBQUEUE, "LISTEN": False, "POLL_INTERVAL": 0.2}
    start_worker()
    with connection.cursor() as cursor:  # no pg_notify: as if the notification was lost
        cursor.execute(
            """INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
               max_attempts, lease_seconds, errors, created_at)
               VALUES ('noop', 'default', '{}', 'pending', 0, now(), 0, 3, 60, '[]', now())
               RETURNING id"""
        )
        job_id = cursor.fetchone()[0]
    wait_state(job_id, "done", timeout=3)


def test_scheduled_job_runs_when_due(start_worker):
    start_worker()
    job = enqueue("noop", delay=0.5)
    row = wait_state(job.id, "done", timeout=5)
    assert row["started_at"] >= row["run_after"]


def test_per_queue_workers_only_take_their_queues(start_worker):
    start_worker(queues=["emails"])
    mail = enqueue("email")
    other = enqueue("noop")
    wait_state(mail.id, "done")
    assert state_of(other.id) == "pending"


def test_burst_drains_due_jobs_and_returns(fast_settings):
    jobs = enqueue_many([("record", {})] * 30)
    later = enqueue("noop", delay=3600)
    assert Worker(burst=True).run() == 0
    assert all(state_of(j.id) == "done" for j in jobs)
    assert state_of(later.id) == "pending"
    assert scalar("SELECT count(*) FROM testapp_effect") == 30


def test_max_jobs_stops_after_n(fast_settings):
    enqueue_many([("noop", {})] * 12)
    worker = Worker(max_jobs=5)
    assert worker.run() == 0
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'done'") == 5
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'pending'") == 7


def test_graceful_stop_releases_unfinished_jobs_without_spending_attempts(
    start_worker, fast_settings, tmp_path
):
    fast_settings.DBQUEUE = {**fast_settings.DBQUEUE, "SHUTDOWN_GRACE": 0.3, "PREFETCH": 3}
    worker = start_worker(concurrency=1)
    stuck = enqueue("sleep", {"seconds": 30, "until_file": str(tmp_path / "never")})
    wait_state(stuck.id, "running")
    queued = enqueue_many([("noop", {})] * 3)  # prefetched behind the busy thread
    wait_until(lambda: all(state_of(j.id) == "running" for j in queued), message="prefetch")
    worker.stop()
    worker.thread.join(10)
    assert worker.result["code"] == 0
    for job_id in [stuck.id, *(j.id for j in queued)]:
        row = job_row(job_id)
        assert (row["state"], row["attempts"], row["leased_until"]) == ("pending", 0, None)


def test_graceful_stop_lets_short_jobs_finish(start_worker, tmp_path):
    worker = start_worker()
    flag = tmp_path / "go"
    job = enqueue("sleep", {"seconds": 30, "until_file": str(flag)})
    wait_state(job.id, "running")
    worker.stop()
    flag.touch()
    worker.thread.join(10)
    row = job_row(job.id)
    assert (row["state"], row["attempts"]) == ("done", 1)


def test_atomic_handler_commits_writes_with_completion(start_worker):
    from django_dbqueue import job, registry
    from tests.testapp.models import Invoice

    @job("atomic-invoice", atomic=True)
    def atomic_invoice(ctx):
        Invoice.objects.create(number=ctx.payload["number"])
        if ctx.payload.get("fail"):
            raise RuntimeError("after the write")

    try:
        start_worker()
        ok = enqueue("atomic-invoice", {"number": "I-1"})
        bad = enqueue("atomic-invoice", {"number": "I-2", "fail": True}, max_attempts=1)
        wait_state(ok.id, "done")
        wait_state(bad.id, "dead")
        assert list(Invoice.objects.values_list("number", flat=True)) == ["I-1"]
    finally:
        registry.unregister("atomic-invoice")


def test_claim_loop_query_count_is_pinned(fast_settings):
    """One claim is one statement, on the worker's own prepared session, none on Django's."""
    from django.test.utils import CaptureQueriesContext

    enqueue_many([("noop", {})] * 5)
    worker = Worker(concurrency=2)
    try:
        with CaptureQueriesContext(connection) as queries:
            claimed, asked = worker.run_once()
        assert (claimed, asked) == (4, 4)  # concurrency 2 + prefetch 2
        assert worker.session.statements == 1 and len(queries) == 0
        assert worker.run_once() == (0, 0)  # every slot is taken: no statement at all
        assert worker.session.statements == 1
    finally:
        worker.session.close()


def test_async_handlers_run_concurrently_with_sync_ones(start_worker):
    from django_dbqueue import job, registry

    @job("async-slow")
    async def async_slow(ctx):
        import asyncio
        import time

        started = time.time()
        await asyncio.sleep(0.5)
        return {"start": started, "end": time.time()}

    @job("sync-stamp")
    def sync_stamp(ctx):
        import time

        return {"at": time.time()}

    try:
        start_worker(concurrency=4)
        slow = enqueue("async-slow")
        wait_state(slow.id, "running")
        quick = [enqueue("sync-stamp") for _ in range(3)]
        slow_row = wait_state(slow.id, "done")
        stamps = [wait_state(j.id, "done")["result"]["at"] for j in quick]
        window = slow_row["result"]
        assert all(window["start"] < at < window["end"] for at in stamps), (window, stamps)
    finally:
        registry.unregister("async-slow")
        registry.unregister("sync-stamp")


def test_a_result_json_cannot_store_is_dead_at_once_not_retried(start_worker, tmp_path):
    from django_dbqueue import job, registry

    effects = tmp_path / "effects"

    @job("bad-result", max_attempts=5)
    def bad_result(ctx):
        import datetime

        with effects.open("a") as f:  # a side effect, done before the result is stored
            f.write("x")
        return {"when": datetime.date(2026, 1, 1)}

    try:
        worker = start_worker(concurrency=1)
        bad = enqueue("bad-result")
        row = wait_state(bad.id, "dead")
        # Deterministic and after the effects: not retried, so the effect happened once.
        assert row["attempts"] == 1 and effects.read_text() == "x"
        assert row["errors"][0]["class"] == "django_dbqueue.outcomes.ResultError"
        assert 'result["when"] is a datetime.date' in row["errors"][0]["message"]
        after = enqueue("noop")  # the only handler thread is still alive
        wait_state(after.id, "done")
        assert worker.thread.is_alive()
    finally:
        registry.unregister("bad-result")


@pytest.mark.parametrize("atomic", [False, True])
def test_a_result_of_negative_zero_is_dead_at_once_with_its_path_not_stored_as_zero(
    start_worker, atomic
):
    # jsonb has no negative zero: stored, {"delta": -0.0} would read back as 0.0 with its sign
    # lost. The job is not lost either: it is dead (requeueable) with the reason.
    from django_dbqueue import job, registry

    @job("negative-zero", max_attempts=5, atomic=atomic)
    def negative_zero(ctx):
        return {"delta": [-0.0]}

    try:
        start_worker(concurrency=1)
        bad = enqueue("negative-zero")
        row = wait_state(bad.id, "dead")
        assert row["attempts"] == 1 and row["result"] is None
        assert row["errors"][0]["class"] == "django_dbqueue.outcomes.ResultError"
        assert 'result["delta"][0] is -0.0' in row["errors"][0]["message"]
    finally:
        registry.unregister("negative-zero")


def test_a_raising_signal_receiver_does_not_stop_acknowledgements(start_worker):
    def explode(sender, **kwargs):
        raise RuntimeError("alerting is down")

    signals.job_succeeded.connect(explode, weak=False, dispatch_uid="explode")
    try:
        start_worker()
        jobs = [enqueue("noop") for _ in range(3)]
        for job in jobs:
            wait_state(job.id, "done")
    finally:
        signals.job_succeeded.disconnect(dispatch_uid="explode")


def test_signals_use_the_handler_as_sender(start_worker):
    from tests.testapp import jobs as testjobs

    seen = []
    signals.job_dead.connect(
        lambda sender, **kw: seen.append(kw["job_id"]),
        sender=testjobs.discard,
        weak=False,
        dispatch_uid="by-sender",
    )
    try:
        start_worker()
        other = enqueue("fail", max_attempts=1)
        mine = enqueue("discard")
        wait_state(other.id, "dead")
        wait_state(mine.id, "dead")
        wait_until(lambda: seen, message="the signal")
        assert seen == [mine.id]
    finally:
        signals.job_dead.disconnect(sender=testjobs.discard, dispatch_uid="by-sender")


def test_sweeper_sends_job_dead_for_an_expired_last_attempt():
    from django_dbqueue import store
    from django_dbqueue.sweeper import Sweeper

    seen = []
    signals.job_dead.connect(lambda sender, **kw: seen.append(kw), weak=False, dispatch_uid="swept")
    try:
        job = enqueue("noop", max_attempts=1)
        store.claim("default", worker_id="w", queues=["default"], limits=[1], limit=1, token=1)
        with connection.cursor() as cursor:
            cursor.execute("UPDATE dbqueue_job SET leased_until = now() - interval '1 second'")
        Sweeper().rescue()
    finally:
        signals.job_dead.disconnect(dispatch_uid="swept")
    assert [(s["job_id"], s["error"]["class"]) for s in seen] == [(job.id, "LeaseExpired")]


def test_a_database_error_in_the_claim_loop_is_logged_not_fatal(start_worker, caplog):
    """A real constraint violation inside the claim (here: a CHECK that refuses this worker's
    id) is logged with its traceback; the worker keeps going and claims once it is gone."""
    worker = start_worker()
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE dbqueue_job ADD CONSTRAINT test_refuse_worker "
            "CHECK (worker_id IS DISTINCT FROM %s) NOT VALID",
            [worker.worker_id],
        )
    try:
        job = enqueue("noop")
        wait_until(
            lambda: "database error in the claim loop" in caplog.text,
            timeout=10,
            message="the error",
        )
        assert worker.thread.is_alive() and state_of(job.id) == "pending"
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE dbqueue_job DROP CONSTRAINT test_refuse_worker")
    wait_state(job.id, "done", timeout=30)


def test_the_worker_reads_its_prefetch_from_the_settings(fast_settings):
    # The adaptation itself: tests/unit/test_claim_timing.py.
    worker = Worker(concurrency=4)
    assert (worker.prefetch, worker.timing.prefetch_max) == (4, 16)
    fast_settings.DBQUEUE = {**fast_settings.DBQUEUE, "PREFETCH": 1}
    worker = Worker(concurrency=4)
    assert worker.prefetch == worker.timing.prefetch_max == 1
    assert not worker.timing.adaptive


def test_a_claim_that_comes_due_ends_the_wait_for_more_completions(start_worker, fast_settings):
    # Handlers that wait (here: sleep) let the claim loop reach its wait for more completions
    # to batch (ACK_INTERVAL) while some slots are still busy. The handler whose end frees a
    # batch's worth of slots makes the claim due, and the completions ride on it: it must end
    # that wait, not leave both to the end of the interval (60 s here, so a miss is plain).
    fast_settings.DBQUEUE = {
        **fast_settings.DBQUEUE,
        "ACK_INTERVAL": 60.0,
        "POLL_INTERVAL": 60.0,
        "PREFETCH": 2,  # 2 threads + 2 prefetched: a claim is due when 2 slots are free
    }
    # Of each pair claimed together, one ends well before the other: the loop waits between.
    jobs = enqueue_many([("record", {"sleep": 0.02 if i % 2 else 0.15}) for i in range(8)])
    worker = start_worker(concurrency=2)
    wait_until(
        lambda: scalar("SELECT count(*) FROM testapp_effect") == len(jobs),
        timeout=20,
        message="every job run, each batch claimed as soon as its slots were free",
    )
    # The last completions, with no claim to ride on, wait for the interval or, as here, for
    # the stop, which ends that wait too.
    worker.stop()
    worker.thread.join(15)
    assert not worker.thread.is_alive(), "the stop did not end the wait for completions"
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'done'") == len(jobs)


def test_a_stop_ends_the_wait_for_more_completions(fast_settings):
    fast_settings.DBQUEUE = {**fast_settings.DBQUEUE, "ACK_INTERVAL": 60.0}
    job = enqueue("noop")
    worker = Worker(concurrency=2)
    token = store.new_token()
    (row,) = store.claim(
        "default",
        worker_id=worker.worker_id,
        queues=["default"],
        limits=[1],
        limit=1,
        token=token,
    )
    # A success buffered and no claim due: the loop would wait the interval for more.
    ctx = JobContext(row, worker_id=worker.worker_id, using="default")
    worker.acks.succeed(Entry(ctx, token, None))
    worker.timing.want_capacity = worker.timing.claim_next = False
    entered, wait = threading.Event(), worker._acks_ready.wait

    def entering_wait(timeout=None):
        entered.set()
        return wait(timeout)

    worker._acks_ready.wait = entering_wait
    waiting = threading.Thread(target=worker._batch_acks, daemon=True)
    waiting.start()
    try:
        assert entered.wait(10), "the loop did not wait for more completions"
        worker.stop()  # while it waits
        waiting.join(10)
        assert not waiting.is_alive(), "stop() left the loop waiting for ACK_INTERVAL"
        worker.acks.flush_once(worker.session)  # what the shutdown does next
    finally:
        worker.session.reset()
        worker._wakeup.close()
    assert state_of(job.id) == "done"


def test_worker_session_is_prepared_and_commits_asynchronously_per_statement(fast_settings):
    from django_dbqueue.connections import Session
    from django_dbqueue.store import claiming, completion, leases

    session = Session("default")
    try:
        # Durable as a session: only the hot statements ask for an asynchronous commit, for
        # their own transaction, so nothing leaks to a pooler's other clients.
        assert session.execute("SHOW synchronous_commit", {}) == [("on",)]
        assert session.execute("SHOW plan_cache_mode", {}) == [("force_custom_plan",)]
        probe = (
            "WITH commit_mode AS MATERIALIZED (SELECT set_config('synchronous_commit', "
            "COALESCE(%(commit)s, current_setting('synchronous_commit')), true)) "
            "SELECT current_setting('synchronous_commit') FROM commit_mode"
        )
        assert session.execute(probe, {"commit": "off"}) == [("off",)]
        assert session.execute(probe, {"commit": None}) == [("on",)]
        assert session.execute("SHOW synchronous_commit", {}) == [("on",)]
        prepared = session.execute("SELECT count(*) FROM pg_prepared_statements", {})[0][0]
        assert prepared >= 1
    finally:
        session.close()
    for statement in (claiming.CLAIM_JOBS, completion.COMPLETE_JOBS, leases.EXTEND_LEASES):
        assert "set_config('synchronous_commit'" in statement
    for statement in (
        completion.FAIL_JOB,
        leases.RELEASE_JOBS,
        leases.RESCUE_EXPIRED,
        completion.DEFER_UNKNOWN_TYPE,
    ):
        assert "synchronous_commit" not in statement  # failures and releases stay durable
    unprepared = Session("default", prepare=False)
    try:
        unprepared.execute("SELECT %(x)s::int", {"x": 1})
        assert unprepared.execute("SELECT count(*) FROM pg_prepared_statements", {}) == [(0,)]
    finally:
        unprepared.close()


def test_a_completion_the_database_refuses_does_not_hold_back_the_others(start_worker, caplog):
    """A real CHECK refuses one job's completion: that job is logged and left to the sweeper,
    the rest of its batch and every later acknowledgement still land."""
    with connection.cursor() as cursor:
        cursor.execute(
            "ALTER TABLE dbqueue_job ADD CONSTRAINT test_refuse_echo_done "
            "CHECK (NOT (state = 'done' AND type = 'echo')) NOT VALID"
        )
    try:
        refused = enqueue("echo", {"x": 1})
        others = enqueue_many([("noop", {})] * 20)
        start_worker()
        for job in others:
            wait_state(job.id, "done")
        wait_until(
            lambda: f"could not acknowledge job={refused.id}" in caplog.text, message="the log"
        )
        assert state_of(refused.id) == "running"
        later = enqueue("noop")
        wait_state(later.id, "done")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE dbqueue_job DROP CONSTRAINT test_refuse_echo_done")


def test_a_handler_raising_systemexit_fails_its_job_and_the_thread_lives(start_worker):
    from django_dbqueue import job, registry

    @job("exits", max_attempts=1)
    def exits(ctx):
        import sys

        sys.exit("handler called sys.exit()")

    try:
        worker = start_worker(concurrency=1)
        bad = enqueue("exits")
        row = wait_state(bad.id, "dead")
        assert row["errors"][0]["class"] == "SystemExit"
        after = enqueue("noop")  # the only handler thread is still there
        wait_state(after.id, "done")
        assert worker.thread.is_alive()
    finally:
        registry.unregister("exits")


def test_unprintable_and_nul_errors_are_recorded_not_lost(start_worker):
    from django_dbqueue import job, registry

    class Weird(Exception):
        def __str__(self):
            raise RuntimeError("no str for you")

    @job("nul-error", max_attempts=1)
    def nul_error(ctx):
        raise ValueError("bad byte \x00 here")

    @job("weird-error", max_attempts=1)
    def weird_error(ctx):
        raise Weird()

    try:
        start_worker()
        nul, weird = enqueue("nul-error"), enqueue("weird-error")
        assert wait_state(nul.id, "dead")["errors"][0]["message"] == "bad byte \\x00 here"
        assert "<unprintable Weird>" in wait_state(weird.id, "dead")["errors"][0]["message"]
    finally:
        registry.unregister("nul-error")
        registry.unregister("weird-error")


def test_an_error_with_a_lone_surrogate_is_recorded_escaped_not_retried_forever(start_worker):
    # A file name read with surrogateescape carries its undecodable byte as a lone surrogate,
    # which jsonb refuses: the failure could not be recorded, and the worker tried forever.
    from django_dbqueue import DiscardJob, job, registry

    @job("surrogate-error", max_attempts=2)
    def surrogate_error(ctx):
        raise ValueError("cannot open b'r\udcffport.csv'")

    @job("surrogate-discard")
    def surrogate_discard(ctx):
        raise DiscardJob("bad \udcfe \x00 input")

    try:
        start_worker(concurrency=2)
        retried, discarded = enqueue("surrogate-error"), enqueue("surrogate-discard")
        row = wait_state(retried.id, "dead")
        assert row["attempts"] == 2 and len(row["errors"]) == 2
        assert row["errors"][0]["message"] == "cannot open b'r\\udcffport.csv'"
        assert "\\udcffport.csv" in row["errors"][0]["traceback"]
        row = wait_state(discarded.id, "dead")
        assert row["attempts"] == 1 and row["errors"][0]["message"] == "bad \\udcfe \\x00 input"
    finally:
        registry.unregister("surrogate-error")
        registry.unregister("surrogate-discard")


def test_a_job_given_up_and_reclaimed_by_the_same_worker_keeps_its_heartbeat_and_timeout(
    start_worker, fast_settings
):
    """Attempt 1 times out and attempt 2 is claimed by the same worker while attempt 1's
    thread still sleeps: attempt 1 finishing must not drop attempt 2's tracking."""
    from django_dbqueue import job, registry
    from django_dbqueue.backoff import constant

    @job("slow-timeout", timeout=0.3, max_attempts=3, backoff=constant(0))
    def slow_timeout(ctx):
        import time

        time.sleep(1.0)

    try:
        start_worker(concurrency=4)
        queued = enqueue("slow-timeout")
        row = wait_state(queued.id, "dead", timeout=20)
        assert [e["class"] for e in row["errors"]] == ["TimeoutError"] * 3
    finally:
        registry.unregister("slow-timeout")


def test_a_handler_that_leaks_a_transaction_does_not_break_its_thread(start_worker):
    from django.db import transaction as tx

    from django_dbqueue import job, registry

    @job("leaky", max_attempts=1)
    def leaky(ctx):
        tx.atomic().__enter__()  # never exited

    try:
        start_worker(concurrency=1)
        leaked = enqueue("leaky")
        wait_state(leaked.id, "done")
        after = enqueue("record")  # writes with the same thread's connection
        wait_state(after.id, "done")
        assert scalar("SELECT count(*) FROM testapp_effect WHERE job_id = %s", [after.id]) == 1
    finally:
        registry.unregister("leaky")
