"""System checks: each id fires on the misconfiguration it names, with a hint."""

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_dbqueue import job, registry
from django_dbqueue.checks import check_settings


def ids(settings_value, settings):
    settings.DBQUEUE = settings_value
    return [(m.id, m.msg, m.hint) for m in check_settings()]


def test_defaults_are_clean(settings):
    assert ids({"QUEUES": {"default": {}, "emails": {}}}, settings) == []


def test_e001_not_a_dict(settings):
    ((id_, msg, hint),) = ids(["default"], settings)
    assert id_ == "dbqueue.E001" and "must be a dict" in msg and hint


def test_e002_unknown_key_suggests_the_close_match(settings):
    ((id_, msg, hint),) = ids({"QUEUES": {"default": {}, "emails": {}}, "CONCURENCY": 4}, settings)
    assert id_ == "dbqueue.E002" and "'CONCURENCY'" in msg and hint == "Did you mean 'CONCURRENCY'?"


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("CONCURRENCY", 0, "an integer >= 1"),
        ("CONCURRENCY", "8", "an integer >= 1"),
        ("POLL_INTERVAL", -1, "seconds > 0"),
        ("MAX_ATTEMPTS", 1.5, "an integer from 1 to 2147483647"),
        ("MAX_ATTEMPTS", 2**31, "an integer from 1 to 2147483647"),
        ("DEFAULT_QUEUE", "a\x00", "a queue name"),
        ("LISTEN", "yes", "True or False"),
        ("WAKEUP_IF_WAITING", 1, "True or False"),
        ("QUEUES", [], "non-empty dict"),
        ("NOTIFY_CHANNEL", "x" * 64, "1 to 63 bytes in UTF-8"),
        ("NOTIFY_CHANNEL", "é" * 32, "1 to 63 bytes in UTF-8"),  # 32 characters, 64 bytes
        ("WAKEUP_WINDOW", -0.001, "seconds >= 0, at most 60"),
        ("WAKEUP_WINDOW", 61, "seconds >= 0, at most 60"),
        ("WAKEUP_WINDOW", "5ms", "seconds >= 0, at most 60"),
    ],
)
def test_e003_wrong_type_or_range(key, value, fragment, settings):
    found = ids({"QUEUES": {"default": {}, "emails": {}}, key: value}, settings)
    assert [i for i, _, _ in found] == ["dbqueue.E003"]
    assert fragment in found[0][1] and key in found[0][1]


def test_e003_a_queue_name_postgresql_cannot_store(settings):
    found = ids({"QUEUES": {"default": {}, "emails": {}, "x\udc00": {}}}, settings)
    assert [i for i, _, _ in found] == ["dbqueue.E003"]
    assert "a queue name 'x\\udc00' contains a lone surrogate" in found[0][1]


def test_e003_bad_queue_options(settings):
    found = ids({"QUEUES": {"default": {"concurrency": 0}, "emails": {"speed": 1}}}, settings)
    assert sorted(i for i, _, _ in found) == ["dbqueue.E002", "dbqueue.E003"]


def test_e004_lease_not_longer_than_heartbeat_and_w001_too_close(settings):
    found = ids(
        {"QUEUES": {"default": {}, "emails": {}}, "LEASE": 5, "HEARTBEAT_INTERVAL": 10}, settings
    )
    assert [i for i, _, _ in found] == ["dbqueue.E004"]
    found = ids(
        {"QUEUES": {"default": {}, "emails": {}}, "LEASE": 15, "HEARTBEAT_INTERVAL": 10}, settings
    )
    assert [i for i, _, _ in found] == ["dbqueue.W001"]


def test_e004_for_a_job_types_lease(settings):
    job("short-lease", lease=1)(lambda ctx: None)
    try:
        found = ids({"QUEUES": {"default": {}, "emails": {}}}, settings)
        assert [i for i, _, _ in found] == ["dbqueue.E004"] and "'short-lease'" in found[0][1]
    finally:
        registry.unregister("short-lease")


def test_e005_not_postgresql(settings):
    found = ids({"QUEUES": {"default": {}, "emails": {}}, "DATABASE": "sqlite"}, settings)
    assert [i for i, _, _ in found] == ["dbqueue.E005"] and "needs PostgreSQL" in found[0][1]
    found = ids({"QUEUES": {"default": {}, "emails": {}}, "DATABASE": "nope"}, settings)
    assert [i for i, _, _ in found] == ["dbqueue.E005"]


def test_e006_type_queue_not_configured(settings):
    found = ids({"QUEUES": {"default": {}}}, settings)  # testapp's "email" type uses "emails"
    assert [i for i, _, _ in found] == ["dbqueue.E006"] and "'email'" in found[0][1]


@pytest.mark.django_db  # on Django 6.1, --tag also selects the database check W003
def test_manage_py_check_fails_on_bad_settings(settings):
    settings.DBQUEUE = {"QUEUES": {"default": {}, "emails": {}}, "LEASE": "long"}
    with pytest.raises(SystemCheckError, match=r"dbqueue.E003"):
        call_command("check", tag=["dbqueue"])  # the other apps' checks are not ours to test


def test_w002_atomic_type_with_a_long_or_no_timeout(settings):
    job("atomic-forever", atomic=True)(lambda ctx: None)
    job("atomic-long", atomic=True, timeout=600)(lambda ctx: None)
    try:
        found = ids({"QUEUES": {"default": {}, "emails": {}}}, settings)
        assert [i for i, _, _ in found] == ["dbqueue.W002", "dbqueue.W002"]
        assert "allows no timeout" in found[0][1] and "timeout=600s" in found[1][1]
        hint = found[0][2]
        assert "A timeout does not end the transaction" in hint and "statement_timeout" in hint
    finally:
        registry.unregister("atomic-forever")
        registry.unregister("atomic-long")


@pytest.mark.parametrize("key", ["POLL_INTERVAL", "DONE_RETENTION", "BACKOFF_CAP", "LEASE"])
def test_e003_infinite_numbers_are_refused(key, settings):
    found = ids({"QUEUES": {"default": {}, "emails": {}}, key: float("inf")}, settings)
    assert "dbqueue.E003" in [i for i, _, _ in found]


def test_e008_cron_that_never_fires(settings):
    settings.DBQUEUE = {
        "QUEUES": {"default": {}, "emails": {}},
        "SCHEDULE": {"leap": {"cron": "0 0 30 2 *", "type": "noop"}},
    }
    found = [(m.id, m.msg) for m in check_settings()]
    assert [i for i, _ in found] == ["dbqueue.E008"] and "never comes due" in found[0][1]


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("CONCURRENCY", 10**20, "an integer >= 1, at most 1000, got 100000000000000000000"),
        pytest.param(
            "CONCURRENCY",
            10**400,
            "an integer >= 1, at most 1000, got an integer of 401 digits",
            id="CONCURRENCY-10**400",
        ),
        ("CONCURRENCY", 1001, "at most 1000, got 1001"),
        ("PREFETCH", 10**9, "an integer >= 0, at most 315360000, or None (adaptive)"),
        ("POLL_INTERVAL", 1e300, "a number of seconds > 0, at most 315360000, got 1e+300"),
        ("SWEEP_BATCH", 10**12, "an integer >= 1, at most 315360000"),
        ("DONE_RETENTION", 10**10, "seconds >= 0, at most 315360000, or None (keep)"),
        ("HUNG_THREAD_LIMIT", 10**9, "or None (the concurrency)"),
        ("LEASE", 86401, "a number of seconds > 0, at most 86400"),
    ],
)
def test_e003_states_the_upper_bound_it_enforces(key, value, fragment, settings):
    # A number past the bound is refused by a message that says what the bound is; an integer
    # too large for a float is refused, not an OverflowError from the check itself.
    found = ids({"QUEUES": {"default": {}, "emails": {}}, key: value}, settings)
    assert [i for i, _, _ in found] == ["dbqueue.E003"]
    assert f"DBQUEUE['{key}'] must be" in found[0][1] and fragment in found[0][1]


@pytest.mark.parametrize("value", [1001, 10**20, 10**400], ids=["1001", "10**20", "10**400"])
def test_e003_a_queues_concurrency_states_its_bound(value, settings):
    found = ids({"QUEUES": {"default": {"concurrency": value}, "emails": {}}}, settings)
    assert [i for i, _, _ in found] == ["dbqueue.E003"]
    assert "['concurrency'] must be an integer >= 1, at most 1000, or None, got" in found[0][1]


def test_the_bound_of_concurrency_is_the_commands_bound():
    from django_dbqueue import validation
    from django_dbqueue.management.arguments import MAX_CONCURRENCY

    assert MAX_CONCURRENCY == validation.MAX_CONCURRENCY == 1000


@pytest.mark.django_db
def test_w005_names_who_may_create_objects_in_the_schemas_of_the_tables_and_the_doors():
    """A database check: silent without --database, and while only the owners may create
    objects in public and dbqueue; then it names every other role, PUBLIC included."""
    from django.db import connection

    from django_dbqueue.checks import check_schema_writers

    assert check_schema_writers() == []
    assert check_schema_writers(databases=["default"]) == []
    with connection.cursor() as cursor:
        cursor.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
        cursor.execute("GRANT CREATE ON SCHEMA dbqueue TO PUBLIC")
    try:
        found = check_schema_writers(databases=["default"])
    finally:
        with connection.cursor() as cursor:
            cursor.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
            cursor.execute("REVOKE CREATE ON SCHEMA dbqueue FROM PUBLIC")
    assert [(w.id, w.msg.split(" may")[0]) for w in found] == [
        ("dbqueue.W005", "PUBLIC"),
        ("dbqueue.W005", "PUBLIC"),
    ]
    assert "schema 'dbqueue', which holds django-dbqueue's SQL doors" in found[0].msg
    assert "schema 'public', which holds django-dbqueue's tables" in found[1].msg
    assert found[1].hint.startswith("REVOKE CREATE ON SCHEMA public FROM PUBLIC;")
