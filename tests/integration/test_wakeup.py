"""The wake-up after the commit: when it is sent, on which connection, what it carries, and that a
failed or coalesced one never costs the caller anything but latency."""

import io
import logging
import time

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from django_dbqueue import cancel_notices, enqueue, store, wakeup
from django_dbqueue.notifications import parse_wakeup
from tests.testapp.models import Invoice
from tests.utils import Listener, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def listener():
    listen = Listener()
    yield listen
    listen.close()


def show_synchronous_commit():
    return scalar("SHOW synchronous_commit")


def test_rollback_sends_nothing_and_its_hook_is_not_reused(listener):
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue("noop")
        raise RuntimeError("the view failed")
    assert listener.collect(0.2) == []
    with transaction.atomic():  # the rolled-back transaction's count must not leak in here
        enqueue("noop")
    assert listener.until_jobs(1) == ["1:default"]
    assert listener.collect(0.1) == ["1:default"]


def test_a_rolled_back_savepoint_takes_its_jobs_out_of_the_count(listener):
    with transaction.atomic():
        with pytest.raises(RuntimeError), transaction.atomic():
            enqueue("noop")
            enqueue("noop")
            raise RuntimeError("inner block failed")
        enqueue("noop", queue="emails")
        enqueue("noop")
        assert listener.collect(0.05) == [], "a notification escaped before commit"
    assert sorted(listener.until_jobs(2)) == ["1:default", "1:emails"]
    assert scalar("SELECT count(*) FROM dbqueue_job") == 2


def test_a_rolled_back_last_savepoint_still_sends_the_commits_other_jobs(listener):
    # The hooks of the last jobs_ready calls went with their savepoint: the earlier hooks'
    # deferred counts are sent by the sender thread, once, with the right count.
    with transaction.atomic():
        enqueue("noop")
        enqueue("noop", queue="emails")
        with pytest.raises(RuntimeError), transaction.atomic():
            enqueue("noop")
            raise RuntimeError("inner block failed")
    assert sorted(listener.until_jobs(2)) == ["1:default", "1:emails"]
    assert sorted(listener.collect(0.1)) == ["1:default", "1:emails"]  # nothing more
    assert wakeup.flush() and not wakeup._COALESCER._deferred


def test_many_jobs_ready_calls_in_one_transaction_send_one_wake_up_per_queue(listener, monkeypatch):
    # The commit's last hook sends what the earlier ones deferred; the sender thread sends them
    # instead when that hook is more than DEFER (2 ms) late, which a loaded machine can make
    # it between two hooks (then 1 + 2 + 2 arrive: the counts still add up). That fallback has
    # its own test (above); here it must not fire.
    monkeypatch.setattr(wakeup, "DEFER", 60.0)
    with transaction.atomic():
        for i in range(5):
            enqueue("noop", queue="emails" if i % 2 else "default")
    assert sorted(listener.until_jobs(5)) == ["2:emails", "3:default"]


def test_the_callers_transaction_keeps_synchronous_commit(listener):
    assert show_synchronous_commit() == "on"
    with transaction.atomic():
        Invoice.objects.create(number="W-1")
        enqueue("noop")
        assert show_synchronous_commit() == "on"
    assert listener.until_jobs(1) == ["1:default"]
    # The wake-up ran on this connection with set_config(..., is_local=true): it ended with its
    # own one-statement transaction.
    assert show_synchronous_commit() == "on"
    enqueue("noop")  # autocommit: the same
    assert listener.until_jobs(2)
    assert show_synchronous_commit() == "on"


def test_scheduled_and_duplicate_jobs_wake_nobody(listener):
    enqueue("noop", delay=60)
    enqueue("noop", idempotency_key="k-1")
    assert listener.until_jobs(1) == ["1:default"]
    enqueue("noop", idempotency_key="k-1")  # exists: nothing inserted
    assert listener.collect(0.2) == ["1:default"]


def test_manual_transaction_management_notifies_at_the_callers_commit(listener):
    transaction.set_autocommit(False)
    try:
        enqueue("noop")
        assert show_synchronous_commit() == "on"
        assert listener.collect(0.1) == []
        transaction.commit()
    finally:
        transaction.set_autocommit(True)
    assert listener.until_jobs(1) == ["1:default"]


def test_a_burst_is_coalesced_and_its_last_job_still_wakes_a_worker(listener, settings):
    settings.DBQUEUE = {**settings.DBQUEUE, "WAKEUP_WINDOW": 0.3}
    started = time.monotonic()
    for _ in range(20):
        enqueue("noop")  # autocommit: each a transaction of its own
    elapsed = time.monotonic() - started
    got = listener.until_jobs(20)  # the trailing notification comes without another enqueue
    assert got[0] == "1:default"  # the first at once, on the caller's connection
    assert sum(parse_wakeup(p)[1] for p in got) == 20
    assert len(got) <= 2 + elapsed / 0.3, got  # one per window, plus the trailing one


def test_a_window_of_zero_wakes_the_workers_after_every_commit(listener, settings):
    settings.DBQUEUE = {**settings.DBQUEUE, "WAKEUP_WINDOW": 0}
    for _ in range(5):
        enqueue("noop")  # autocommit: each a transaction of its own, each notified at once
    assert listener.until_jobs(5) == ["1:default"] * 5


def test_a_bad_window_falls_back_to_the_default_and_never_fails_the_enqueue(listener, settings):
    # The system checks report the value (E003); the commit path must not raise on it.
    settings.DBQUEUE = {**settings.DBQUEUE, "WAKEUP_WINDOW": "5ms"}
    assert wakeup.window() == wakeup.DEFAULT_WINDOW
    with transaction.atomic():
        job = enqueue("noop")
    assert job.created
    assert listener.until_jobs(1) == ["1:default"]


def test_the_sender_closes_its_connection_when_idle(listener, monkeypatch, settings):
    settings.DBQUEUE = {**settings.DBQUEUE, "WAKEUP_WINDOW": 0.05}
    monkeypatch.setattr(wakeup, "IDLE_CLOSE", 0.3)
    sender = (  # every other session here is the listener's
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND pid <> %s "
        "AND (query = 'SELECT 1' OR query LIKE '%%set_config(%%')"
    )
    others = [listener.conn.info.backend_pid]
    enqueue("noop")
    enqueue("noop")  # within the window: sent by the sender thread, on its own connection
    listener.until_jobs(2)
    wait_until(lambda: scalar(sender, others) == 1, message="the sender's connection", timeout=5)
    wait_until(lambda: scalar(sender, others) == 0, message="the sender to close it", timeout=5)


def test_a_failed_wake_up_is_logged_and_never_raised(listener, settings, caplog):
    # PostgreSQL refuses the channel; nobody listens on it, so wake-ups are forced.
    settings.DBQUEUE = {
        **settings.DBQUEUE,
        "NOTIFY_CHANNEL": "x" * 64,
        "WAKEUP_IF_WAITING": False,
    }
    with caplog.at_level(logging.WARNING, logger="django_dbqueue.wakeup"):
        with transaction.atomic():
            Invoice.objects.create(number="W-2")
            job = enqueue("noop")
        enqueue("noop")  # within the window: the sender thread's attempt fails too
        # The commit's own failed wake-up, then the sender thread's (one or two sends: the
        # retry of the first and the autocommit enqueue's may go out together or apart).
        wait_until(
            lambda: len([r for r in caplog.records if "could not wake" in r.getMessage()]) >= 2,
            message="two warnings",
        )
        assert "after a commit" in caplog.records[0].getMessage()
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE id = %s", [job.id]) == 1
    assert Invoice.objects.filter(number="W-2").exists()
    assert scalar("SELECT 1") == 1  # the caller's connection is fine


def test_requeue_and_run_now_wake_their_queues_after_the_commit(listener):
    dead = [enqueue("noop", delay=60).id for _ in range(3)]
    later = enqueue("noop", queue="emails", delay=60).id
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET state = 'dead', attempts = 1, finished_at = now() "
            "WHERE id = ANY(%s)",
            [dead],
        )
    call_command("jobqueue_requeue", "--ids", *map(str, dead), stdout=io.StringIO())
    assert listener.until_jobs(3) == ["3:default"]
    with transaction.atomic():
        wakeup.jobs_ready("default", store.run_now("default", [later]).values())
        assert listener.collect(0.05) == ["3:default"]
    assert listener.until_jobs(4) == ["3:default", "1:emails"]


def test_a_hook_that_finds_a_transaction_open_again_leaves_it_alone(listener):
    """If an earlier on_commit hook opened a transaction, the wake-up is not sent inside it (its
    set_config would turn off synchronous commit for that transaction): the sender sends it."""
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        wakeup._COALESCER.committed("default", "dbqueue", {"default": 1})
        assert listener.until_jobs(1) == ["1:default"]
        assert show_synchronous_commit() == "on"
    assert not [q for q in queries if "pg_notify" in q["sql"]]


def test_a_transaction_opened_behind_django_s_back_carries_its_job_s_wake_up(listener):
    """Django says autocommit, but libpq is in a transaction (a raw BEGIN): the job enqueued
    there is in it. The wake-up must not turn off that transaction's synchronous commit, and
    must reach the workers at its commit, when the job becomes visible: sent only before it
    (the sender thread's copy, for jobs of earlier commits), it would find nothing to claim and
    the job would wait for the poll."""
    from django.test.utils import CaptureQueriesContext

    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
    open_ = True
    try:
        assert connection.get_autocommit() and not connection.in_atomic_block
        with CaptureQueriesContext(connection) as queries:
            job = enqueue("noop")
        assert show_synchronous_commit() == "on", "the caller's durability untouched"
        assert not [q for q in queries if "synchronous_commit" in q["sql"]]
        assert scalar("SELECT count(*) FROM dbqueue_job WHERE id = %s", [job.id]) == 1
        early = sum(parse_wakeup(p)[1] for p in listener.collect(0.3))
        with connection.cursor() as cursor:
            cursor.execute("COMMIT")
        open_ = False
        listener.until_jobs(early + 1)
    finally:
        if open_:
            with connection.cursor() as cursor:
                cursor.execute("ROLLBACK")


def test_a_cancel_in_a_transaction_opened_behind_django_s_back_rides_in_it(listener):
    """The same for a cancel's notification: sent inside the caller's raw transaction as a
    plain NOTIFY (delivered at its commit), never with the statement that turns off
    synchronous commit for the transaction it runs in."""
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
    open_ = True
    try:
        cancel_notices.jobs_cancelled("default", [41, 42])
        assert show_synchronous_commit() == "on", "the caller's durability untouched"
        assert listener.collect(0.2) == [], "delivered at the commit, not before"
        with connection.cursor() as cursor:
            cursor.execute("COMMIT")
        open_ = False
        wait_until(
            lambda: any(p.startswith("cancel:") for p in listener.collect(0.05)),
            timeout=5,
            message="the cancel's notification, at the commit",
        )
    finally:
        if open_:
            with connection.cursor() as cursor:
                cursor.execute("ROLLBACK")
