"""Delivery records and atomic handlers: duplicates of a job produce one effect."""

import pytest
from django.db import connection, transaction

from django_dbqueue import enqueue
from django_dbqueue.connections import close_side_connections
from django_dbqueue.deliveries import (
    DeliveryFailed,
    begin_delivery,
    deliver,
    settle_delivery,
)
from django_dbqueue.exceptions import DBQueueError, InvalidArgument
from django_dbqueue.sweeper import Sweeper
from tests.testapp.models import Effect, ProviderCall
from tests.utils import job_row, run_concurrently, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _close_side_connections():
    yield
    close_side_connections()


def delivery(key):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, provider_reference, error, job_id, attempt FROM dbqueue_delivery WHERE key = %s",
            [key],
        )
        return cursor.fetchone()


def test_first_caller_proceeds_second_is_refused():
    first = begin_delivery("sms:1")
    assert first.proceed and first.state == "recorded"
    second = begin_delivery("sms:1")
    assert not second.proceed and second.unconfirmed
    assert first.sent("prov-123")
    third = begin_delivery("sms:1")
    assert (third.proceed, third.state, third.provider_reference) == (False, "sent", "prov-123")
    with pytest.raises(DBQueueError, match="not held by this caller"):
        third.sent("again")


def test_failed_delivery_may_be_attempted_again_by_exactly_one_caller():
    held = begin_delivery("pay:7")
    held.failed("card declined")
    assert delivery("pay:7")[:3] == ("failed", "", "card declined")
    retry = begin_delivery("pay:7")
    assert retry.proceed
    assert not begin_delivery("pay:7").proceed  # back to recorded: nobody else proceeds


def test_fifty_concurrent_runs_racing_on_one_key_send_once():
    def run():
        with deliver(None, "race:1") as d:
            if d.proceed:
                ProviderCall.objects.create(key="race:1")
            return d.proceed

    assert sorted(run_concurrently(50, run)) == [False] * 49 + [True]
    assert ProviderCall.objects.filter(key="race:1").count() == 1
    assert delivery("race:1")[0] == "sent"
    assert scalar("SELECT count(*) FROM dbqueue_delivery") == 1


def test_fifty_concurrent_retries_of_a_failed_delivery_send_once():
    begin_delivery("race:2").failed("timeout from provider, definitely not sent")
    proceeded = run_concurrently(50, lambda: begin_delivery("race:2").proceed)
    assert proceeded.count(True) == 1 and len(proceeded) == 50


def test_deliver_marks_failed_on_delivery_failed_and_leaves_unknown_on_other_errors():
    with pytest.raises(DeliveryFailed), deliver(None, "k:failed") as d:
        assert d.proceed
        raise DeliveryFailed("rejected")
    assert delivery("k:failed")[0] == "failed"
    with pytest.raises(TimeoutError), deliver(None, "k:unknown"):
        raise TimeoutError("provider did not answer")
    assert delivery("k:unknown")[0] == "recorded"  # nobody knows: never re-sent automatically


def test_record_commits_even_inside_a_transaction_that_rolls_back():
    with pytest.raises(RuntimeError), transaction.atomic():
        d = begin_delivery("k:atomic")
        assert d.proceed
        raise RuntimeError("the handler's transaction rolls back")
    assert delivery("k:atomic")[0] == "recorded"


def test_bad_key_is_refused():
    with pytest.raises(InvalidArgument, match="delivery key must be a non-empty string"):
        begin_delivery("")


def test_retry_after_a_definite_failure_sends_once(start_worker):
    start_worker()
    job = enqueue("deliver-sms", {"key": "sms:retry", "reject_attempts": [1]})
    wait_until(lambda: job_row(job.id)["state"] == "done", message="done")
    row = job_row(job.id)
    assert row["attempts"] == 2 and row["errors"][0]["message"] == "provider rejected attempt 1"
    assert ProviderCall.objects.filter(key="sms:retry").count() == 1
    state, reference, _, job_id, attempt = delivery("sms:retry")
    assert (state, reference, job_id, attempt) == ("sent", "ref-sms:retry-2", job.id, 2)


def _expire_and_sweep(job_id):
    """The job's lease runs out and its worker looks gone (its registry row stale: the sweeper
    leaves a live worker's expired leases to it), so a sweeper takes the job back."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET leased_until = now() - interval '1 second' WHERE id = %s",
            [job_id],
        )
        cursor.execute(
            "UPDATE dbqueue_worker SET stale_at = now() - interval '1 second' "
            "WHERE worker_id = (SELECT worker_id FROM dbqueue_job WHERE id = %s)",
            [job_id],
        )
    assert Sweeper("default").run_once()["rescued"] == 1


def test_job_delivered_twice_while_the_first_run_is_in_progress_has_one_effect(
    start_worker, fast_settings, tmp_path
):
    # No heartbeat during the test: the lease only ends when the test expires it.
    fast_settings.DBQUEUE = {
        **fast_settings.DBQUEUE,
        "HEARTBEAT_INTERVAL": 100,
        "LEASE": 300,
        "SWEEP_INTERVAL": 100,
    }
    flag = tmp_path / "go"
    start_worker(concurrency=2)
    job = enqueue(
        "deliver-sms", {"key": "sms:dup", "hold_before_send": True, "until_file": str(flag)}
    )
    wait_until(lambda: delivery("sms:dup") is not None, message="first run recorded")
    _expire_and_sweep(job.id)
    # The second delivery of the same job sees the record and skips the effect.
    wait_until(lambda: job_row(job.id)["state"] == "done", message="second run done")
    assert job_row(job.id)["result"] == {"skipped": "recorded"}
    flag.touch()  # the first run goes on: it holds the record, so it sends, once
    wait_until(lambda: delivery("sms:dup")[0] == "sent", message="first run settled")
    assert ProviderCall.objects.filter(key="sms:dup").count() == 1
    assert job_row(job.id)["attempts"] == 2


def test_atomic_handler_that_lost_its_lease_leaves_no_rows(start_worker, fast_settings, tmp_path):
    fast_settings.DBQUEUE = {
        **fast_settings.DBQUEUE,
        "HEARTBEAT_INTERVAL": 100,
        "LEASE": 300,
        "SWEEP_INTERVAL": 100,
    }
    flag = tmp_path / "go"
    start_worker(concurrency=2)
    job = enqueue("atomic-effect", {"hold_attempts": [1], "until_file": str(flag)})
    wait_until(lambda: job_row(job.id)["state"] == "running", message="first run")
    _expire_and_sweep(job.id)
    wait_until(lambda: job_row(job.id)["state"] == "done", message="second run done")
    flag.touch()
    wait_until(
        lambda: (
            not scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' AND datname = current_database()"
            )
        ),
        message="first run's transaction ended",
    )
    effects = list(Effect.objects.filter(job_id=job.id).values_list("attempt", flat=True))
    assert effects == [2]
    assert job_row(job.id)["attempts"] == 2


def test_settle_delivery_from_outside_the_job_and_fields_exposed():
    held = begin_delivery("charge:9")
    assert (held.job_id, held.attempt, held.updated_at) == (None, 0, None)
    again = begin_delivery("charge:9")
    assert again.unconfirmed and again.updated_at is not None
    assert settle_delivery("charge:9", "sent", reference="ch_1")
    assert not settle_delivery("charge:9", "failed")  # only a recorded delivery moves
    assert begin_delivery("charge:9").is_sent
    # The holder's own confirmation now reports the truth instead of pretending.
    assert held.sent("ch_other") is False and held.state == "sent"
    with pytest.raises(InvalidArgument, match="settled as 'sent' or 'failed'"):
        settle_delivery("charge:9", "done")


def test_retry_of_a_failed_delivery_clears_the_old_error():
    begin_delivery("k:stale").failed("card declined")
    assert begin_delivery("k:stale").proceed
    assert delivery("k:stale")[:3] == ("recorded", "", "")


def test_sent_on_exit_false_leaves_settling_to_the_handler():
    with deliver(None, "k:manual", sent_on_exit=False) as d:
        assert d.proceed
    assert delivery("k:manual")[0] == "recorded"


def terminate(pid):
    import psycopg

    from django_dbqueue.connections import connection_params

    with psycopg.connect(**connection_params("default"), autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
        # Wait until the server has really ended it, so the settle meets a dead connection.
        wait_until(
            lambda: (
                not admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
            ),
            message=f"backend {pid} gone",
        )


@pytest.mark.parametrize("outcome", ["sent", "failed"])
def test_a_settle_that_meets_a_dead_connection_reconnects_and_settles(outcome):
    held = begin_delivery(f"sms:dead-{outcome}")
    assert held.proceed
    connection.ensure_connection()
    terminate(connection.connection.info.backend_pid)
    assert (held.sent("ref-1") if outcome == "sent" else held.failed("declined")) is True
    assert held.state == outcome
    assert delivery(f"sms:dead-{outcome}")[0] == outcome


def test_a_settle_inside_an_atomic_handler_reconnects_its_side_connection():
    from django_dbqueue import connections as dbq_connections

    with transaction.atomic():
        held = begin_delivery("sms:dead-side")
        side = dbq_connections._side.default
        terminate(side.info.backend_pid)
        assert held.sent("ref-2") is True
    assert delivery("sms:dead-side")[:2] == ("sent", "ref-2")


def test_a_settle_whose_first_try_committed_reports_success(monkeypatch):
    """The reply of a committed settle was lost: the retry matches nothing, the row says ours."""
    from django_dbqueue.store import deliveries

    held = begin_delivery("sms:lost-reply")
    real = deliveries.side_execute
    calls = []

    def lose_first_reply(using, statement, params):
        rows = real(using, statement, params)
        calls.append(statement)
        if len(calls) == 1:
            from django.db import OperationalError

            raise OperationalError("server closed the connection unexpectedly")
        return rows

    monkeypatch.setattr(deliveries, "side_execute", lose_first_reply)
    assert held.sent("ref-3") is True and held.state == "sent"
    assert len(calls) == 3  # the settle, its retry (matching nothing), the read back
