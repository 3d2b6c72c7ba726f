"""Names you recognise: a job sent through ``django.tasks`` is shown, filtered, logged, counted
and charted under its task's path, never under the one type ``django.tasks``; a path that no
task of this process defines is shown as stored text, counted as ``django.tasks`` and never
imported (Django 6+; the Django 5.2 part checks that plain job types are untouched)."""

import json
import logging
import sys

import django
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.urls import reverse
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from django_dbqueue import dashboard, joblog, metrics, names, signals
from django_dbqueue.rollup import Rollup
from django_dbqueue.sweeper import Sweeper
from tests.utils import job_row, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
needs_tasks = pytest.mark.skipif(
    django.VERSION < (6, 0), reason="django.tasks exists from Django 6.0 (run with --django 6.1)"
)

ADD = "tests.testapp.tasks.add"
# A real module that nothing in the suite imports: importing it would print the Zen of Python.
NEVER_IMPORTED = "this.f"


@pytest.fixture
def tasks():
    from tests.testapp import tasks as module

    return module


def insert_task_job(path, *, state="pending", errors=0, expired=False):
    """A ``django.tasks`` row naming ``path``, as the backend stores one."""
    payload = json.dumps({"task": path, "backend": "default", "args": [1, 2], "kwargs": {}})
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
                max_attempts, lease_seconds, errors, created_at, started_at, finished_at,
                leased_until, worker_id, lease_token)
            SELECT 'django.tasks', 'default', %(payload)s, %(state)s, 0,
                   now() - interval '3 minutes', CASE WHEN %(state)s = 'pending' THEN 0 ELSE 1 END,
                   CASE WHEN %(state)s = 'pending' THEN 5 ELSE 1 END, 60,
                   (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                        'class', 'ValueError', 'at', now() - interval '2 minutes')), '[]')
                    FROM generate_series(1, %(errors)s)),
                   now() - interval '3 minutes',
                   CASE WHEN %(state)s <> 'pending' THEN now() - interval '2 minutes' END,
                   CASE WHEN %(state)s IN ('done', 'dead') THEN now() - interval '2 minutes' END,
                   CASE WHEN %(state)s = 'running' THEN now() - interval '1 second' END,
                   CASE WHEN %(state)s = 'running' THEN 'gone:1:a' END,
                   CASE WHEN %(state)s = 'running' THEN 7 END
            RETURNING id
            """,
            {"payload": payload, "state": state, "errors": errors},
        )
        return cursor.fetchone()[0]


@pytest.fixture
def gauges(monkeypatch):
    """The table collector of this test's scrapes, closed after it (its own connection)."""
    monkeypatch.setattr(metrics, "_table_collector", metrics.TableCollector(cache=0))
    yield
    metrics._table_collector.close()


def scrape():
    text = generate_latest(metrics.exposition_registry()).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_plain_job_types_keep_their_names():
    """Django 5.2 and 6.x alike: a registered type is its own name, whatever its payload."""
    assert names.label("echo", {"task": ADD}) == "echo"
    assert names.stored("echo", {"task": ADD}) == "echo"
    assert names.label("django.tasks", {"task": 42}) == "django.tasks"
    assert names.stored("django.tasks", None) == "django.tasks"


@needs_tasks
def test_metrics_log_lines_and_signals_name_a_known_task(tasks, start_worker, caplog, gauges):
    metrics.install()
    caplog.set_level(logging.INFO, logger="django_dbqueue.jobs")
    assert joblog.connect()
    before = scrape()
    seen = []
    signals.job_succeeded.connect(
        lambda sender, **kw: seen.append((kw["job_type"], kw["job_name"])),
        weak=False,
        dispatch_uid="test-names",
    )
    try:
        result = tasks.add.enqueue(2, 3)
        start_worker()
        wait_until(lambda: job_row(int(result.id))["state"] == "done", message="task done")
        samples = wait_until(
            lambda: (
                (s := scrape())
                and value(s, "dbqueue_jobs_succeeded_total", type=ADD, queue="default")
                > value(before, "dbqueue_jobs_succeeded_total", type=ADD, queue="default")
                and s
            ),
            message="the task's counter",
        )
    finally:
        joblog.disconnect()
        signals.job_succeeded.disconnect(dispatch_uid="test-names")
    assert ("django.tasks", ADD) in seen
    assert value(samples, "dbqueue_jobs_started_total", type=ADD, queue="default") >= 1
    line = next(r.getMessage() for r in caplog.records if f"job={result.id} " in r.getMessage())
    assert f"type={ADD} " in line


@needs_tasks
def test_an_unknown_path_is_counted_as_django_tasks_and_never_imported(
    start_worker, caplog, gauges
):
    metrics.install()
    assert "this" not in sys.modules
    before = scrape()
    job_id = insert_task_job(NEVER_IMPORTED)
    start_worker()
    wait_until(lambda: job_row(job_id)["state"] == "dead", message="dead-lettered")
    samples = wait_until(
        lambda: (
            (s := scrape())
            and value(s, "dbqueue_jobs_dead_total", type="django.tasks", queue="default")
            > value(before, "dbqueue_jobs_dead_total", type="django.tasks", queue="default")
            and s
        ),
        message="the dead counter",
    )
    assert not [k for k in samples if dict(k[1]).get("type") == NEVER_IMPORTED]
    assert "this" not in sys.modules
    dead = next(r.getMessage() for r in caplog.records if f"job={job_id} " in r.getMessage())
    assert "type=django.tasks " in dead


@needs_tasks
def test_the_sweeper_logs_a_known_task_by_name(tasks, caplog):
    caplog.set_level(logging.WARNING, logger="django_dbqueue")
    job_id = insert_task_job(ADD, state="running")
    assert Sweeper("default").rescue()["dead"] == 1
    line = next(r.getMessage() for r in caplog.records if f"job={job_id} " in r.getMessage())
    assert f"type={ADD} " in line


@needs_tasks
def test_the_admin_shows_and_filters_by_task(tasks, client):
    added = insert_task_job(ADD)
    odd = insert_task_job("<b>no.such</b>.task")
    other = insert_task_job("tests.testapp.tasks.shout")
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "x"))
    url = reverse("admin:django_dbqueue_backgroundjob_changelist")
    body = client.get(url).content.decode()
    assert f'{ADD} <span class="quiet">(django.tasks)</span>' in body
    assert "&lt;b&gt;no.such&lt;/b&gt;.task" in body and "<b>no.such" not in body
    assert f"?type=task%3A{ADD}" in body  # a choice of the type filter
    filtered = client.get(url, {"type": f"task:{ADD}"})
    shown = {job.pk for job in filtered.context["cl"].result_list}
    assert shown == {added}
    # A path no task of this process defines filters too, compared as text.
    shown = client.get(url, {"type": "task:<b>no.such</b>.task"}).context["cl"].result_list
    assert {job.pk for job in shown} == {odd}
    everything = client.get(url, {"type": "django.tasks"}).context["cl"].result_list
    assert {job.pk for job in everything} == {added, odd, other}


@needs_tasks
def test_the_dashboard_charts_failures_by_task(settings):
    settings.DBQUEUE = {"QUEUES": {"default": {}}}
    insert_task_job(ADD, state="dead", errors=1)
    insert_task_job(NEVER_IMPORTED, state="dead", errors=1)
    expected = [(ADD, 1, 1), (NEVER_IMPORTED, 1, 1)]
    assert sorted(dashboard.build(hours=1).failures) == expected
    Rollup().run_once()
    data = dashboard.build(hours=1)
    assert data.from_table_since > data.starts[0]
    assert sorted(data.failures) == expected
    assert "this" not in sys.modules
