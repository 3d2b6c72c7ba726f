"""publish() and replay_event(): one job per subscriber in the caller's transaction, idempotent
under a race held open with two real sessions, refusals of bad input, retention, the admin."""

import io
import json
import threading

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction

from django_dbqueue import (
    EnqueueError,
    JobRegistrationError,
    PayloadError,
    UnknownJobType,
    job,
    publish,
    registry,
    replay_event,
)
from django_dbqueue.checks import check_settings
from django_dbqueue.sweeper import Sweeper
from tests.testapp.models import Invoice
from tests.utils import Listener, job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

PAID = "test.invoice.paid"
PAID_SUBSCRIBERS = ["email-on-paid", "flaky-on-paid", "ledger-on-paid"]  # by type name


def event_row(event_id):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, payload::text, idempotency_key, subscribers::text FROM dbqueue_event "
            "WHERE id = %s",
            [event_id],
        )
        row = cursor.fetchone()
    return row and (row[0], json.loads(row[1]), row[2], json.loads(row[3]))


def jobs_of(event_id):
    with connection.cursor() as cursor:
        cursor.execute("SELECT type FROM dbqueue_job WHERE event_id = %s ORDER BY type", [event_id])
        return [t for (t,) in cursor.fetchall()]


@pytest.fixture
def sms_subscriber():
    """A subscriber on the "emails" queue, registered for one test only (a type of the testapp
    on that queue would add an E006 to test_checks' settings without it)."""
    job("sms-on-paid", subscribes=[PAID], queue="emails", priority=-3)(lambda ctx: None)
    yield "sms-on-paid"
    registry.unregister("sms-on-paid")


def test_publish_makes_one_job_per_subscriber_with_each_types_options_at_commit(sms_subscriber):
    listener = Listener()
    try:
        with transaction.atomic():
            Invoice.objects.create(number="P-1")
            event = publish(PAID, {"invoice": 1}, idempotency_key="invoice-1")
            assert listener.drain(0.05) == [], "a notification escaped before commit"
        assert sorted(listener.drain(1.0)) == ["1:emails", "3:default"]
    finally:
        listener.close()
    types = [*PAID_SUBSCRIBERS, "sms-on-paid"]
    assert event.created and event.name == PAID
    assert sorted(j.type for j in event.jobs) == types
    assert event_row(event.id) == (PAID, {"invoice": 1}, "invoice-1", types)
    rows = {j.type: job_row(j.id) for j in event.jobs}
    options = {
        t: (r["queue"], r["priority"], r["max_attempts"], r["payload"], r["event_id"], r["state"])
        for t, r in rows.items()
    }
    assert options == {
        "email-on-paid": ("default", 5, 4, {"invoice": 1}, event.id, "pending"),
        "flaky-on-paid": ("default", 0, 3, {"invoice": 1}, event.id, "pending"),
        "ledger-on-paid": ("default", 0, 10, {"invoice": 1}, event.id, "pending"),
        "sms-on-paid": ("emails", -3, 10, {"invoice": 1}, event.id, "pending"),
    }
    assert {t: r["idempotency_key"] for t, r in rows.items()} == {
        t: f"dbqueue:event:{event.id}:{t}" for t in types
    }


def test_rollback_leaves_no_event_and_no_job():
    with pytest.raises(RuntimeError), transaction.atomic():
        Invoice.objects.create(number="P-2")
        event = publish(PAID, {"invoice": 2})
        raise RuntimeError("the view failed after publish")
    assert event_row(event.id) is None
    assert scalar("SELECT count(*) FROM dbqueue_job") == 0
    assert not Invoice.objects.filter(number="P-2").exists()


def test_a_repeated_key_creates_nothing_and_returns_the_first_event():
    first = publish(PAID, {"invoice": 3}, idempotency_key="k")
    again = publish(PAID, {"invoice": 999}, idempotency_key="k")
    assert (again.id, again.created) == (first.id, False)
    assert sorted((j.id, j.type) for j in again.jobs) == sorted((j.id, j.type) for j in first.jobs)
    assert not any(j.created for j in again.jobs)
    assert scalar("SELECT count(*) FROM dbqueue_job") == 3
    assert event_row(first.id)[1] == {"invoice": 3}
    # The key is per event name: another event may hold it too.
    other = publish("test.invoice.refunded", {"invoice": 3}, idempotency_key="k")
    assert other.created and [j.type for j in other.jobs] == ["email-on-paid"]


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
def test_two_publishes_racing_on_a_key_make_one_set_of_jobs(first_ends):
    """Session A publishes and holds its transaction open; session B publishes the same key and
    waits on A's index entry; then A commits (B gets A's event) or rolls back (B creates it)."""
    a_published, a_end, results = threading.Event(), threading.Event(), {}

    def session_a():
        try:
            with transaction.atomic():
                results["a"] = publish(PAID, {"from": "a"}, idempotency_key="race")
                results["a_pid"] = connection.connection.info.backend_pid
                a_published.set()
                assert a_end.wait(30)
                if first_ends == "rollback":
                    raise RuntimeError("A rolls back")
        except RuntimeError:
            pass
        finally:
            connections.close_all()

    def session_b():
        try:
            results["b"] = publish(PAID, {"from": "b"}, idempotency_key="race")
        finally:
            connections.close_all()

    a = threading.Thread(target=session_a)
    a.start()
    assert a_published.wait(30)
    b = threading.Thread(target=session_b)
    b.start()
    wait_until(
        lambda: scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE %s AND pid <> %s",
            ["%dbqueue_event%", results["a_pid"]],
        ),
        message="session B to wait for A's uncommitted event",
    )
    a_end.set()
    a.join(30)
    b.join(30)
    assert "b" in results, "session B failed"
    events = scalar("SELECT count(*) FROM dbqueue_event WHERE idempotency_key = 'race'")
    assert events == 1
    assert scalar("SELECT count(*) FROM dbqueue_job") == 3
    winner = results["a"] if first_ends == "commit" else results["b"]
    assert results["b"].id == winner.id
    assert results["b"].created is (first_ends == "rollback")
    assert event_row(winner.id)[1] == {"from": "a" if first_ends == "commit" else "b"}
    assert sorted(j.type for j in results["b"].jobs) == PAID_SUBSCRIBERS


def test_an_event_with_no_subscriber_is_stored_and_can_be_replayed_later(settings):
    event = publish("test.nobody.listens", {"x": 1})
    assert event.created and event.jobs == ()
    assert event_row(event.id) == ("test.nobody.listens", {"x": 1}, None, [])
    settings.DBQUEUE = {
        **settings.DBQUEUE,
        "SUBSCRIPTIONS": {"test.nobody.listens": ["late-subscriber"]},
    }
    [made] = replay_event(event.id)
    assert (made.type, made.created) == ("late-subscriber", True)
    assert job_row(made.id)["payload"] == {"x": 1} and job_row(made.id)["event_id"] == event.id
    assert event_row(event.id)[3] == ["late-subscriber"]
    assert replay_event(event.id) == [], "a subscriber that has its job gets nothing new"


def test_a_later_subscriber_gets_new_events_and_old_ones_only_by_replay(settings):
    old = publish(PAID, {"n": 1})
    settings.DBQUEUE = {**settings.DBQUEUE, "SUBSCRIPTIONS": {PAID: ["late-subscriber"]}}
    new = publish(PAID, {"n": 2})
    assert "late-subscriber" not in jobs_of(old.id)
    assert jobs_of(new.id) == sorted([*PAID_SUBSCRIBERS, "late-subscriber"])
    made = replay_event(old.id, ["late-subscriber", "ledger-on-paid"])
    assert [j.type for j in made] == ["late-subscriber"]  # the ledger has its job already
    assert jobs_of(old.id) == jobs_of(new.id)
    assert event_row(old.id)[3] == [*PAID_SUBSCRIBERS, "late-subscriber"]


def test_bad_input_is_refused_with_an_error_naming_it(settings):
    for name in ("", 5, None, "x" * 201):
        with pytest.raises(EnqueueError, match="event name must be a non-empty string"):
            publish(name, {})
    with pytest.raises(EnqueueError, match="idempotency_key"):
        publish(PAID, {}, idempotency_key="")
    with pytest.raises(PayloadError, match=r"payload\[.when.\]"):
        publish(PAID, {"when": object()})
    with pytest.raises(PayloadError):
        publish("test.nobody.listens", {"when": {1, 2}})
    with pytest.raises(EnqueueError, match="no event has id 123456789"):
        replay_event(123456789)
    with pytest.raises(EnqueueError, match="event_id must be a positive int"):
        replay_event("7")
    event = publish("test.nobody.listens", {})
    with pytest.raises(EnqueueError, match="subscribers must be a list"):
        replay_event(event.id, "late-subscriber")
    with pytest.raises(UnknownJobType, match="no-such-type"):
        replay_event(event.id, ["no-such-type"])
    settings.DBQUEUE = {**settings.DBQUEUE, "SUBSCRIPTIONS": {PAID: ["ledger-on-payd"]}}
    with pytest.raises(UnknownJobType, match="ledger-on-payd"):
        publish(PAID, {})
    assert scalar("SELECT count(*) FROM dbqueue_job") == 0
    assert scalar("SELECT count(*) FROM dbqueue_event") == 1


def test_subscribes_is_validated_at_registration():
    def handler(ctx):
        return None

    with pytest.raises(JobRegistrationError, match=r"subscribes must be a list of event names"):
        job("t-sub-1", subscribes="invoice.paid")(handler)
    with pytest.raises(JobRegistrationError, match=r"subscribes\[1\] must be a non-empty"):
        job("t-sub-2", subscribes=["invoice.paid", ""])(handler)
    with pytest.raises(JobRegistrationError, match="cannot have a unique_key"):
        job("t-sub-3", subscribes=["invoice.paid"], unique_key=lambda p: p["id"])(handler)
    assert registry.get("t-sub-1") is registry.get("t-sub-2") is registry.get("t-sub-3") is None


def test_subscriptions_setting_is_checked(settings):
    def messages(value):
        settings.DBQUEUE = {**settings.DBQUEUE, "SUBSCRIPTIONS": value}
        return [(e.id, e.msg) for e in check_settings()]

    assert messages({PAID: ["late-subscriber"]}) == []
    [(check_id, msg)] = messages(["late-subscriber"])
    assert check_id == "dbqueue.E013" and "must be a dict" in msg
    [(_, msg)] = messages({PAID: "late-subscriber"})
    assert "must be a list of job type names" in msg
    [(_, msg)] = messages({PAID: ["late-subscribr"]})
    assert "'late-subscribr', which is not a registered job type" in msg
    assert "Did you mean 'late-subscriber'?" in msg
    [(_, msg)] = messages({"": ["late-subscriber"]})
    assert "event name" in msg


def test_the_sweeper_prunes_an_event_once_no_job_refers_to_it(settings):
    settings.DBQUEUE = {**settings.DBQUEUE, "DONE_RETENTION": 60}
    finished = publish(PAID, {"n": 1})
    live = publish(PAID, {"n": 2})
    lonely = publish("test.nobody.listens", {})
    young = publish("test.nobody.listens", {})
    with connection.cursor() as cursor:  # all but "young" published two minutes ago
        cursor.execute(
            "UPDATE dbqueue_event SET published_at = now() - interval '2 minutes' WHERE id <> %s",
            [young.id],
        )
        cursor.execute(
            "UPDATE dbqueue_job SET state = 'done', finished_at = now() - interval '2 minutes' "
            "WHERE event_id = %s",
            [finished.id],
        )
    counts = Sweeper().run_once()
    assert (counts["pruned"], counts["events_pruned"]) == (3, 2)
    assert event_row(finished.id) is None and event_row(lonely.id) is None
    assert event_row(live.id) is not None and event_row(young.id) is not None
    settings.DBQUEUE = {**settings.DBQUEUE, "DONE_RETENTION": None}
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM dbqueue_job")
    assert Sweeper().run_once()["events_pruned"] == 0  # kept forever with the done jobs


def test_status_and_admin_show_the_event_that_made_a_job(admin_client):
    event = publish(PAID, {"invoice": 7}, idempotency_key="admin-7")
    job_id = min(j.id for j in event.jobs)
    out = io.StringIO()
    call_command("jobqueue_status", "--job", str(job_id), stdout=out)
    assert f"event: {PAID} #{event.id}" in out.getvalue().splitlines()
    out = io.StringIO()
    call_command("jobqueue_status", "--job", str(job_id), "--json", stdout=out)
    assert json.loads(out.getvalue())["event"] == {"id": event.id, "name": PAID}

    page = admin_client.get(f"/admin/django_dbqueue/backgroundjob/{job_id}/change/")
    assert page.status_code == 200
    assert f'<a href="/admin/django_dbqueue/event/{event.id}/change/">{PAID} #{event.id}</a>' in (
        page.content.decode()
    )
    page = admin_client.get(f"/admin/django_dbqueue/event/{event.id}/change/").content.decode()
    for j in event.jobs:
        assert f'<a href="/admin/django_dbqueue/backgroundjob/{j.id}/change/">#{j.id}</a>' in page
    assert "admin-7" in page and "&quot;invoice&quot;: 7" in page
    listing = admin_client.get("/admin/django_dbqueue/event/?q=admin-7").content.decode()
    assert f"/admin/django_dbqueue/event/{event.id}/change/" in listing
    assert admin_client.get("/admin/django_dbqueue/event/add/").status_code == 403
