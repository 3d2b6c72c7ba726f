"""run_jobqueue argument validation (the worker itself is exercised by the acceptance tests), the
operator commands' refusals, and jobqueue_status --job (one job and its steps)."""

import io
import json
import re

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from django_dbqueue import enqueue, store
from tests.utils import job_row, scalar, wait_until


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


def status_job(*args):
    """``jobqueue_status --job ...`` through call_command: its standard output."""
    out = io.StringIO()
    call_command("jobqueue_status", "--job", *args, stdout=out)
    return out.getvalue()


def database_url():
    """The test database's URL, for a command run as its own process."""
    from django.db import connection

    from django_dbqueue.connections import connection_params

    params = connection_params("default")
    return (
        f"postgres://{params.get('user', 'postgres')}@{params.get('host', '127.0.0.1')}:"
        f"{params.get('port', 5432)}/{connection.settings_dict['NAME']}"
    )


@pytest.mark.django_db(transaction=True)
def test_status_job_prints_the_job_and_the_steps_its_runs_recorded(start_worker):
    job_id = enqueue("five-steps", {"fail_in": "ship"}).id  # ship fails on attempt 1
    start_worker()
    wait_until(lambda: job_row(job_id)["state"] == "done", message=f"job {job_id} done")
    row = job_row(job_id)
    lines = status_job(str(job_id)).splitlines()
    assert lines[:11] == [
        f"job: {job_id}",
        "type: five-steps",
        "queue: default",
        "state: done",
        "attempts: 2/5",
        f"run after: {row['run_after'].isoformat(timespec='seconds')}",
        f"worker: {row['worker_id'] or '-'}",
        "last error: RuntimeError: step ship fails on attempt 1 (attempt 1)",
        "snoozes: 0",
        "waiting for: -",
        "steps: 5",
    ]
    steps = [line.split() for line in lines[11:]]
    assert [(s[0], s[2], s[5:]) for s in steps] == [
        (name, str(attempt), ['{"step":', f'"{name}",', '"attempt":', f"{attempt}}}"])
        for name, attempt in [
            ("reserve", 1),
            ("charge", 1),
            ("wait-warehouse", 1),
            ("ship", 2),
            ("email", 2),
        ]
    ]
    finished = [
        at.isoformat(timespec="seconds") for *_, at, _ in store.list_steps("default", job_id)
    ]
    assert [s[4] for s in steps] == finished and {s[1] for s in steps} == {"attempt"}
    # The columns line up: each step's "attempt" starts where the longest name ends, plus two.
    assert {line.index("attempt") for line in lines[11:]} == {2 + len("wait-warehouse") + 2}

    data = json.loads(status_job(str(job_id), "--json"))
    assert data["last_error"]["class"] == "RuntimeError" and data["last_error"]["attempt"] == 1
    del data["last_error"]
    assert data == {
        "id": job_id,
        "type": "five-steps",
        "queue": "default",
        "state": "done",
        "attempts": 2,
        "max_attempts": 5,
        "run_after": row["run_after"].isoformat(),
        "worker_id": row["worker_id"],
        "snoozes": 0,
        "waiting_for": None,
        "steps_total": 5,
        "steps": [
            {
                "name": name,
                "occurrence": 1,
                "attempt": attempt,
                "finished_at": at.isoformat(),
                "result": {"step": name, "attempt": attempt},
            }
            for name, _, attempt, at, _ in store.list_steps("default", job_id)
        ],
    }


@pytest.mark.django_db(transaction=True)
def test_status_job_cuts_long_results_shows_occurrences_and_counts_the_rest():
    job_id = enqueue("noop").id
    with connection.cursor() as cursor:
        cursor.execute(
            """INSERT INTO dbqueue_step (job_id, name, occurrence, result, attempt)
               SELECT %s, 'item', g, jsonb_build_object('n', g), 1 FROM generate_series(1, 250) g""",
            [job_id],
        )
        cursor.execute(
            """INSERT INTO dbqueue_step (job_id, name, occurrence, result, attempt) VALUES
               (%s, 'long', 1, to_jsonb(repeat('y', 5000)), 3),
               (%s, E'two\\nlines', 1, NULL, 1),
               (%s, 'escape', 1, to_jsonb(E'\\u009b31m'::text), 1)""",
            [job_id, job_id, job_id],
        )
    lines = status_job(str(job_id)).splitlines()
    assert lines[7:11] == [
        "last error: none",
        "snoozes: 0",
        "waiting for: -",
        "steps: 253 (the first 200 below)",
    ]
    assert lines[12].split()[:3] == ["item", "#2", "attempt"]
    assert lines[11].split()[-2:] == ['{"n":', "1}"] and lines[210].split()[:2] == ["item", "#200"]
    assert lines[211:] == ["  ... and 53 more"]
    # The JSON has the same 200 steps, whole.
    data = json.loads(status_job(str(job_id), "--json"))
    assert data["steps_total"] == 253 and len(data["steps"]) == 200
    assert data["steps"][199] == {**data["steps"][199], "name": "item", "occurrence": 200}
    # Within the first 200: the long result is cut to 80 characters, control characters escaped.
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM dbqueue_step WHERE job_id = %s AND name = 'item'", [job_id])
    lines = status_job(str(job_id)).splitlines()
    long, two, escape = [
        at.isoformat(timespec="seconds") for *_, at, _ in store.list_steps("default", job_id)
    ]
    assert lines[10:] == [
        "steps: 3",
        f"  long        attempt 3  finished {long}  " + '"' + "y" * 76 + "...",
        f"  two\\nlines  attempt 1  finished {two}  null",
        f"  escape      attempt 1  finished {escape}  " + '"\\x9b31m"',
    ]
    assert json.loads(status_job(str(job_id), "--json"))["steps"][0]["result"] == "y" * 5000


@pytest.mark.django_db(transaction=True)
def test_status_job_of_a_job_that_does_not_exist_is_an_error_naming_it():
    with pytest.raises(CommandError, match=r"^--job 987654321: no such job \(it was never"):
        status_job("987654321")
    with pytest.raises(CommandError, match="no such job"):
        status_job("987654321", "--json")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("x", "argument --job: must be a job id (a whole number), got 'x'"),
        ("1.5", "argument --job: must be a job id (a whole number), got '1.5'"),
        ("", "argument --job: must be a job id (a whole number), got ''"),
        ("0", "argument --job: must be at least 1, got 0"),
        ("-3", "argument --job: must be at least 1, got -3"),
        (str(2**63), f"argument --job: must be at most {2**63 - 1}, got {2**63}"),
    ],
)
def test_status_job_refuses_what_is_not_a_job_id(value, fragment):
    with pytest.raises(CommandError, match=re.escape(fragment)):
        call_command("jobqueue_status", "--job", value)


@pytest.mark.django_db
def test_status_job_does_not_take_the_queue_checks():
    with pytest.raises(CommandError, match=re.escape("--fail-on-dead, --fail-on-stuck check the")):
        call_command("jobqueue_status", "--job", "1", "--fail-on-dead", "0", "--fail-on-stuck")
    with pytest.raises(CommandError, match="threshold; --fail-on-oldest-pending checks the whole"):
        call_command("jobqueue_status", "--job", "1", "--fail-on-oldest-pending", "5")


@pytest.mark.django_db(transaction=True)
def test_status_job_on_the_command_line_exits_1_or_2_with_the_reason_on_stderr():
    job_id = enqueue("noop").id
    url = database_url()
    found = manage(url, "jobqueue_status", "--job", str(job_id))
    assert found.returncode == 0 and f"job: {job_id}\n" in found.stdout, found
    missing = manage(url, "jobqueue_status", "--job", str(job_id + 1000))
    assert missing.returncode == 1 and missing.stdout == "", missing
    assert f"--job {job_id + 1000}: no such job" in missing.stderr
    assert "Traceback" not in missing.stderr
    bad = manage(url, "jobqueue_status", "--job", "abc")
    assert bad.returncode == 2 and "usage:" in bad.stderr, bad
    assert "argument --job: must be a job id (a whole number), got 'abc'" in bad.stderr
