"""Operator commands and retention: jobqueue_status thresholds, jobqueue_requeue, pruning."""

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from django_dbqueue import enqueue, enqueue_many
from django_dbqueue.sweeper import Sweeper
from tests.utils import job_row, scalar

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args):
    """call_command, returning (exit code, stdout, stderr)."""
    import io

    out, err = io.StringIO(), io.StringIO()
    try:
        call_command(*args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, out.getvalue(), err.getvalue()


def kill(job_id, finished="now()"):
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE dbqueue_job SET state = 'dead', attempts = 1, finished_at = {finished} WHERE id = %s",
            [job_id],
        )


def age(job_id, seconds):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET run_after = now() - %s * interval '1 second' WHERE id = %s",
            [seconds, job_id],
        )


def test_status_prints_counts_and_ok():
    enqueue_many([("noop", {})] * 3 + [("email", {})])
    enqueue("noop", delay=3600)
    code, out, _ = run("jobqueue_status")
    assert code == 0 and out.strip().endswith("OK")
    lines = {line.split()[0]: line.split() for line in out.splitlines()[1:-1]}
    assert lines["default"][1:6] == ["3", "1", "0", "0", "0"]
    assert lines["emails"][1] == "1" and lines["TOTAL"][1] == "4"


def test_status_json():
    job = enqueue("noop")
    age(job.id, 120)
    code, out, _ = run("jobqueue_status", "--json")
    data = json.loads(out)
    assert code == 0 and data["totals"]["pending"] == 1
    assert 119 <= data["queues"]["default"]["oldest_due_seconds"] <= 125
    assert data["failures"] == []


def test_fail_on_dead_threshold():
    dead = enqueue("noop")
    kill(dead.id)
    assert run("jobqueue_status", "--fail-on-dead", "1")[0] == 0
    code, _, err = run("jobqueue_status", "--fail-on-dead", "0")
    assert code == 1 and "FAIL: 1 dead jobs (threshold 0)" in err


def test_fail_on_stuck():
    job = enqueue("noop")
    assert run("jobqueue_status", "--fail-on-stuck")[0] == 0
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET state = 'running', attempts = 1, leased_until = now() - interval '5 seconds' WHERE id = %s",
            [job.id],
        )
    code, _, err = run("jobqueue_status", "--fail-on-stuck")
    assert code == 1 and "1 stuck jobs" in err


def test_fail_on_oldest_pending():
    job = enqueue("noop")
    assert run("jobqueue_status", "--fail-on-oldest-pending", "60")[0] == 0
    age(job.id, 600)
    code, out, _ = run("jobqueue_status", "--json", "--fail-on-oldest-pending", "60")
    assert code == 1 and "oldest due job waited" in json.loads(out)["failures"][0]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--fail-on-dead", "-1"], "argument --fail-on-dead: must be 0 or more"),
        (["--fail-on-dead", "x"], "argument --fail-on-dead: must be a whole number"),
        (["--fail-on-oldest-pending", "0"], "must be greater than 0"),
    ],
)
def test_status_bad_arguments(args, fragment):
    with pytest.raises(CommandError, match=fragment):
        call_command("jobqueue_status", *args)


def test_requeue_by_ids_reports_what_it_left_alone():
    dead, pending = enqueue("noop"), enqueue("noop")
    kill(dead.id)
    code, out, err = run("jobqueue_requeue", "--ids", str(dead.id), str(pending.id), "999999")
    assert code == 0 and "requeued 1 of 3 job(s)" in out
    assert f"[{pending.id}, 999999]" in err
    assert job_row(dead.id)["state"] == "pending"


def test_requeue_dead_with_filters_dry_run_and_progress():
    jobs = enqueue_many([("noop", {})] * 2500 + [("email", {})] * 3)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE dbqueue_job SET state = 'dead', attempts = 1, finished_at = now()")
    _, out, _ = run("jobqueue_requeue", "--dead", "--type", "noop", "--dry-run")
    assert "dry run: would requeue 2500 dead job(s) of type 'noop'" in out
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'dead'") == 2503
    code, out, _ = run("jobqueue_requeue", "--dead", "--queue", "default")
    assert code == 0
    assert "requeued 2500 dead job(s) in queue 'default'" in out
    assert "[##########" in out and "2500/2500" in out  # progress on a large requeue
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'dead'") == 3
    assert job_row(jobs[-1].id)["state"] == "dead"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ([], "one of the arguments --dead --ids is required"),
        (["--dead", "--ids", "1"], "not allowed with argument"),
        (["--ids", "x"], "must be a job id"),
        (["--ids", "1", "--type", "noop"], "narrow --dead"),
        (["--dead", "--queue", "nope"], "--queue 'nope' is not in DBQUEUE"),
    ],
)
def test_requeue_bad_arguments(args, fragment):
    with pytest.raises(CommandError, match=fragment):
        call_command("jobqueue_requeue", *args)


def test_retention_prunes_old_done_and_cancelled_keeps_dead_and_recent(settings):
    settings.DBQUEUE = {
        "QUEUES": {"default": {}, "emails": {}},
        "DONE_RETENTION": 3600,
        "CANCELLED_RETENTION": 60,
        "SWEEP_BATCH": 100,
    }
    old_done, new_done, old_cancelled, old_dead, pending = (enqueue("noop") for _ in range(5))
    with connection.cursor() as cursor:
        for job_id, state, hours in [
            (old_done.id, "done", 2),
            (new_done.id, "done", 0),
            (old_cancelled.id, "cancelled", 2),
            (old_dead.id, "dead", 2000),
        ]:
            cursor.execute(
                "UPDATE dbqueue_job SET state = %s, attempts = 1, finished_at = now() - %s * interval '1 hour' WHERE id = %s",
                [state, hours, job_id],
            )
        cursor.execute(
            """INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
               max_attempts, lease_seconds, errors, created_at, finished_at)
               SELECT 'noop', 'default', '{}', 'done', 0, now(), 1, 10, 60, '[]', now(), now() - interval '3 hours'
               FROM generate_series(1, 450)"""
        )
    assert Sweeper().run_once()["pruned"] == 452
    remaining = set(scalar("SELECT array_agg(id ORDER BY id) FROM dbqueue_job"))
    assert remaining == {new_done.id, old_dead.id, pending.id}


def test_dead_retention_when_configured(settings):
    settings.DBQUEUE = {"QUEUES": {"default": {}, "emails": {}}, "DEAD_RETENTION": 86400}
    job = enqueue("noop")
    kill(job.id, "now() - interval '2 days'")
    assert Sweeper().prune() == 1
