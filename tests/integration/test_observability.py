"""Signals with timings, the job log line, traces and metrics, with in-process workers.

The real-process checks (``run_jobqueue --metrics-port`` scraped over HTTP, with and without
``--processes``) are in tests/acceptance/test_metrics.py.
"""

import logging

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from django_dbqueue import enqueue, enqueue_many, joblog, metrics, signals
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def wait_state(job_id, state, timeout=10):
    wait_until(lambda: job_row(job_id)["state"] == state, timeout=timeout, message=state)
    return job_row(job_id)


class Received:
    """Collects the keyword arguments of every signal it is connected to."""

    def __init__(self, *sigs):
        self.calls = []
        self.sigs = sigs

    def __enter__(self):
        for sig in self.sigs:
            sig.connect(self._receiver(sig), weak=False, dispatch_uid=f"test-{sig!r}")
        return self

    def _receiver(self, sig):
        def receive(sender, **kwargs):
            self.calls.append((sig, kwargs))

        return receive

    def __exit__(self, *exc):
        for sig in self.sigs:
            sig.disconnect(dispatch_uid=f"test-{sig!r}")

    def of(self, sig, job_id):
        return [kw for s, kw in self.calls if s is sig and kw["job_id"] == job_id]


# Signals --------------------------------------------------------------------------------------


def test_started_carries_wait_and_outcomes_carry_duration(start_worker):
    sigs = (signals.job_started, signals.job_succeeded, signals.job_failed, signals.job_dead)
    with Received(*sigs) as got:
        ok = enqueue("record", {"sleep": 0.2})
        bad = enqueue("fail")  # max_attempts=3
        start_worker()
        wait_state(ok.id, "done")
        wait_state(bad.id, "dead")
        wait_until(lambda: got.of(signals.job_dead, bad.id), message="job_dead sent")
    started = got.of(signals.job_started, ok.id)
    assert len(started) == 1
    assert started[0]["job_type"] == "record" and started[0]["attempt"] == 1
    assert started[0]["enqueued_at"] == job_row(ok.id)["created_at"]
    row = job_row(ok.id)
    # wait: from run_after to the claim, in database time, measured by the claim itself
    assert started[0]["wait"] == pytest.approx(
        (row["started_at"] - row["run_after"]).total_seconds(), abs=0.01
    )
    (done,) = got.of(signals.job_succeeded, ok.id)
    assert 0.2 <= done["duration"] < 5
    assert len(got.of(signals.job_started, bad.id)) == 3
    failed = got.of(signals.job_failed, bad.id)
    assert len(failed) == 2 and all(0 <= kw["duration"] < 5 for kw in failed)
    (dead,) = got.of(signals.job_dead, bad.id)
    assert dead["duration"] is not None and dead["error"]["class"] == "ValueError"


# The job log line -----------------------------------------------------------------------------


def test_one_info_line_per_success_on_its_own_logger(start_worker, caplog):
    caplog.set_level(logging.INFO, logger="django_dbqueue.jobs")
    assert joblog.connect()
    try:
        job = enqueue("echo", {"x": 1})
        start_worker()
        wait_state(job.id, "done")
        wait_until(
            lambda: [r for r in caplog.records if f"job={job.id} " in r.getMessage()],
            message="the success line",
        )
    finally:
        joblog.disconnect()
    (line,) = [r for r in caplog.records if f"job={job.id} " in r.getMessage()]
    assert line.name == "django_dbqueue.jobs" and line.levelno == logging.INFO
    assert line.getMessage().startswith(f"dbqueue done job={job.id} type=echo queue=default")
    assert line.getMessage().endswith("s") and " in 0." in line.getMessage()


def test_a_silenced_job_logger_connects_nothing(caplog):
    caplog.set_level(logging.WARNING, logger="django_dbqueue.jobs")
    assert not joblog.connect()
    connected = [key for key, *_ in signals.job_succeeded.receivers]
    assert not [key for key in connected if key[0] == joblog.DISPATCH_UID]


# Traces ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spans():
    """An SDK provider with an in-memory exporter (set once: OTel allows one global provider)."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


def test_request_span_and_job_run_span_share_one_trace(start_worker, spans):
    spans.clear()
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("GET /invoices/") as request_span:
        job = enqueue("echo", {"traced": True})
        many = enqueue_many([("noop", {})])
    request_context = request_span.get_span_context()
    stored = job_row(job.id)["traceparent"]
    ids = f"{request_context.trace_id:032x}-{request_context.span_id:016x}"
    assert stored == f"00-{ids}-{request_context.trace_flags:02x}"
    assert job_row(many[0].id)["traceparent"] == stored
    failing = enqueue("discard")  # outside any trace
    assert job_row(failing.id)["traceparent"] is None
    start_worker()
    wait_state(job.id, "done")
    wait_state(failing.id, "dead")

    def run_span(job_id):
        found = [
            s for s in spans.get_finished_spans() if s.attributes.get("dbqueue.job.id") == job_id
        ]
        return found[0] if found else None

    wait_until(lambda: run_span(job.id) and run_span(failing.id), message="run spans")
    span = run_span(job.id)
    assert span.name == "dbqueue run echo"
    assert span.context.trace_id == request_context.trace_id
    assert span.parent.span_id == request_context.span_id
    assert span.kind == trace.SpanKind.CONSUMER
    assert dict(span.attributes) == {
        "dbqueue.job.type": "echo",
        "dbqueue.job.queue": "default",
        "dbqueue.job.id": job.id,
        "dbqueue.job.attempt": 1,
        "dbqueue.job.outcome": "succeeded",
    }
    lone = run_span(failing.id)
    assert lone.parent is None and lone.context.trace_id != request_context.trace_id
    assert lone.attributes["dbqueue.job.outcome"] == "dead"
    assert lone.status.status_code == trace.StatusCode.ERROR


def test_an_enqueue_outside_a_trace_binds_no_traceparent():
    with CaptureQueriesContext(connection) as queries:
        job = enqueue("echo", {})
        enqueue_many([("echo", {})])
    assert job_row(job.id)["traceparent"] is None
    inserts = [q["sql"] for q in queries.captured_queries if "INSERT INTO dbqueue_job" in q["sql"]]
    assert len(inserts) == 2 and not any("traceparent" in sql for sql in inserts)


# Metrics --------------------------------------------------------------------------------------


def scrape():
    """``{(name, frozenset(labels)): value}`` of one exposition."""
    text = generate_latest(metrics.exposition_registry()).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def fresh_gauges(monkeypatch):
    """A table collector that queries on every scrape, for this test only."""
    monkeypatch.setattr(metrics, "_table_collector", metrics.TableCollector(cache=0))
    yield metrics._table_collector
    metrics._table_collector.close()


def test_counters_and_gauges_match_the_table(start_worker, fresh_gauges):
    metrics.install()
    before = scrape()
    ok = [j.id for j in enqueue_many([("echo", {"n": i}) for i in range(5)])]
    bad = enqueue("discard")
    start_worker()
    for job_id in ok:
        wait_state(job_id, "done")
    wait_state(bad.id, "dead")
    later = [j.id for j in enqueue_many([("echo", {}), ("echo", {})])]
    enqueue("echo", {}, delay=3600)
    samples = wait_until(
        lambda: (
            (s := scrape())
            and value(s, "dbqueue_jobs_dead_total", type="discard", queue="default")
            > value(before, "dbqueue_jobs_dead_total", type="discard", queue="default")
            and s
        ),
        message="the dead counter",
    )

    def delta(name, **labels):
        return value(samples, name, **labels) - value(before, name, **labels)

    echo = {"type": "echo", "queue": "default"}
    assert delta("dbqueue_jobs_succeeded_total", **echo) >= 5
    assert delta("dbqueue_jobs_started_total", **echo) >= 5
    assert delta("dbqueue_job_duration_seconds_count", **echo, outcome="succeeded") >= 5
    assert delta("dbqueue_job_wait_seconds_count", **echo) >= 5
    assert delta("dbqueue_jobs_dead_total", type="discard", queue="default") == 1
    assert value(samples, "dbqueue_table_up") == 1
    # The stable gauges against the table, counted here with plain SQL (running and due move
    # while the worker drains `later`; the next test pins them on a still table).
    for state, sql in (
        ("dead", "state = 'dead'"),
        ("scheduled", "state = 'pending' AND run_after > now()"),
    ):
        expected = scalar(f"SELECT count(*) FROM dbqueue_job WHERE queue = 'default' AND {sql}")
        assert value(samples, "dbqueue_queue_jobs", queue="default", state=state) == expected
    assert value(samples, "dbqueue_queue_jobs", queue="default", state="scheduled") >= 1
    for job_id in later:
        wait_state(job_id, "done")


def test_due_depth_oldest_and_workers_from_the_table(fresh_gauges):
    due = [j.id for j in enqueue_many([("echo", {})] * 3)]
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET run_after = now() - interval '90 seconds' WHERE id = %s",
            [due[0]],
        )
        # Two running jobs of one worker whose last heartbeat was 30 s ago (lease 60 s).
        cursor.execute(
            "UPDATE dbqueue_job SET state = 'running', attempts = 1, worker_id = 'host:1:abc', "
            "leased_until = now() + interval '30 seconds', lease_seconds = 60 "
            "WHERE id = ANY(%s)",
            [due[1:]],
        )
        # The registry: that worker, stale (30 s without a heartbeat) but not expired yet; an
        # idle live one on another host; one expired (gone from every listing).
        cursor.execute(
            "INSERT INTO dbqueue_worker (worker_id, host, pid, version, queues, concurrency, "
            "execution, state, started_at, heartbeat_at, stale_at, expires_at, running) "
            "SELECT w.id, w.host, 1, 'v', w.queues::text[], 4, 'thread', 'running', "
            "now() - interval '1 hour', now() - w.age * interval '1 second', "
            "now() - (w.age - 20) * interval '1 second', "
            "now() - (w.age - 40) * interval '1 second', 0 "
            "FROM (VALUES ('host:1:abc', 'host', '{default}', 30), "
            "('other:2:def', 'other', '{default,emails}', 0), "
            "('gone:3:old', 'gone', '{default}', 50)) AS w(id, host, queues, age)"
        )
    samples = scrape()
    assert value(samples, "dbqueue_queue_jobs", queue="default", state="due") == 1
    assert value(samples, "dbqueue_queue_jobs", queue="default", state="running") == 2
    assert value(samples, "dbqueue_queue_jobs", queue="emails", state="due") == 0
    assert 90 <= value(samples, "dbqueue_queue_oldest_due_seconds", queue="default") < 100
    stale = ("dbqueue_workers", frozenset({"queue": "default", "host": "host"}.items()))
    assert samples[stale] == 0  # listed, and counted as no live worker
    assert value(samples, "dbqueue_workers", queue="default", host="other") == 1
    assert value(samples, "dbqueue_workers", queue="emails", host="other") == 1
    assert value(samples, "dbqueue_worker_jobs", worker="host:1:abc") == 2
    assert value(samples, "dbqueue_worker_jobs", worker="other:2:def") == 0
    assert 29 <= value(samples, "dbqueue_worker_heartbeat_age_seconds", worker="host:1:abc") < 40
    assert not [key for key in samples if "gone" in str(key)]  # expired: not exposed


def test_the_table_query_runs_once_per_cache_period():
    collector = metrics.TableCollector(cache=60)
    try:
        for _ in range(50):
            list(collector.collect())
        assert collector.queries == 1
    finally:
        collector.close()
    uncached = metrics.TableCollector(cache=0)
    try:
        list(uncached.collect())
        list(uncached.collect())
        assert uncached.queries == 2
    finally:
        uncached.close()


def test_metrics_view_needs_staff_permission_or_the_token(client, settings, fresh_gauges):
    settings.DBQUEUE = {**settings.DBQUEUE, "METRICS_TOKEN": "s3cret-token-of-16+"}
    url = "/dbqueue-metrics/"
    assert client.get(url).status_code == 403
    assert client.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 403
    response = client.get(url, headers={"Authorization": "Bearer s3cret-token-of-16+"})
    assert response.status_code == 200
    assert b"dbqueue_queue_jobs{" in response.content
    staff = User.objects.create_user("ops", password="pw", is_staff=True)
    client.force_login(staff)
    assert client.get(url).status_code == 403  # staff, but no view permission on jobs
    staff.user_permissions.add(Permission.objects.get(codename="view_backgroundjob"))
    response = client.get(url)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")


def test_metrics_view_without_prometheus_client_says_what_to_install(
    client, monkeypatch, fresh_gauges
):
    monkeypatch.setattr(metrics, "available", lambda: False)
    admin = User.objects.create_superuser("root", password="pw")
    client.force_login(admin)
    response = client.get("/dbqueue-metrics/")
    assert response.status_code == 501 and b"django-dbqueue[prometheus]" in response.content


def test_jobs_in_a_durable_wait_count_as_suspended_not_scheduled(start_worker, fresh_gauges):
    metrics.install()
    sleeper = enqueue("sleeper", {"seconds": 3600}).id
    later = enqueue("echo", {}, delay=3600).id
    start_worker()
    wait_until(
        lambda: (
            job_row(sleeper)["wait_reason"] == "sleep:nap"
            and job_row(sleeper)["state"] == "pending"
        ),
        message="the sleeper asleep",
    )
    samples = scrape()
    assert value(samples, "dbqueue_queue_jobs", queue="default", state="suspended") == 1
    assert value(samples, "dbqueue_queue_jobs", queue="default", state="scheduled") == 1  # later
    assert job_row(later)["state"] == "pending"
