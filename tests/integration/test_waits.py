"""Snoozes, durable sleeps and signals: a run that waits ends, holding no thread and spending no
attempt, and the job runs again when its time comes or its signal arrives; its finished steps
replay. Races between a signal and a run that is about to wait are held open with real
sessions, in both orders."""

import datetime
import time

import psycopg
import pytest
from django.db import connection

from django_dbqueue import InvalidArgument, PayloadError, enqueue, signal_job, store
from django_dbqueue.steps import NEVER
from django_dbqueue.store.leases import EXTEND_LEASES
from django_dbqueue.store.steps import INSERT_SIGNAL, SIGNAL_LOCK, SIGNAL_TARGET
from tests.integration.test_steps import bodies, steps_of
from tests.utils import job_row, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def wait_for(job_id, predicate, what, timeout=15):
    wait_until(lambda: predicate(job_row(job_id)), timeout=timeout, message=f"job {job_id} {what}")
    return job_row(job_id)


def waiting(row, reason):
    return (
        row["state"] == "pending"
        and row["wait_reason"] == reason
        and row["wait_token"] == row["lease_token"]
    )


def execute(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def test_snooze_runs_the_job_again_without_spending_an_attempt(start_worker):
    raised = enqueue("snoozer", {"times": 3}).id
    returned = enqueue("snoozer", {"times": 2, "returned": True}).id
    start_worker()
    for job_id, runs in ((raised, 4), (returned, 3)):
        row = wait_for(job_id, lambda r: r["state"] == "done", "done")
        # max_attempts is 1: every snooze left the attempt unspent.
        assert row["result"] == {"runs": runs, "attempt": 1}
        assert (row["attempts"], row["snoozes"], row["errors"]) == (1, runs - 1, [])
        assert row["wait_reason"] is None


def test_a_snooze_past_max_snoozes_is_a_failed_attempt(start_worker, settings):
    settings.DBQUEUE = {**settings.DBQUEUE, "MAX_SNOOZES": 2}
    job_id = enqueue("snoozer", {"forever": True}).id
    worker = start_worker()
    row = wait_for(job_id, lambda r: r["state"] == "dead", "dead")
    assert row["snoozes"] == 2
    [error] = row["errors"]
    assert error["class"] == "SnoozeLimit" and "MAX_SNOOZES" in error["message"]
    assert bodies(job_id)[("run", "end")] == [1, 1, 1]
    # A requeue gives it its snoozes back (and forgets any wait): the operator's retry is real.
    worker.stop()
    worker.thread.join(15)
    execute(
        "UPDATE dbqueue_job SET wait_reason = 'signal:x', wait_token = lease_token WHERE id = %s",
        [job_id],
    )
    assert set(store.requeue("default", [job_id])) == {job_id}
    row = job_row(job_id)
    assert (row["state"], row["snoozes"], row["wait_reason"], row["wait_token"]) == (
        "pending",
        0,
        None,
        None,
    )


def test_a_sleep_holds_no_thread_and_resumes_when_its_time_comes(start_worker):
    sleeper = enqueue("sleeper", {"seconds": 3600}).id
    start_worker(concurrency=1)
    row = wait_for(sleeper, lambda r: waiting(r, "sleep:nap"), "asleep")
    assert row["attempts"] == 0  # not spent
    assert row["run_after"] > row["created_at"] + datetime.timedelta(minutes=59)
    # The one thread is free: another job runs while the first sleeps.
    other = enqueue("echo", {"meanwhile": True}).id
    wait_for(other, lambda r: r["state"] == "done", "done while the sleeper sleeps")
    assert job_row(sleeper)["state"] == "pending"
    # Move its time: the recorded end of the sleep and the job's due time into the past.
    execute(
        "UPDATE dbqueue_step SET result = jsonb_build_object('until', now() - interval '1 s')"
        " WHERE job_id = %s AND name = 'sleep:nap'",
        [sleeper],
    )
    execute("UPDATE dbqueue_job SET run_after = now() WHERE id = %s", [sleeper])
    row = wait_for(sleeper, lambda r: r["state"] == "done", "done after its sleep")
    assert row["attempts"] == 1
    assert bodies(sleeper) == {
        ("before", "start"): [1],
        ("before", "end"): [1],
        ("after", "start"): [1],
        ("after", "end"): [1],
    }
    assert [s[0] for s in steps_of(sleeper)] == ["before", "sleep:nap", "after"]


def test_a_signal_sent_after_the_wait_wakes_the_job(start_worker):
    job_id = enqueue("approver", {}).id
    start_worker()
    row = wait_for(job_id, lambda r: waiting(r, "signal:approve"), "waiting for its signal")
    assert row["run_after"] == NEVER  # no timeout: only the signal makes it due
    assert signal_job(job_id, "approve", {"by": "ops"}) == 1
    row = wait_for(job_id, lambda r: r["state"] == "done", "done")
    assert (row["result"], row["attempts"]) == ([{"by": "ops"}], 1)
    assert bodies(job_id)[("prepare", "end")] == [1]  # replayed, not run again
    # Delivered once: a second signal of the name is kept for a second wait, unused here.
    assert signal_job(job_id, "approve", "late") is None  # the job has finished


def test_a_signal_sent_before_the_wait_is_kept(start_worker):
    job_id = enqueue("approver", {"waits": 2}).id
    assert signal_job(job_id, "approve", "first") == 1
    assert signal_job(job_id, "approve", ["second"]) == 2
    assert signal_job(job_id, "other", None) == 1
    start_worker()
    row = wait_for(job_id, lambda r: r["state"] == "done", "done")
    assert row["result"] == ["first", ["second"]]  # the n-th wait takes the n-th signal
    assert (row["attempts"], row["snoozes"]) == (1, 0)


def test_a_wait_that_times_out_raises_in_the_handler(start_worker):
    job_id = enqueue("approver", {"timeout": 0.3}).id
    start_worker()
    row = wait_for(job_id, lambda r: r["state"] == "done", "done after its timeout")
    assert row["result"] == ["timed out"]
    assert row["attempts"] == 1


def test_a_wait_inside_a_transaction_is_refused_with_its_reason(start_worker):
    job_id = enqueue("atomic-sleeper", {}).id
    start_worker()
    row = wait_for(job_id, lambda r: r["state"] == "dead", "dead")
    assert "cannot wait inside a transaction" in row["errors"][0]["message"]
    assert steps_of(job_id) == []


def ended(row):
    """The run ended otherwise than in its wait: finished, or failed an attempt."""
    return row["state"] in ("done", "dead", "cancelled") or bool(row["errors"])


@pytest.mark.parametrize("then", ["return", "raise", "step"])
def test_a_handler_that_swallows_its_sleep_still_suspends(start_worker, then):
    """``except BaseException`` around ``ctx.sleep()``: the run still ends in the sleep, whatever
    the handler did next (returned, raised its own error, or called a step, which the run
    does not run). Before, the job ended done (or failed) without sleeping."""
    job_id = enqueue("swallowing-sleeper", {"then": then}).id
    start_worker()
    row = wait_for(job_id, lambda r: waiting(r, "sleep:nap") or ended(r), "asleep, or ended")
    assert waiting(row, "sleep:nap"), row
    assert (row["attempts"], row["errors"], row["result"]) == (0, [], None)
    assert row["run_after"] > row["created_at"] + datetime.timedelta(minutes=59)
    assert [s[0] for s in steps_of(job_id)] == ["before", "sleep:nap"]  # "after" did not run


def test_a_handler_that_swallows_its_wait_for_a_signal_still_waits(start_worker):
    job_id = enqueue("swallowing-sleeper", {"signal": True}).id
    start_worker()
    row = wait_for(job_id, lambda r: waiting(r, "signal:approve") or ended(r), "waiting")
    assert waiting(row, "signal:approve"), row
    assert (row["attempts"], row["errors"], row["result"]) == (0, [], None)
    assert signal_job(job_id, "approve", "yes") == 1
    row = wait_for(job_id, lambda r: r["state"] == "done", "done after its signal")
    assert row["result"] == "woke" and row["attempts"] == 1


def test_bad_signals_are_refused_and_store_nothing():
    job_id = enqueue("approver", {}).id
    with pytest.raises(InvalidArgument, match="job_id must be a job id"):
        signal_job("1", "approve")
    with pytest.raises(InvalidArgument, match="non-empty string"):
        signal_job(job_id, "")
    with pytest.raises(PayloadError, match="signal_job"):
        signal_job(job_id, "approve", {"when": datetime.datetime.now()})
    assert signal_job(10**15, "approve") is None  # no such job
    row = job_row(job_id)
    assert row["signal_seq"] == 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM dbqueue_signal")
        assert cursor.fetchone()[0] == 0


# -- The race between a signal and a run about to wait, held open with real sessions -----------
def _running(job_id, token):
    execute(
        "UPDATE dbqueue_job SET state = 'running', lease_token = %s, attempts = 1,"
        " leased_until = now() + interval '1 minute', worker_id = 'w' WHERE id = %s",
        [token, job_id],
    )


def _params():
    from django.db import connections

    settings = connections["default"].settings_dict
    return {
        "dbname": settings["NAME"],
        "user": settings["USER"],
        "host": settings["HOST"],
        "port": settings["PORT"] or 5432,
        "password": settings["PASSWORD"] or None,
    }


def _signal(other, job_id):
    """signal_job's statements on ``other`` (the commit is the caller's)."""
    params = {"job": job_id, "name": "approve", "payload": '"yes"'}
    cursor = psycopg.ClientCursor(other)  # bound as Django binds them: one parameter, two uses
    for statement in (SIGNAL_LOCK, SIGNAL_TARGET, INSERT_SIGNAL):
        cursor.execute(statement, params)


ORDERS = [
    "signal-open-while-the-wait-is-written",
    "signal-commits-between-the-read-and-the-wait",
    "wait-commits-before-the-signal",
]


@pytest.mark.parametrize("order", ORDERS)
def test_a_signal_racing_the_wait_is_never_lost(order):
    """The run reads its signals (none yet: seen = 0), then writes its wait; the signal's
    transaction is held open or committed at each point in turn. In every order the job ends
    pending and due at once, with signal_seq 1: the signal is not left to a timeout."""
    job_id = enqueue("approver", {}).id
    _running(job_id, 42)
    found, _, seen, _ = store.read_signal("default", job_id=job_id, name="approve", seq=1)
    assert not found and seen == 0

    def wait():
        return store.snooze(
            "default",
            job_id=job_id,
            token=42,
            until=NEVER.isoformat(),
            counts=False,
            limit=1000,
            reason="signal:approve",
            seen=seen,
        )

    with psycopg.connect(**_params(), autocommit=False) as other:
        if order == "signal-open-while-the-wait-is-written":
            # The signal is inserted but not committed: the wait neither sees it nor waits for
            # it (no row lock is held); the signal's commit then finds the job waiting.
            _signal(other, job_id)
            execute("SET lock_timeout = '5s'")  # were the row locked, fail rather than hang
            try:
                wait()
            finally:
                execute("RESET lock_timeout")
            assert job_row(job_id)["run_after"] == NEVER
            other.commit()
        elif order == "signal-commits-between-the-read-and-the-wait":
            # The wait's statement sees signal_seq moved past what its read saw: due at once.
            _signal(other, job_id)
            other.commit()
            wait()
        else:
            wait()
            _signal(other, job_id)
            other.commit()
    row = job_row(job_id)
    assert row["state"] == "pending" and row["signal_seq"] == 1
    assert row["run_after"] < NEVER  # due: the signal is not left to a timeout that never comes
    with connection.cursor() as cursor:
        cursor.execute("SELECT run_after <= now() FROM dbqueue_job WHERE id = %s", [job_id])
        assert cursor.fetchone()[0]


def test_an_open_signal_transaction_does_not_hold_back_the_heartbeat():
    """A signal to a running job, left uncommitted by its sender, locks nothing the worker
    needs: the heartbeat renews that job and the worker's others at once."""
    first, second = enqueue("approver", {}).id, enqueue("approver", {}).id
    _running(first, 5)
    _running(second, 6)
    with psycopg.connect(**_params(), autocommit=False) as sender:
        _signal(sender, first)
        with psycopg.connect(**_params(), autocommit=True) as worker:
            worker.execute("SET lock_timeout = '2s'")
            renewed = worker.execute(
                EXTEND_LEASES,
                {"ids": [first, second], "tokens": [5, 6], "commit": None},
            ).fetchall()
        assert sorted(row[0] for row in renewed) == [first, second]
        assert job_row(first)["signal_seq"] == 0  # not yet: the signal changes it at commit
        sender.commit()
    assert job_row(first)["signal_seq"] == 1


def test_a_short_snooze_is_claimed_when_it_comes_due_not_at_the_poll(start_worker, settings):
    settings.DBQUEUE = {**settings.DBQUEUE, "POLL_INTERVAL": 60.0}
    start_worker()
    job_id = enqueue("snoozer", {"times": 2, "delay": 0.05}).id
    started = time.monotonic()
    row = wait_for(job_id, lambda r: r["state"] == "done", "done", timeout=20)
    assert row["snoozes"] == 2
    assert time.monotonic() - started < 10  # the 60 s poll never came into it


def test_the_status_command_and_the_admin_show_what_a_job_waits_for(start_worker, admin_client):
    import io
    import json as jsonlib

    from django.core.management import call_command

    job_id = enqueue("approver", {"timeout": 3600}).id
    snoozed = enqueue("snoozer", {"times": 1}).id
    start_worker()
    wait_for(job_id, lambda r: waiting(r, "signal:approve"), "waiting for its signal")
    wait_for(snoozed, lambda r: r["state"] == "done", "done")
    out = io.StringIO()
    call_command("jobqueue_status", "--job", str(job_id), stdout=out)
    text = out.getvalue()
    assert "waiting for: the signal 'approve', or its timeout at " in text
    assert "snoozes: 0" in text and "signal:approve" in text  # its wait's record, as a step
    out = io.StringIO()
    call_command("jobqueue_status", "--job", str(snoozed), "--json", stdout=out)
    report = jsonlib.loads(out.getvalue())
    assert (report["snoozes"], report["waiting_for"]) == (1, None)
    page = admin_client.get(f"/admin/django_dbqueue/backgroundjob/{job_id}/change/")
    assert page.status_code == 200
    assert "the signal &#x27;approve&#x27;, or its timeout at" in page.content.decode()
    signal_job(job_id, "approve", "ok")
    wait_for(job_id, lambda r: r["state"] == "done", "done")
    out = io.StringIO()
    call_command("jobqueue_status", "--job", str(job_id), stdout=out)
    assert "waiting for: -" in out.getvalue()
