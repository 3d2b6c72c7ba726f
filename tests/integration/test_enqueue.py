"""enqueue(): transactions, notifications, idempotency, and every refusal of bad input."""

import datetime
import select
import threading

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_dbqueue import (
    EnqueueError,
    PayloadError,
    UnknownJobType,
    UnsupportedDatabase,
    enqueue,
    enqueue_many,
)
from django_dbqueue.connections import connection_params
from tests.testapp.models import Invoice
from tests.utils import job_row, scalar

pytestmark = pytest.mark.django_db(transaction=True)


class Listener:
    """A plain psycopg connection that LISTENs, to see exactly what workers would see."""

    def __init__(self):
        self.conn = psycopg.connect(**connection_params("default"), autocommit=True)
        self.conn.execute("LISTEN dbqueue")

    def drain(self, timeout):
        got = []
        select.select([self.conn.fileno()], [], [], timeout)
        self.conn.pgconn.consume_input()
        while (n := self.conn.pgconn.notifies()) is not None:
            got.append(n.extra.decode())
        return got

    def close(self):
        self.conn.close()


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


def test_enqueue_is_one_round_trip_and_the_wake_up_one_more_after_the_commit():
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        enqueue("noop", {"x": 1})
        enqueue("noop", {"x": 2})
        in_transaction = [q["sql"] for q in queries if q["sql"] not in ("BEGIN", "COMMIT")]
        assert len(in_transaction) == 2  # one INSERT each, no notification among them
    after = [q["sql"] for q in queries][len(in_transaction) :]
    assert [sql for sql in after if "pg_notify" in sql] == [after[-1]]  # one, after COMMIT


def test_enqueue_many_one_statement_in_order_and_one_notification(listener):
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        jobs = enqueue_many([("record", {"i": i}) for i in range(50)] + [("email", {})])
    statements = [q["sql"] for q in queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert len(statements) == 2, statements  # the INSERT, then one wake-up after the commit
    assert "pg_notify" not in statements[0] and "pg_notify" in statements[1]
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
        ({"delay": -1}, "delay must not be negative"),
        ({"delay": 1, "run_after": timezone.now()}, "run_after or delay, not both"),
        ({"idempotency_key": ""}, "idempotency_key must be a non-empty string"),
        ({"max_attempts": 0}, "max_attempts must be an integer >= 1"),
        ({"run_after": "tomorrow"}, "run_after must be a datetime"),
    ],
)
def test_bad_options(kwargs, fragment):
    with pytest.raises(EnqueueError, match=fragment):
        enqueue("noop", **kwargs)
    assert nothing_written()


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
