"""The shared validators: one wording per mistake, whoever makes it."""

import datetime

import pytest

from django_dbqueue import validation
from django_dbqueue.exceptions import EnqueueError


class Custom(ValueError):
    pass


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: validation.priority(5.0),
            "priority must be an integer from -100 to 100 (higher runs first), got 5.0",
        ),
        (
            lambda: validation.priority(True),
            "priority must be an integer from -100 to 100 (higher runs first), got True",
        ),
        (
            lambda: validation.max_attempts(2**31),
            "max_attempts must be an integer from 1 to 2147483647, got 2147483648",
        ),
        (
            lambda: validation.max_attempts(10**5000),
            "max_attempts must be an integer from 1 to 2147483647, got an integer of 5001 digits",
        ),
        (
            lambda: validation.queue_name(""),
            "queue must be a non-empty string of at most 100 characters, got ''",
        ),
        (
            lambda: validation.queue_name(1.5),
            "queue must be a non-empty string of at most 100 characters, got 1.5",
        ),
        (
            lambda: validation.key("a\x00b"),
            "idempotency_key 'a\\x00b' contains a NUL character (\\x00), which PostgreSQL cannot "
            "store in text",
        ),
        (
            lambda: validation.type_name("x\udfff"),
            "job type name 'x\\udfff' contains a lone surrogate ('\\udfff' at index 1), which is "
            "not valid UTF-8",
        ),
        (
            lambda: validation.type_name(["a"]),
            "job type name must be a non-empty string of at most 200 characters, got ['a']",
        ),
        (
            lambda: validation.seconds(float("inf"), "delay"),
            "delay must be a number of seconds or a timedelta from 0 to 315360000, got inf",
        ),
        (
            lambda: validation.seconds(float("nan"), "delay"),
            "delay must be a number of seconds or a timedelta from 0 to 315360000, got nan",
        ),
        (
            lambda: validation.seconds(datetime.timedelta(days=999_999_999), "delay"),
            "delay must be a number of seconds or a timedelta from 0 to 315360000, got "
            "86399999913600.0",
        ),
        (
            lambda: validation.seconds(0, "lease", positive=True, maximum=86400, timedelta=False),
            "lease must be a number of seconds greater than 0 and at most 86400, got 0",
        ),
    ],
)
def test_each_mistake_has_one_wording(call, message):
    with pytest.raises(ValueError) as caught:
        call()
    assert str(caught.value) == message


def test_the_caller_chooses_the_error_class_and_the_label():
    with pytest.raises(Custom, match=r"^@job\('x'\): priority must be an integer"):
        validation.priority(101, "@job('x'): priority", error=Custom)
    with pytest.raises(EnqueueError):
        validation.key("", error=EnqueueError)


def test_valid_values_come_back_normalised():
    assert validation.seconds(datetime.timedelta(minutes=1), "delay") == 60.0
    assert validation.seconds(3, "delay") == 3.0
    assert validation.max_attempts(2**31 - 1) == 2**31 - 1
    assert validation.priority(-100) == -100
    assert validation.key("k" * 300) == "k" * 300
    assert validation.queue_name("é-queue") == "é-queue"


def test_shown_never_raises():
    deep = []
    for _ in range(100_000):
        deep = [deep]
    assert validation.shown(deep)  # reprlib stops at its level limit
    assert validation.shown(10**10_000) == "an integer of 10001 digits"
    assert len(validation.shown("x" * 10_000)) < 80


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: validation.unique_while("running"),
            "unique_while must be 'pending' or 'active', got 'running'",
        ),
        (
            lambda: validation.unique_while(["pending"]),
            "unique_while must be 'pending' or 'active', got ['pending']",
        ),
        (
            lambda: validation.job_key(1.0, "serial_key"),
            "serial_key must be a str or an int, got float 1.0",
        ),
        (
            lambda: validation.job_key(True, "serial_key"),
            "serial_key must be a str or an int, got bool True",
        ),
        (
            lambda: validation.job_key(10**400, "unique_key"),
            "unique_key must be at most 300 characters, got an integer of 401 digits",
        ),
        (
            lambda: validation.job_key("a\x00b", "unique_key"),
            "unique_key 'a\\x00b' contains a NUL character",
        ),
    ],
)
def test_flow_control_keys_and_modes(call, message):
    with pytest.raises(ValueError) as excinfo:
        call()
    assert str(excinfo.value).startswith(message)


def test_keys_accept_str_and_int():
    assert validation.job_key(42, "serial_key") == "42"
    assert validation.job_key("acct:1", "serial_key") == "acct:1"
    assert validation.unique_while("pending") == "pending"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "by must be a non-empty string of at most 200 characters, got ''"),
        ("x" * 100_000, "by must be a non-empty string of at most 200 characters, got 'xxxxxx"),
        (["ops"], "by must be a non-empty string of at most 200 characters, got ['ops']"),
        ("o\x00ps", "by 'o\\x00ps' contains a NUL character (\\x00), which PostgreSQL cannot"),
        ("op\udcff", "by 'op\\udcff' contains a lone surrogate ('\\udcff' at index 2), which"),
    ],
)
def test_who_did_it_is_text_postgresql_can_store(value, message):
    # One rule for cancel()'s, pause_queue()'s and the command's --by: one wording.
    with pytest.raises(ValueError) as caught:
        validation.by(value)
    assert str(caught.value).startswith(message)
    assert validation.by("x" * 200) == "x" * 200


UTC_MINUS_14 = datetime.timezone(datetime.timedelta(hours=-14))
UTC_PLUS_14 = datetime.timezone(datetime.timedelta(hours=14))


def test_the_timestamp_range_is_pythons_less_a_day_at_each_end():
    """The SQL doors compare with these very values (the i35 SQL branch tests that)."""
    assert datetime.datetime(1, 1, 2, tzinfo=datetime.UTC) == validation.TIMESTAMP_MIN
    assert datetime.datetime(9999, 12, 30, tzinfo=datetime.UTC) == validation.TIMESTAMP_MAX
    # Each edge can be shown in any time zone without leaving Python's range.
    for edge in (validation.TIMESTAMP_MIN, validation.TIMESTAMP_MAX):
        for zone in (UTC_MINUS_14, UTC_PLUS_14):
            assert edge.astimezone(zone).astimezone(datetime.UTC) == edge


@pytest.mark.parametrize(
    "value",
    [
        validation.TIMESTAMP_MIN,
        validation.TIMESTAMP_MAX,
        validation.TIMESTAMP_MAX.astimezone(UTC_MINUS_14),
        datetime.datetime(2030, 1, 1, tzinfo=UTC_PLUS_14),
    ],
)
def test_a_timestamp_in_the_range_comes_back_as_it_is(value):
    assert validation.timestamp(value, "run_after") is value


@pytest.mark.parametrize(
    ("value", "got"),
    [
        (datetime.datetime.max.replace(tzinfo=UTC_MINUS_14), "9999-12-31T23:59:59.999999-14:00"),
        (datetime.datetime.min.replace(tzinfo=UTC_PLUS_14), "0001-01-01T00:00:00+14:00"),
        (
            validation.TIMESTAMP_MAX + datetime.timedelta(microseconds=1),
            "9999-12-30T00:00:00.000001+00:00",
        ),
    ],
)
def test_a_timestamp_out_of_the_range_is_named_never_an_overflow(value, got):
    with pytest.raises(Custom) as caught:
        validation.timestamp(value, "run_after", error=Custom)
    assert str(caught.value) == (
        "run_after must be from 0001-01-02T00:00:00+00:00 to 9999-12-30T00:00:00+00:00 (UTC, "
        f"inclusive: what Python reads back and shows in any time zone), got {got}"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (datetime.datetime(2030, 1, 1), "run_after must be an aware datetime (with its time zone)"),
        (datetime.date(2030, 1, 1), "run_after must be an aware datetime, got datetime.date("),
        ("2030-01-01", "run_after must be an aware datetime, got '2030-01-01'"),
    ],
)
def test_a_timestamp_that_is_not_an_aware_datetime_is_named(value, message):
    with pytest.raises(ValueError, match=f"^{message[:30]}"):
        validation.timestamp(value, "run_after")


def test_a_producer_key_is_not_one_of_the_packages_own():
    for reserved in ["dbqueue:event:7:x", "dbqueue-schedule:a:b", "dbqueue-"]:
        with pytest.raises(EnqueueError, match="reserved for the keys of the package's own jobs"):
            validation.producer_key(reserved, error=EnqueueError)
        made = validation.producer_key(validation.PackageKey(reserved))
        assert made == reserved and type(made) is str  # the package's own, as a plain str
    for mine in ["dbqueue", "Dbqueue:1", "x-dbqueue:1", "invoice-email:42"]:
        assert validation.producer_key(mine) == mine
    with pytest.raises(ValueError, match="non-empty string"):
        validation.producer_key("")
