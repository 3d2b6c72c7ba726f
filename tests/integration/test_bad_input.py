"""Bad input to every public entry point: a named error that says what was wrong, and nothing
written. Each class of mistake is tried against every entry point that can make it (issue 25):
a ``using=`` that names no database, a ``by`` PostgreSQL cannot store, a queue name that is not
a name, and a database that was never migrated."""

import contextlib
import os
import subprocess
import sys

import psycopg
import pytest
from django.core.management import call_command
from django.db import DatabaseError, ProgrammingError, connections, transaction

import django_dbqueue
from django_dbqueue import (
    InvalidArgument,
    NotMigrated,
    UnknownDatabase,
    UnknownQueue,
    cancel,
    chain,
    enqueue,
    enqueue_many,
    group,
    pause_queue,
    resume_queue,
    workflow,
)
from django_dbqueue.connections import connection_params
from tests.utils import scalar

pytestmark = pytest.mark.django_db(transaction=True)


def rows():
    """Every row the entry points below could write."""
    return scalar(
        "SELECT (SELECT count(*) FROM dbqueue_job) + (SELECT count(*) FROM dbqueue_queue)"
    )


def _wf(using):
    wf = workflow()
    wf.add("noop", {})
    return wf.enqueue(using=using)


# Each entry point that takes using=, called with a given using.
ENTRY_POINTS = {
    "enqueue": lambda using: enqueue("noop", {}, using=using),
    "enqueue(depends_on=)": lambda using: enqueue("noop", depends_on=[1], using=using),
    "enqueue(unique_key=)": lambda using: enqueue("noop", unique_key="k", using=using),
    "enqueue_many": lambda using: enqueue_many([("noop", {})], using=using),
    "group": lambda using: group(("noop", {}), then=("noop", {}), using=using),
    "chain": lambda using: chain(("noop", {}), ("noop", {}), using=using),
    "Workflow.enqueue": _wf,
    "cancel": lambda using: cancel([1], using=using),
    "pause_queue": lambda using: pause_queue("default", using=using),
    "resume_queue": lambda using: resume_queue("default", using=using),
    "begin_delivery": lambda using: django_dbqueue.begin_delivery("k", using=using),
    "settle_delivery": lambda using: django_dbqueue.settle_delivery("k", "sent", using=using),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("using", [["default"], b"default", "", "nope"])
def test_a_using_that_names_no_database_is_a_named_error(entry, using):
    with pytest.raises(UnknownDatabase) as caught:
        ENTRY_POINTS[entry](using)
    assert isinstance(caught.value, ValueError)
    message = str(caught.value)
    assert message.startswith("using must be the alias (a str) of a database in DATABASES")
    assert f"got {using!r}" in message and "'default'" in message
    assert rows() == 0
    assert scalar("SELECT count(*) FROM dbqueue_delivery") == 0


# --- pause_queue / resume_queue: the name and who ----------------------------------------------


@pytest.mark.parametrize("switch", [pause_queue, resume_queue])
@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        (
            ["default"],
            "queue must be a non-empty string of at most 100 characters, got ['default']",
        ),
        ({"default": 1}, "queue must be a non-empty string"),
        (None, "queue must be a non-empty string"),
        ("de\x00fault", "queue 'de\\x00fault' contains a NUL character"),
        ("x" * 101, "at most 100 characters"),
        ("nope", "queue 'nope' is not in DBQUEUE['QUEUES'] (known: default, emails)"),
    ],
)
def test_a_bad_queue_name_is_unknown_queue_naming_it(switch, name, fragment):
    with pytest.raises(UnknownQueue) as caught:
        switch(name, by="ops")
    assert isinstance(caught.value, ValueError) and fragment in str(caught.value)
    assert rows() == 0


@pytest.mark.parametrize("switch", [pause_queue, resume_queue])
@pytest.mark.parametrize(
    ("by", "fragment"),
    [
        ("ops\x00", "by 'ops\\x00' contains a NUL character (\\x00), which PostgreSQL cannot"),
        ("ops\udcff", "by 'ops\\udcff' contains a lone surrogate ('\\udcff' at index 3)"),
        ("x" * 100_000, "by must be a non-empty string of at most 200 characters, got 'xxx"),
        ("x" * 201, "at most 200 characters"),
        (["ops"], "by must be a non-empty string of at most 200 characters, got ['ops']"),
        (5, "got 5"),
        (0, "got 0"),
        (b"ops", "got b'ops'"),
    ],
)
def test_a_bad_by_is_refused_naming_it_and_nothing_changes(switch, by, fragment):
    with pytest.raises(InvalidArgument) as caught:
        switch("default", by=by)
    assert isinstance(caught.value, ValueError)
    assert str(caught.value).startswith(f"{switch.__name__}() by") and fragment in str(caught.value)
    assert rows() == 0


def test_the_same_by_mistake_reads_the_same_in_cancel_and_pause():
    for call, label in (
        (lambda by: cancel([1], by=by), "cancel"),
        (lambda by: pause_queue("default", by=by), "pause_queue"),
    ):
        with pytest.raises(InvalidArgument) as caught:
            call("a\x00")
        assert str(caught.value) == (
            f"{label}() by 'a\\x00' contains a NUL character (\\x00), which PostgreSQL cannot "
            "store in text"
        )
    assert rows() == 0


def test_a_good_by_is_recorded_and_an_empty_one_is_the_default():
    pause_queue("default", by="x" * 200)
    assert scalar("SELECT changed_by FROM dbqueue_queue WHERE name = 'default'") == "x" * 200
    resume_queue("default")
    assert scalar("SELECT changed_by FROM dbqueue_queue WHERE name = 'default'") == ""
    pause_queue("default", by=None)  # None is "nobody said", as cancel() reads it
    assert scalar("SELECT changed_by FROM dbqueue_queue WHERE name = 'default'") == ""


def run_command(*args):
    """``manage.py`` in a subprocess, on this test's database, with ``args`` as given (bytes
    reach argv undecoded)."""
    params = connection_params("default")
    url = (
        f"postgres://{params.get('user', 'postgres')}@{params.get('host', '127.0.0.1')}:"
        f"{params.get('port', 5432)}/{connections['default'].settings_dict['NAME']}"
    )
    return subprocess.run(
        [sys.executable, "-m", "django", *args, "--settings", "tests.settings"],
        capture_output=True,
        timeout=120,
        env={**os.environ, "DATABASE_URL": url},
    )


@pytest.mark.parametrize("action", ["pause", "resume"])
def test_the_command_refuses_an_undecodable_by_with_a_usage_error(action):
    result = run_command("jobqueue_queue", action, "default", "--by", b"ops\xff\xfe")
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2, stderr
    assert "usage:" in stderr and "argument --by:" in stderr
    assert "contains a lone surrogate ('\\udcff' at index 3), which is not valid UTF-8" in stderr
    assert "Traceback" not in stderr
    assert rows() == 0


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--by", "x" * 201], "argument --by: must be a non-empty string of at most 200"),
        (["--by", "a\x00"], "argument --by: 'a\\x00' contains a NUL character"),
        (["--by", ""], "argument --by: must be a non-empty string"),
    ],
)
def test_the_command_refuses_a_bad_by_with_a_usage_error(args, fragment):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=fragment.replace("\\", "\\\\").replace("(", r"\(")):
        call_command("jobqueue_queue", "pause", "default", *args)
    assert rows() == 0


def test_the_command_refuses_an_undecodable_queue_name_with_a_usage_error():
    result = run_command("jobqueue_queue", "pause", b"def\xffault")
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2, stderr
    assert "argument name:" in stderr and "lone surrogate" in stderr
    assert "Traceback" not in stderr
    assert rows() == 0


# --- a database never migrated ------------------------------------------------------------


@pytest.fixture
def bare():
    """A database alias, ``"bare"``, of a PostgreSQL database that was never migrated; with one
    table of the project's own (``shop``), to prove the caller's own writes roll back too."""
    name = f"{os.environ.get('DBQUEUE_TEST_DATABASE', 'test_dbqueue')}_bare_api"
    admin = psycopg.connect(
        **{**connection_params("default"), "dbname": "postgres"}, autocommit=True
    )
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.execute(f'CREATE DATABASE "{name}"')
    with psycopg.connect(**{**connection_params("default"), "dbname": name}, autocommit=True) as db:
        db.execute("CREATE TABLE shop (id serial PRIMARY KEY)")
    connections.settings["bare"] = {**connections.settings["default"], "NAME": name}
    # connect() directly: the test case allows only "default" through ensure_connection(), and
    # lets an established connection be.
    connections["bare"].connect()
    try:
        yield "bare"
    finally:
        connections["bare"].close()
        with contextlib.suppress(AttributeError, KeyError):
            del connections["bare"]
        del connections.settings["bare"]
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def shop_rows(using):
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM shop")
        return cursor.fetchone()[0]


MIGRATE = "Run `python manage.py migrate --database bare`."


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_every_entry_point_on_a_database_never_migrated_says_run_migrate(bare, entry):
    with pytest.raises(NotMigrated) as caught:
        ENTRY_POINTS[entry](bare)
    message = str(caught.value)
    assert message.startswith("database 'bare' has no dbqueue_job, dbqueue_dependency, ")
    assert "dbqueue_delivery" in message
    assert "dbqueue_queue" in message and MIGRATE in message and "Nothing was written." in message
    assert "aborted" not in message  # autocommit: no transaction of the caller's to abort
    assert isinstance(caught.value, ProgrammingError)  # what it was before it had a name
    # The connection is usable at once (the failed statement ended its own transaction).
    assert shop_rows(bare) == 0


@pytest.mark.parametrize("entry", ["enqueue", "enqueue_many", "group", "pause_queue", "cancel"])
def test_inside_atomic_it_says_the_transaction_is_aborted_and_the_callers_writes_roll_back(
    bare, entry
):
    with pytest.raises(NotMigrated) as caught, transaction.atomic(using=bare):
        with connections[bare].cursor() as cursor:
            cursor.execute("INSERT INTO shop DEFAULT VALUES")
        ENTRY_POINTS[entry](bare)
    message = str(caught.value)
    assert "has no dbqueue_job" in message and MIGRATE in message
    assert "aborted the transaction open on this connection" in message
    assert shop_rows(bare) == 0  # the caller's own write rolled back with the transaction


@pytest.mark.parametrize("entry", ["begin_delivery", "settle_delivery"])
def test_a_delivery_inside_atomic_says_migrate_and_leaves_the_callers_transaction_alone(
    bare, entry
):
    # A delivery record is written on a connection of its own: the caller's transaction did
    # not run the failed statement, is not aborted, and the message does not say it is.
    with transaction.atomic(using=bare):
        with connections[bare].cursor() as cursor:
            cursor.execute("INSERT INTO shop DEFAULT VALUES")
        with pytest.raises(NotMigrated) as caught:
            ENTRY_POINTS[entry](bare)
        assert "has no dbqueue_job" in str(caught.value) and MIGRATE in str(caught.value)
        assert "aborted" not in str(caught.value)
        assert shop_rows(bare) == 1  # still usable
    assert shop_rows(bare) == 1  # and it committed


def test_a_caller_that_catches_it_inside_atomic_finds_the_transaction_aborted(bare):
    with transaction.atomic(using=bare):
        with pytest.raises(NotMigrated, match="aborted"):
            enqueue("noop", {}, using=bare)
        with pytest.raises(DatabaseError, match="current transaction is aborted"):
            shop_rows(bare)
        transaction.set_rollback(True, using=bare)
    assert shop_rows(bare) == 0


def test_a_database_migrated_to_an_older_release_names_what_is_missing(bare):
    call_command("migrate", "django_dbqueue", "0009", database=bare, verbosity=0)
    # 0010 made dbqueue_queue and dbqueue_limiter: pausing names them, among the tables of later
    # migrations (in the order of the package's models).
    with pytest.raises(NotMigrated) as missing:
        pause_queue("default", using=bare)
    message = str(missing.value)
    assert message.startswith("database 'bare' has no "), message
    named = message.removeprefix("database 'bare' has no ").split(" tables:")[0].split(", ")
    assert {"dbqueue_queue", "dbqueue_limiter"} <= set(named), message
    # Every table there, but a column missing (0011's, as its migration is recorded unapplied):
    # a unique job meets it, and the migrations are named.
    call_command("migrate", "django_dbqueue", database=bare, verbosity=0)
    with connections[bare].cursor() as cursor:
        cursor.execute("ALTER TABLE dbqueue_job DROP COLUMN unique_key CASCADE")
        cursor.execute(
            "DELETE FROM django_migrations WHERE app = 'django_dbqueue' "
            "AND name = '0011_unique_and_serial'"
        )
    with pytest.raises(NotMigrated) as caught:
        enqueue("noop", {}, unique_key="k", using=bare)
    assert str(caught.value).startswith(
        "database 'bare' lacks django-dbqueue's migration 0011_unique_and_serial:"
    ), str(caught.value)
    assert MIGRATE in str(caught.value)
    with connections[bare].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM dbqueue_job")
        assert cursor.fetchone()[0] == 0


def test_another_programming_error_is_left_as_it_was(bare, monkeypatch):
    # Only a missing table, column or function of a database that lacks the package's
    # migrations becomes NotMigrated; any other error is the database's own.
    from django_dbqueue import store

    def broken(using, **kwargs):
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT * FROM no_such_table_of_anyone")

    call_command("migrate", "django_dbqueue", database=bare, verbosity=0)
    monkeypatch.setattr(store, "insert_job", broken)
    with pytest.raises(ProgrammingError) as caught:
        enqueue("noop", {}, using=bare)
    assert type(caught.value) is ProgrammingError and "no_such_table_of_anyone" in str(caught.value)


# --- free text kept for the record: a delivery's reference and error --------------------


def delivery_row(key):
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT state, provider_reference, error FROM dbqueue_delivery WHERE key = %s", [key]
        )
        return cursor.fetchone()


@pytest.mark.parametrize(
    ("reference", "fragment"),
    [
        ("ref\x00", "delivery reference 'ref\\x00' contains a NUL character"),
        ("ref\udcff", "delivery reference 'ref\\udcff' contains a lone surrogate"),
        ("r" * 301, "delivery reference must be a non-empty string of at most 300 characters"),
    ],
)
def test_a_reference_postgresql_cannot_store_is_refused_and_the_record_stays(reference, fragment):
    from django_dbqueue import begin_delivery, settle_delivery

    delivery = begin_delivery("sms:1")
    with pytest.raises(InvalidArgument) as caught:
        delivery.sent(reference)
    assert fragment in str(caught.value)
    with pytest.raises(InvalidArgument) as caught:
        settle_delivery("sms:1", "sent", reference=reference)
    assert fragment in str(caught.value)
    assert delivery_row("sms:1") == ("recorded", "", "")  # unknown outcome, for a person


def test_a_failure_text_postgresql_cannot_store_is_kept_escaped():
    from django_dbqueue import begin_delivery, settle_delivery

    assert begin_delivery("sms:2").failed("refused \x00 b'\udcff'")
    assert delivery_row("sms:2") == ("failed", "", "refused \\x00 b'\\udcff'")
    begin_delivery("sms:3")
    assert settle_delivery("sms:3", "failed", error="x\x00")
    assert delivery_row("sms:3") == ("failed", "", "x\\x00")
