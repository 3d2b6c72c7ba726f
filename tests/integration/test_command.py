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
    ],
)
def test_bad_arguments_are_usage_errors(args, fragment):
    with pytest.raises(CommandError, match=fragment):
        call_command("run_jobqueue", *args)


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
