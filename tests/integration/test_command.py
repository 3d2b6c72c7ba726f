"""run_jobqueue argument validation (the worker itself is exercised by the acceptance tests)."""

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_dbqueue import enqueue
from tests.utils import scalar


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--concurrency", "0"], "argument --concurrency: must be at least 1, got 0"),
        (["--concurrency", "many"], "argument --concurrency: must be a whole number"),
        (["--poll-interval", "-1"], "argument --poll-interval: must be greater than 0"),
        (["--max-jobs", "x"], "argument --max-jobs: must be a whole number"),
        (["--queues", "nope"], "argument --queues: names 'nope', not in DBQUEUE"),
        (["--queues", ","], "argument --queues: needs at least one queue name"),
        (["--queues", ""], "argument --queues: needs at least one queue name, got ''"),
        (["--poll-interval", "inf"], "argument --poll-interval: must be a finite number"),
        (["--poll-interval", "nan"], "argument --poll-interval: must be a finite number"),
        (["--poll-interval", "1e300"], "argument --poll-interval: must be a finite number"),
        (["--concurrency", "100000"], "argument --concurrency: must be at most 1000"),
        (["--processes", "100000"], "argument --processes: must be at most 256"),
        (["--max-jobs", "9" * 5000], "argument --max-jobs: must be a whole number"),
    ],
)
def test_bad_arguments_are_usage_errors(args, fragment):
    with pytest.raises(CommandError, match=fragment):
        call_command("run_jobqueue", *args)


@pytest.mark.parametrize(
    ("command", "args", "fragment"),
    [
        ("jobqueue_requeue", ["--dead", "--type", ""], "argument --type: must be a non-empty"),
        ("jobqueue_requeue", ["--dead", "--queue", ""], "argument --queue: must be a non-empty"),
        ("jobqueue_requeue", ["--dead", "--type", "a\x00"], "contains a NUL character"),
        ("jobqueue_requeue", ["--ids", str(2**63)], "argument --ids: must be at most"),
        ("jobqueue_status", ["--fail-on-oldest-pending", "inf"], "must be a finite number"),
    ],
)
def test_operator_commands_refuse_bad_arguments(command, args, fragment):
    with pytest.raises(CommandError, match=fragment):
        call_command(command, *args)


@pytest.mark.parametrize(
    "command", [["jobqueue_status"], ["jobqueue_requeue", "--dead"], ["run_jobqueue", "--burst"]]
)
def test_a_non_postgresql_queue_database_is_a_clear_error_even_without_checks(command, settings):
    settings.DBQUEUE = {"QUEUES": {"default": {}, "emails": {}}, "DATABASE": "sqlite"}
    with pytest.raises(CommandError, match="database 'sqlite' is sqlite; django-dbqueue needs"):
        call_command(*command, skip_checks=True)


def test_bad_argument_on_the_command_line_prints_usage_and_exits_2():
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "django",
            "run_jobqueue",
            "--settings",
            "tests.settings",
            "--concurrency",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert (
        "usage:" in result.stderr
        and "argument --concurrency: must be at least 1, got 0" in result.stderr
    )


@pytest.mark.django_db(transaction=True)
def test_burst_run_through_the_command(capsys, settings):
    settings.DBQUEUE = {"QUEUES": {"default": {}, "emails": {}}, "STATUS_INTERVAL": 0}
    enqueue("noop")
    enqueue("email")
    call_command("run_jobqueue", "--burst", "--queues", "emails")
    out = capsys.readouterr().out
    assert "dbqueue starting: queues=emails" in out and "burst" in out
    assert "1 succeeded" in out
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'pending'") == 1


@pytest.fixture
def bare_database():
    """A PostgreSQL database that was never migrated; its URL."""
    import os

    import psycopg

    from django_dbqueue.connections import connection_params

    name = f"{os.environ.get('DBQUEUE_TEST_DATABASE', 'test_dbqueue')}_bare"
    admin = psycopg.connect(
        **{**connection_params("default"), "dbname": "postgres"}, autocommit=True
    )
    admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    admin.execute(f'CREATE DATABASE "{name}"')
    params = connection_params("default")
    yield f"postgres://{params.get('user', 'postgres')}@{params.get('host', '127.0.0.1')}:{params.get('port', 5432)}/{name}"
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.close()


def manage(url, *args):
    import os
    import subprocess
    import sys

    env = {**os.environ, "DATABASE_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "django", *args, "--settings", "tests.settings"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.django_db
def test_a_database_never_migrated_says_run_migrate_and_migrate_still_works(bare_database):
    burst = manage(bare_database, "run_jobqueue", "--burst")
    assert burst.returncode == 1, burst
    assert "dbqueue_job" in burst.stderr and "python manage.py migrate" in burst.stderr
    assert "dbqueue starting" not in burst.stdout  # refused before any worker thread
    status = manage(bare_database, "jobqueue_status")
    assert status.returncode == 1 and "python manage.py migrate" in status.stderr
    assert "Traceback" not in burst.stderr + status.stderr
    check = manage(bare_database, "check", "--database", "default", "--tag", "dbqueue")
    assert check.returncode == 0 and "dbqueue.W003" in check.stderr, check
    assert "python manage.py migrate" in check.stderr
    check = manage(bare_database, "check", "--database", "default")
    assert check.returncode == 0 and "dbqueue.W003" in check.stderr, check
    # migrate runs the database checks (databases=["default"]) before it migrates, and
    # makemigrations runs the others: neither tells the user to run migrate while it runs.
    makemigrations = manage(bare_database, "makemigrations", "--check", "--dry-run")
    assert makemigrations.returncode == 0, makemigrations
    assert "W003" not in makemigrations.stderr + makemigrations.stdout, makemigrations
    migrate = manage(bare_database, "migrate", "--noinput")
    assert migrate.returncode == 0, migrate.stderr
    assert "W003" not in migrate.stderr + migrate.stdout, migrate.stderr
    assert "Applying django_dbqueue.0001_initial... OK" in migrate.stdout
    check = manage(bare_database, "check", "--database", "default", "--tag", "dbqueue")
    assert "dbqueue.W003" not in check.stderr + check.stdout
    burst = manage(bare_database, "run_jobqueue", "--burst")
    assert burst.returncode == 0, burst.stderr


@pytest.mark.django_db
def test_a_database_without_the_worker_registry_says_run_migrate(bare_database):
    # Migrated up to before the registry: a worker would fail to write its row at every beat.
    migrate = manage(bare_database, "migrate", "django_dbqueue", "0016_claim_races", "--noinput")
    assert migrate.returncode == 0, migrate.stderr
    burst = manage(bare_database, "run_jobqueue", "--burst")
    assert burst.returncode == 1, burst
    assert "has no " in burst.stderr and "dbqueue_worker" in burst.stderr, burst.stderr
    assert "manage.py migrate" in burst.stderr
    assert "dbqueue starting" not in burst.stdout
