"""enqueue_many()'s batch INSERT binds its ten arrays as array literals (issue 28, the bulk
enqueue's cost; no COPY path ships, benchmarks/results/2026-12-05-enqueue-many.md): every value
arrives as enqueue() of the same job writes it."""

import datetime
import zoneinfo

import pytest
from django.db import connection, transaction

from django_dbqueue import enqueue, enqueue_many, tracing
from tests.utils import Listener, scalar

pytestmark = pytest.mark.django_db(transaction=True)

TEXT = 'tab\there\nline\\back\r"q" {a,b} NULL é \u2028 ☃ \'s'
KOLKATA = zoneinfo.ZoneInfo("Asia/Kolkata")
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def items(tag):
    jobs = []
    for i in range(24):
        item = {"type": ("record", "echo", "email", "noop")[i % 4], "payload": {"i": i, TEXT: TEXT}}
        if i % 5 == 1:
            item.update(queue="emails", priority=-7, max_attempts=3)
        if i % 6 == 2:
            item["delay"] = 90.123457
        if i % 7 == 3:
            item["run_after"] = datetime.datetime(2031, 5, 6, 7, 8, 9, 123457, tzinfo=KOLKATA)
        if i % 8 == 4:
            item["delay"] = datetime.timedelta(seconds=0.000001)
        if i % 9 == 5:
            item["idempotency_key"] = f"{tag}-{TEXT}-{i}"
        if i % 10 == 6:
            item["serial_key"] = f"{tag}-{TEXT}" if i < 20 else 12345678901234567890
        jobs.append(item)
    jobs.append(("noop",))
    jobs.append(("echo", None))
    return jobs


def rows_of(jobs):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT *, run_after - created_at AS wait FROM dbqueue_job WHERE id = ANY(%s) "
            "ORDER BY id",
            [[j.id for j in jobs]],
        )
        names = [c.name for c in cursor.description]
        found = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    for row in found:
        if row["run_after"].year == 2031:
            del row["wait"]  # a given instant: compared itself
        else:
            del row["run_after"]  # the database's now() (+ delay): compared as the wait
        for name in ("id", "created_at"):
            del row[name]
        if row["idempotency_key"]:
            row["idempotency_key"] = row["idempotency_key"].split("-", 1)[1]
        if row["serial_key"] and not row["serial_key"].isdigit():
            row["serial_key"] = row["serial_key"].split("-", 1)[1]
    return found


def one_by_one(jobs):
    result = []
    with transaction.atomic():
        for item in jobs:
            if isinstance(item, dict):
                result.append(
                    enqueue(
                        item["type"],
                        item.get("payload"),
                        **{k: v for k, v in item.items() if k not in ("type", "payload")},
                    )
                )
            else:
                result.append(enqueue(*item))
    return result


def test_batch_rows_equal_the_rows_of_single_enqueues():
    single = one_by_one(items("single"))
    with transaction.atomic():
        batch = enqueue_many(items("batch"))
        now = scalar("SELECT now()")
    assert [j.id for j in batch] == sorted(j.id for j in batch)
    assert rows_of(batch) == rows_of(single)
    assert scalar(
        "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND created_at = %s",
        [[j.id for j in batch], now],
    ) == len(batch)
    given = scalar("SELECT run_after FROM dbqueue_job WHERE id = %s", [batch[3].id])
    assert given == datetime.datetime(2031, 5, 6, 7, 8, 9, 123457, tzinfo=KOLKATA)
    assert (
        scalar("SELECT payload ->> %s FROM dbqueue_job WHERE id = %s", [TEXT, batch[0].id]) == TEXT
    )


def test_batch_under_another_datestyle_and_timezone_and_traced(monkeypatch):
    monkeypatch.setattr(tracing, "current_traceparent", lambda: TRACEPARENT)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL datestyle = 'SQL, DMY'")
            cursor.execute("SET LOCAL timezone = 'Asia/Kolkata'")
        batch = enqueue_many(items("styled"))
    monkeypatch.setattr(tracing, "current_traceparent", lambda: None)
    single = one_by_one(items("plain"))
    styled = rows_of(batch)
    assert [r.pop("traceparent") for r in styled] == [TRACEPARENT] * len(batch)
    for r in rows_of(single):
        assert r.pop("traceparent") is None
    assert styled == [{k: v for k, v in r.items() if k != "traceparent"} for r in rows_of(single)]


def test_batch_of_ten_thousand_in_order_and_one_wakeup_per_queue():
    listener = Listener()
    try:
        with transaction.atomic():
            jobs = enqueue_many([("record", {"i": i}) for i in range(10000)] + [("email", {})])
            assert listener.drain(0.05) == []
        assert sorted(listener.drain(1.0)) == ["10000:default", "1:emails"]
    finally:
        listener.close()
    assert [j.id for j in jobs] == sorted(j.id for j in jobs)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (payload ->> 'i')::int FROM dbqueue_job WHERE queue = 'default' ORDER BY id"
        )
        assert [r[0] for r in cursor.fetchall()] == list(range(10000))
