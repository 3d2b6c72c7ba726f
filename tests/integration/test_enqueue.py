"""enqueue(): transactions, notifications, idempotency, and every refusal of bad input."""

import datetime
import json
import math
import threading
import time

import hypothesis
import pytest
from django.db import connection, connections, transaction
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st
from psycopg import OperationalError

from django_dbqueue import (
    EnqueueError,
    PayloadError,
    UnknownJobType,
    UnsupportedDatabase,
    enqueue,
    enqueue_many,
    payloads,
    wakeup,
)
from tests.testapp.models import Invoice
from tests.utils import Listener, job_row, scalar

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def listener():
    listen = Listener()
    yield listen
    listen.close()


def test_job_commits_with_the_callers_writes_and_notifies_once_at_commit(listener):
    with transaction.atomic():
        Invoice.objects.create(number="A-1")
        first = enqueue("record", {"n": 1})
        enqueue("record", {"n": 2})
        enqueue("noop")
        assert listener.drain(0.05) == [], "a notification escaped before commit"
    assert listener.drain(1.0) == ["3:default"]  # one per queue per transaction, with its count
    assert job_row(first.id)["state"] == "pending"
    assert scalar("SELECT count(*) FROM dbqueue_job") == 3


def test_rollback_removes_job_and_domain_rows_and_sends_nothing(listener):
    with pytest.raises(RuntimeError), transaction.atomic():
        Invoice.objects.create(number="A-2")
        job = enqueue("record", {"n": 1})
        raise RuntimeError("the view failed after enqueue")
    assert job_row(job.id) is None
    assert not Invoice.objects.filter(number="A-2").exists()
    assert listener.drain(0.2) == []


def test_autocommit_enqueue_commits_at_once(listener):
    job = enqueue("noop")
    assert listener.drain(1.0) == ["1:default"]
    assert job_row(job.id)["state"] == "pending"


def test_enqueue_is_one_round_trip_and_the_wake_up_follows_the_commit(listener):
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        enqueue("noop", {"x": 1})
        enqueue("noop", {"x": 2})
        in_transaction = [q["sql"] for q in queries if q["sql"] not in ("BEGIN", "COMMIT")]
        assert len(in_transaction) == 2  # one INSERT each, no notification among them
        assert "_commit" not in connections["default"].__dict__  # Django's commit, untouched
    # The one wake-up for both jobs goes after the COMMIT, from the on_commit hook.
    assert listener.drain(1.0) == ["2:default"]


def test_a_failed_commit_sends_no_wake_up_and_raises_as_before(listener):
    from django.db import IntegrityError

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TEMP TABLE deferred_check (x int UNIQUE DEFERRABLE INITIALLY DEFERRED)"
        )
    with pytest.raises(IntegrityError), transaction.atomic():
        job = enqueue("noop")
        with connection.cursor() as cursor:  # violates only at COMMIT
            cursor.execute("INSERT INTO deferred_check VALUES (1), (1)")
    assert job_row(job.id) is None
    # Within the window (its count would wait for the trailing notification): withdrawn too.
    wakeup._COALESCER._last[("default", "dbqueue", "default")] = time.monotonic()
    with pytest.raises(IntegrityError), transaction.atomic():
        enqueue("noop")
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO deferred_check VALUES (2), (2)")
    assert wakeup._COALESCER._pending == {}
    assert listener.drain(0.3) == []
    wakeup._COALESCER._last.clear()
    with transaction.atomic():  # the connection is fine, and the next commit notifies
        enqueue("noop")
    assert listener.drain(1.0) == ["1:default"]


def test_a_wake_up_failing_after_the_commit_is_logged_not_raised(listener, monkeypatch, caplog):
    for name in ("NOTIFY", "NOTIFY_NAMED"):  # naming its workers (waiters.py) or not
        monkeypatch.setattr(
            f"django_dbqueue.store.wakeups.{name}", "SELECT pg_notify(%(channel)s, 1 / 0 || '')"
        )
    with caplog.at_level("WARNING", logger="django_dbqueue.wakeup"), transaction.atomic():
        job = enqueue("noop")
    assert job_row(job.id)["state"] == "pending"  # committed, and enqueue() did not raise
    assert "could not wake the workers (1:default) after a commit" in caplog.text
    wakeup.flush()  # the sender thread's retry (which fails the same way here)
    monkeypatch.undo()
    listener.drain(0.2)
    with transaction.atomic():  # the connection is fine: the next commit notifies
        enqueue("noop")
    assert listener.drain(1.0) == ["1:default"]


def test_a_wake_up_that_fails_on_the_committing_connection_is_sent_by_the_sender(
    listener, monkeypatch, caplog
):
    # The connection breaks between the COMMIT and the hook (here: the send raises once): the
    # counts go to the sender thread, which sends them on its own connection.
    real, calls = wakeup.wakeups.notify_if_idle, []

    def fails_on_django_connection(conn, channel, payloads):
        calls.append(payloads)
        if len(calls) == 1:
            raise OperationalError("the connection broke after the commit")
        return real(conn, channel, payloads)

    monkeypatch.setattr(wakeup.wakeups, "notify_if_idle", fails_on_django_connection)
    listener.drain(0.2)
    with caplog.at_level("WARNING", logger="django_dbqueue.wakeup"), transaction.atomic():
        job = enqueue("noop")
    assert job_row(job.id)["state"] == "pending"
    assert "sender tries again on its own connection" in caplog.text
    assert listener.drain(1.0) == ["1:default"]  # sent once, by the sender thread
    assert len(calls) == 2


def test_the_statements_of_one_transaction_share_a_cursor_that_django_still_wraps():
    seen = []

    def spy(execute, sql, params, many, context):
        seen.append((context["cursor"], sql))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy), transaction.atomic():
        first = enqueue("noop")
        second = enqueue_many([("noop", {"n": 1})])[0]
        third = enqueue("noop", idempotency_key="kept-cursor")
    inserts = [cursor for cursor, sql in seen if "INSERT INTO dbqueue_job" in sql]
    assert len(inserts) == 3, seen  # every statement went through execute_wrapper()
    assert inserts[0] is inserts[1] is inserts[2]
    assert connections["default"].__dict__["_dbqueue_cursor"] is inserts[0]
    assert [job_row(j.id)["state"] for j in (first, second, third)] == ["pending"] * 3


def test_the_kept_cursor_follows_a_reconnect_and_a_broken_transaction():
    from django.db import DatabaseError, InternalError
    from django.db.transaction import TransactionManagementError

    with transaction.atomic():
        enqueue("noop")
    kept = connections["default"].__dict__["_dbqueue_cursor"]
    connection.close()
    with transaction.atomic():
        job = enqueue("noop")
    assert connections["default"].__dict__["_dbqueue_cursor"] is not kept
    assert kept.cursor.closed and job_row(job.id)["state"] == "pending"
    # A failed statement in a savepoint: the block after it enqueues on the same cursor.
    with transaction.atomic():
        with pytest.raises(DatabaseError), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
        job = enqueue("noop")
    assert job_row(job.id)["state"] == "pending"
    # Without a savepoint the transaction is broken: Django's check still refuses the INSERT,
    # and a statement that PostgreSQL refuses still raises Django's error, not psycopg's.
    with transaction.atomic():
        broken = transaction.atomic(savepoint=False)
        with pytest.raises(DatabaseError), broken, connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
        with pytest.raises(TransactionManagementError):
            enqueue("noop")
    with transaction.atomic():
        with pytest.raises(DatabaseError), connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
        with pytest.raises(InternalError, match="current transaction is aborted"):
            enqueue("noop")
    assert scalar("SELECT count(*) FROM dbqueue_job") == 3  # the refused ones left nothing


def test_outside_atomic_and_while_django_logs_queries_each_statement_opens_a_cursor():
    from django.test.utils import CaptureQueriesContext

    connections["default"].__dict__.pop("_dbqueue_cursor", None)
    enqueue("noop")  # autocommit: Django's cursor(), with its health check
    assert "_dbqueue_cursor" not in connections["default"].__dict__
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        enqueue("noop")  # the debug cursor records it
    assert "_dbqueue_cursor" not in connections["default"].__dict__
    assert sum("INSERT INTO dbqueue_job" in q["sql"] for q in queries) == 1


def test_enqueue_many_one_statement_in_order_and_one_notification(listener):
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        jobs = enqueue_many([("record", {"i": i}) for i in range(50)] + [("email", {})])
    statements = [q["sql"] for q in queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(statements) == 1, statements  # the INSERT; the wake-up rode with the COMMIT
    assert "pg_notify" not in statements[0]
    assert [job_row(j.id)["payload"] for j in jobs[:50]] == [{"i": i} for i in range(50)]
    assert sorted(listener.drain(1.0)) == ["1:emails", "50:default"]


def test_options_are_stored():
    run_after = timezone.now() + datetime.timedelta(hours=1)
    job = enqueue(
        "echo",
        {"a": 1},
        queue="emails",
        priority=7,
        run_after=run_after,
        max_attempts=3,
        idempotency_key="k-opts",
    )
    row = job_row(job.id)
    assert (row["queue"], row["priority"], row["max_attempts"], row["idempotency_key"]) == (
        "emails",
        7,
        3,
        "k-opts",
    )
    assert row["run_after"] == run_after
    delayed = job_row(enqueue("echo", delay=datetime.timedelta(seconds=90)).id)
    assert 89 <= (delayed["run_after"] - delayed["created_at"]).total_seconds() <= 91


def test_idempotency_key_returns_the_existing_job():
    first = enqueue("noop", idempotency_key="invoice-email:1")
    second = enqueue("noop", idempotency_key="invoice-email:1")
    assert first.created and not second.created
    assert second.id == first.id
    assert scalar("SELECT count(*) FROM dbqueue_job") == 1


def test_enqueue_many_with_keys_already_present_and_repeated_in_batch():
    existing = enqueue("noop", idempotency_key="k1")
    jobs = enqueue_many(
        [
            {"type": "noop", "idempotency_key": "k1"},
            {"type": "noop", "idempotency_key": "k2"},
            {"type": "noop", "idempotency_key": "k2"},
            ("noop", {}),
        ]
    )
    assert [j.created for j in jobs] == [False, True, False, True]
    assert jobs[0].id == existing.id and jobs[1].id == jobs[2].id
    assert scalar("SELECT count(*) FROM dbqueue_job") == 3


def test_idempotency_key_race_between_two_transactions():
    """The second inserter waits for the first to commit, then gets the first's job."""
    first_inserted = threading.Event()
    release_first = threading.Event()
    results = {}

    def first():
        with transaction.atomic():
            results["first"] = enqueue("noop", idempotency_key="race")
            first_inserted.set()
            release_first.wait(10)
        connection.close()

    def second():
        first_inserted.wait(10)
        results["second"] = enqueue("noop", idempotency_key="race")
        connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    first_inserted.wait(10)
    # The second is now blocked on the first's uncommitted key: prove it, then let go.
    threads[1].join(0.3)
    assert threads[1].is_alive(), "the second enqueue did not wait for the first transaction"
    release_first.set()
    for t in threads:
        t.join(10)
    assert results["first"].created and not results["second"].created
    assert results["second"].id == results["first"].id
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE idempotency_key = 'race'") == 1


def test_idempotency_key_reusable_when_the_first_transaction_rolls_back():
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue("noop", idempotency_key="rb")
        raise RuntimeError
    assert enqueue("noop", idempotency_key="rb").created


# --- bad input: refused before anything is written ------------------------------------------


def nothing_written():
    return scalar("SELECT count(*) FROM dbqueue_job") == 0


def test_unknown_type_names_it_and_suggests():
    with pytest.raises(UnknownJobType, match=r"unknown job type 'recrod'.*Did you mean 'record'"):
        enqueue("recrod", {})
    assert nothing_written()


def test_payload_error_names_the_path():
    payload = {"items": [{}, {}, {}, {"when": datetime.date(2026, 1, 1)}]}
    with pytest.raises(PayloadError) as info:
        enqueue("noop", payload)
    assert str(info.value).startswith('payload["items"][3]["when"] is a datetime.date')
    assert nothing_written()


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"t": (1, 2)}, 'payload["t"] is a tuple (use a list)'),
        ({1: "a"}, "has a key 1 of type int"),
        ({"x": float("nan")}, 'payload["x"] is nan'),
        ({"s": "a\x00b"}, "NUL character"),
        ({"o": object()}, 'payload["o"] is a builtins.object'),
        ({"set": {1}}, "builtins.set"),
    ],
)
def test_payloads_that_would_not_round_trip(payload, fragment):
    with pytest.raises(
        PayloadError, match=fragment.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        enqueue("noop", payload)
    assert nothing_written()


def test_naive_run_after_refused_under_use_tz():
    with pytest.raises(EnqueueError, match="naive datetime while USE_TZ is on"):
        enqueue("noop", run_after=datetime.datetime(2030, 1, 1))
    assert nothing_written()


@pytest.mark.parametrize("priority", [101, -101, 1.5, True])
def test_priority_out_of_range(priority):
    with pytest.raises(EnqueueError, match="priority"):
        enqueue("noop", priority=priority)
    assert nothing_written()


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"queue": "nope"}, "queue 'nope' is not in DBQUEUE"),
        (
            {"delay": -1},
            "delay must be a number of seconds or a timedelta from 0 to 315360000, got -1",
        ),
        ({"delay": 1, "run_after": timezone.now()}, "run_after or delay, not both"),
        ({"idempotency_key": ""}, "idempotency_key must be a non-empty string"),
        ({"max_attempts": 0}, "max_attempts must be an integer from 1 to 2147483647, got 0"),
        ({"run_after": "tomorrow"}, "run_after must be a datetime"),
    ],
)
def test_bad_options(kwargs, fragment):
    with pytest.raises(EnqueueError, match=fragment):
        enqueue("noop", **kwargs)
    assert nothing_written()


def nested(depth):
    value = {}
    for _ in range(depth):
        value = {"x": value}
    return value


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "fragment"),
    [
        (("noop", {"big": 1e16}), {}, PayloadError, 'payload["big"] is the float 1e+16'),
        (("noop", {"huge": [1e308]}), {}, PayloadError, 'payload["huge"][0] is the float 1e+308'),
        (("noop", {"k\x00": 1}), {}, PayloadError, "has a key 'k\\x00' that contains a NUL"),
        (("noop", {"s": "\ud800"}), {}, PayloadError, 'payload["s"] contains a lone surrogate'),
        (("noop", {"\ud800": 1}), {}, PayloadError, "has a key '\\ud800' that contains a lone"),
        (("noop", nested(10_000)), {}, PayloadError, "nested more than 100 levels deep"),
        (("noop", {"n": 10**5000}), {}, PayloadError, 'payload["n"] is an integer of 5001 digits'),
        (("noop", {"z": [1, -0.0]}), {}, PayloadError, 'payload["z"][1] is -0.0: PostgreSQL'),
        (("noop", -0.0), {}, PayloadError, "payload is -0.0"),
        (("noop",), {"idempotency_key": "a\x00"}, EnqueueError, "idempotency_key 'a\\x00'"),
        (("noop",), {"idempotency_key": "\udc00"}, EnqueueError, "contains a lone surrogate"),
        (("no\udc00op",), {}, EnqueueError, "job type 'no\\udc00op' contains a lone surrogate"),
        ((["noop"],), {}, EnqueueError, "job type must be a non-empty string"),
        ((None,), {}, EnqueueError, "job type must be a non-empty string"),
        (("noop",), {"max_attempts": 2**31}, EnqueueError, "from 1 to 2147483647"),
        (("noop",), {"max_attempts": 10**5000}, EnqueueError, "got an integer of 5001 digits"),
        (("noop",), {"priority": 5.0}, EnqueueError, "priority must be an integer"),
        (("noop",), {"priority": 2**40}, EnqueueError, "priority must be an integer"),
        (("noop",), {"queue": 1.5}, EnqueueError, "queue must be a non-empty string"),
        (("noop",), {"queue": "x" * 101}, EnqueueError, "at most 100 characters"),
        (("noop",), {"delay": float("inf")}, EnqueueError, "delay must be a number of seconds"),
        (("noop",), {"delay": datetime.timedelta(days=10**8)}, EnqueueError, "from 0 to"),
        (("noop",), {"delay": 10**5000}, EnqueueError, "got an integer of 5001 digits"),
    ],
)
def test_inputs_that_reached_the_database_are_refused_by_name(args, kwargs, error, fragment):
    with pytest.raises(error) as caught:
        enqueue(*args, **kwargs)
    assert fragment in str(caught.value)
    with pytest.raises(error) as caught:
        enqueue_many([{"type": args[0], "payload": (args[1:] or [None])[0], **kwargs}])
    assert str(caught.value).startswith("jobs[0]") and fragment in str(caught.value)
    assert nothing_written()


def test_enqueue_many_refuses_what_is_not_a_list_of_jobs():
    with pytest.raises(EnqueueError, match="jobs must be an iterable"):
        enqueue_many(5)
    with pytest.raises(EnqueueError, match=r"jobs\[0\] has unknown keys \[1, 'x'\]"):
        enqueue_many([{"type": "noop", 1: 2, "x": 3}])
    assert nothing_written()


storable = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | storable,
    lambda children: st.lists(children) | st.dictionaries(storable, children),
    max_leaves=20,
)


def same(a, b):
    """Equal and of the same JSON types all the way down (1.0 == 1, but a float that comes back
    an int has changed). Key order is not compared: jsonb does not keep it."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, float):  # -0.0 == 0.0, but a sign that comes back lost has changed
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return a == b


@hypothesis.settings(max_examples=300)
@hypothesis.example({"z": -0.0})
@hypothesis.example([0.0, -1e-300, -5e-324])
@given(json_values)
def test_what_enqueue_accepts_comes_back_from_jsonb_unchanged(value):
    try:
        text = payloads.dumps(value)
    except PayloadError:
        return  # refused, by name: nothing to compare
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::jsonb::text", [text])
        back = json.loads(cursor.fetchone()[0])
    assert same(back, value)


def test_non_postgresql_database_refused():
    with pytest.raises(
        UnsupportedDatabase, match="'sqlite' is sqlite; django-dbqueue needs PostgreSQL"
    ):
        enqueue("noop", using="sqlite")


def test_enqueue_many_validates_every_item_first():
    with pytest.raises(PayloadError, match=r"jobs\[2\]: payload\[\"x\"\]"):
        enqueue_many([("noop", {}), ("noop", {}), ("noop", {"x": {1, 2}})])
    with pytest.raises(UnknownJobType, match=r"jobs\[1\]"):
        enqueue_many([("noop", {}), ("missing", {})])
    with pytest.raises(EnqueueError, match=r"jobs\[0\] has unknown keys \['colour'\]"):
        enqueue_many([{"type": "noop", "colour": "red"}])
    assert nothing_written()


def test_a_types_values_follow_the_settings_they_were_validated_for(settings):
    """enqueue() validates a type's queue, priority, attempts and lease once per settings: a
    change of the settings is seen by the next call, for better or worse."""
    first = enqueue("noop")
    settings.DBQUEUE = {**settings.DBQUEUE, "MAX_ATTEMPTS": 4, "LEASE": 7.0}
    second = enqueue("noop")
    assert (job_row(first.id)["max_attempts"], job_row(second.id)["max_attempts"]) == (10, 4)
    assert job_row(second.id)["lease_seconds"] == 7.0
    settings.DBQUEUE = {**settings.DBQUEUE, "QUEUES": {"emails": {}}}
    with pytest.raises(EnqueueError, match="queue 'default' is not in DBQUEUE"):
        enqueue("noop")
    assert enqueue("noop", queue="emails").queue == "emails"


def test_a_named_queue_is_validated_for_each_settings_and_bad_ones_still_fail(settings):
    """The values of a type on a queue the call names are kept per queue too: a queue that the
    settings drop fails at once, and a queue that is no name fails as before."""
    settings.DBQUEUE = {**settings.DBQUEUE, "QUEUES": {"default": {}, "emails": {}}}
    job = enqueue("noop", queue="emails")
    assert job_row(job.id)["queue"] == "emails" and job_row(job.id)["max_attempts"] == 10
    settings.DBQUEUE = {**settings.DBQUEUE, "QUEUES": {"default": {}}, "MAX_ATTEMPTS": 3}
    with pytest.raises(EnqueueError, match="queue 'emails' is not in DBQUEUE"):
        enqueue("noop", queue="emails")
    assert job_row(enqueue("noop", queue="default").id)["max_attempts"] == 3
    for bad in (["emails"], 5, ""):
        with pytest.raises(EnqueueError, match="queue"):
            enqueue("noop", queue=bad)
    assert scalar("SELECT count(*) FROM dbqueue_job") == 2
