"""The queue dashboard against real PostgreSQL: its numbers against plain SQL counts, with and
without the rollup, after retention; the rollup's once-a-minute rule; the worker list; the
page's permission; a real worker writing the rollup."""

import json

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.urls import reverse

from django_dbqueue import dashboard, store
from django_dbqueue.models import FinishedMinute
from django_dbqueue.rollup import WAIT_BOUNDS, Rollup
from tests.utils import scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

DASHBOARD = "admin:django_dbqueue_dashboard"


def insert(
    state,
    *,
    count=1,
    queue="default",
    job_type="t",
    ago=300.0,
    wait=0.7,
    errors=0,
    worker="web-1:4242:abc123",
):
    """``count`` jobs in ``state``; finished (or started) ``ago`` seconds ago after waiting
    ``wait`` seconds; ``errors`` failed attempts each."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
                max_attempts, lease_seconds, errors, created_at, started_at, finished_at,
                leased_until, worker_id)
            SELECT %(type)s, %(queue)s, '{}', %(state)s, 0,
                   now() - (%(ago)s + %(wait)s) * interval '1 second',
                   CASE WHEN %(state)s = 'pending' THEN 0 ELSE 1 + %(errors)s END, 10, 60,
                   (SELECT COALESCE(jsonb_agg(jsonb_build_object('class', 'E')), '[]')
                    FROM generate_series(1, %(errors)s)),
                   now() - (%(ago)s + %(wait)s) * interval '1 second',
                   CASE WHEN %(state)s IN ('done', 'dead', 'running')
                        THEN now() - %(ago)s * interval '1 second' END,
                   CASE WHEN %(state)s IN ('done', 'dead', 'cancelled')
                        THEN now() - %(ago)s * interval '1 second' END,
                   CASE WHEN %(state)s = 'running' THEN now() + interval '50 seconds' END,
                   CASE WHEN %(state)s IN ('done', 'dead', 'running') THEN %(worker)s END
            FROM generate_series(1, %(count)s)
            """,
            {
                "type": job_type,
                "queue": queue,
                "state": state,
                "ago": ago,
                "wait": wait,
                "errors": errors,
                "count": count,
                "worker": worker,
            },
        )


def finished_since(state, since):
    return scalar(
        "SELECT count(*) FROM dbqueue_job WHERE state = %s AND finished_at >= %s", [state, since]
    )


def totals(data):
    """Jobs per state over the window (the chart holds jobs per minute per bucket)."""
    return {state: round(sum(values) * data.step / 60) for state, values in data.finished.items()}


@pytest.fixture
def history(settings):
    settings.DBQUEUE = {"QUEUES": {"default": {}, "emails": {}}}
    insert("done", count=30, ago=90)
    insert("done", count=20, ago=1800, queue="emails", job_type="mail", wait=20.0)
    insert("dead", count=3, ago=600, job_type="charge", errors=4)
    insert("done", count=5, ago=900, job_type="charge", errors=1)
    insert("cancelled", count=2, ago=1200)
    insert("done", count=40, ago=3 * 3600)  # outside the 1-hour window, inside the 6-hour one
    insert("pending", count=7)
    insert("pending", count=2, queue="emails", ago=-600)  # scheduled in 10 minutes
    insert("running", count=4, worker="web-1:4242:abc123")
    insert("running", count=1, queue="emails", worker="worker-b:77:ffee00")


def test_finished_counts_match_the_table(history):
    data = dashboard.build(hours=1)
    since = data.starts[0]
    assert data.from_table_since == since  # no rollup yet: everything from the job table
    assert totals(data) == {
        "done": finished_since("done", since),
        "dead": finished_since("dead", since),
        "cancelled": finished_since("cancelled", since),
    }
    assert totals(data) == {"done": 55, "dead": 3, "cancelled": 2}
    assert totals(dashboard.build(hours=6))["done"] == 95
    # Failures by type: dead letters, and the failed attempts of the jobs that finished.
    assert data.failures == [("charge", 3, 17)]
    # The bucket of the jobs finished 90 s ago holds exactly them (per minute: 1-minute buckets).
    bucket = next(i for i, start in enumerate(data.starts) if start > data.now - _s(150)) - 1
    window = [(data.starts[i], data.finished["done"][i]) for i in range(bucket, len(data.starts))]
    assert sum(n for _, n in window) == 30


def _s(seconds):
    from datetime import timedelta

    return timedelta(seconds=seconds)


def test_waits_are_binned_into_p50_and_p95(history):
    data = dashboard.build(hours=1)
    p50 = [v for v in data.wait_p50 if v is not None]
    p95 = [v for v in data.wait_p95 if v is not None]
    # Oldest first: 20 jobs that waited 20 s, then 3, 5 and 30 that waited 0.7 s. A wait is
    # placed in its histogram bin ([10, 30) and [0.5, 1.0) s) and interpolated inside it.
    assert len(p50) == 4
    assert 10.0 <= p50[0] <= 30.0 and 10.0 <= p95[0] <= 30.0, (p50, p95)
    assert all(0.5 <= v <= 1.0 for v in p50[1:] + p95[1:]), (p50, p95)


def test_rollup_gives_the_same_numbers_and_outlives_retention(history):
    before = dashboard.build(hours=1)
    counts = Rollup().run_once()
    assert counts["sampled"] == 2  # default and emails
    assert counts["rolled"] == scalar(
        "SELECT count(DISTINCT (date_trunc('minute', finished_at), queue, type)) "
        "FROM dbqueue_job WHERE finished_at < date_trunc('minute', now())"
    )
    assert Rollup().run_once() == {"sampled": 0, "rolled": 0, "pruned": 0}  # done this minute
    rolled = scalar("SELECT sum(done) FROM dbqueue_finished")
    assert rolled == scalar(
        "SELECT count(*) FROM dbqueue_job WHERE state = 'done' "
        "AND finished_at < date_trunc('minute', now())"
    )

    after = dashboard.build(hours=1)
    assert after.from_table_since > after.starts[0]  # the rollup counted the minutes before
    assert totals(after) == totals(before)
    assert after.failures == before.failures
    assert after.wait_p95 == before.wait_p95

    # Depth: one sample per queue this minute, as the table has it.
    assert after.depth["default"][-1] == 7
    assert after.depth["emails"][-1] == 0  # its two pending jobs are scheduled, not due
    assert scalar("SELECT scheduled FROM dbqueue_depth WHERE queue = 'emails'") == 2
    assert scalar("SELECT running FROM dbqueue_depth WHERE queue = 'default'") == 4

    # Retention deletes the jobs; the rollup keeps their counts.
    assert store.prune("default", state="done", age=60, limit=1000) == 95
    assert totals(dashboard.build(hours=1)) == totals(before)


def test_workers_holding_jobs(history):
    workers = {w.id: w for w in dashboard.build(hours=1).workers}
    assert set(workers) == {"web-1:4242:abc123", "worker-b:77:ffee00"}
    w = workers["web-1:4242:abc123"]
    assert (w.host, w.pid, w.queues, w.jobs, w.stuck) == ("web-1", "4242", ["default"], 4, 0)
    assert 0 <= w.heartbeat_age < 30  # leased_until = now + 50 s on a 60 s lease
    assert workers["worker-b:77:ffee00"].queues == ["emails"]


def test_a_worker_writes_the_rollup(start_worker):
    insert("done", count=3, ago=200)
    worker = start_worker(queues=["default"])
    wait_until(
        lambda: scalar("SELECT count(*) FROM dbqueue_depth") >= 2,
        message="the worker's first rollup",
    )
    wait_until(lambda: scalar("SELECT COALESCE(sum(done), 0) FROM dbqueue_finished") == 3)
    assert worker.rollup is not None


def make_user(*codenames):
    user = User.objects.create_user("ops-" + "-".join(codenames or ("none",)), is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_dbqueue", codename__in=codenames)
    )
    return user


def test_the_page_needs_the_view_permission_on_jobs(client, history):
    url = reverse(DASHBOARD)
    anonymous = client.get(url)
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]

    client.force_login(make_user("view_jobdelivery"))
    assert client.get(url).status_code == 403

    client.force_login(make_user("view_backgroundjob"))
    page = client.get(url + "?hours=6")
    assert page.status_code == 200
    body = page.content.decode()
    assert body.count('<svg class="dbq-chart"') == 4
    assert '<meta http-equiv="refresh"' in body
    assert "web-1:4242:abc123" in body and ">4242<" in body
    assert 'aria-current="page">6 h' in body
    assert client.get(url + "?hours=nonsense").status_code == 200  # the default window

    changelist = client.get(reverse("admin:django_dbqueue_backgroundjob_changelist"))
    assert url in changelist.content.decode()
    assert url in client.get(reverse("admin:app_list", args=["django_dbqueue"])).content.decode()


def test_type_names_are_escaped_in_the_charts(client):
    insert("dead", count=1, job_type="<script>alert(1)</script>", ago=120)
    client.force_login(make_user("view_backgroundjob"))
    body = client.get(reverse(DASHBOARD)).content.decode()
    assert "<script>alert(1)" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body


def test_bounds_match_the_rollup():
    assert list(WAIT_BOUNDS) == sorted(WAIT_BOUNDS)


# Failed attempts through a requeue -------------------------------------------------------------


def travel(minutes):
    """Move every stored time (jobs, their error entries, the rollup) back by ``minutes``: as
    if that much time had passed, so the next rollup is in a later minute than the last."""
    shift = {"d": f"{minutes} minutes"}
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE dbqueue_job SET created_at = created_at - %(d)s::interval,
                run_after = run_after - %(d)s::interval,
                started_at = started_at - %(d)s::interval,
                finished_at = finished_at - %(d)s::interval,
                errors = (SELECT COALESCE(jsonb_agg(
                              CASE WHEN e ? 'at' THEN jsonb_set(e, '{at}',
                                   to_jsonb((e ->> 'at')::timestamptz - %(d)s::interval))
                                   ELSE e END ORDER BY n), '[]')
                          FROM jsonb_array_elements(errors) WITH ORDINALITY AS x(e, n))
            """,
            shift,
        )
        cursor.execute("UPDATE dbqueue_depth SET minute = minute - %(d)s::interval", shift)
        cursor.execute("UPDATE dbqueue_finished SET minute = minute - %(d)s::interval", shift)


def claim_one(job_id):
    token = store.new_token()
    rows = store.claim(
        "default", worker_id="w:1:a", queues=["default"], limits=[10], limit=1, token=token
    )
    assert [row.id for row in rows] == [job_id]
    return token


def fail_once(job_id):
    error = {"class": "ValueError", "message": "boom", "traceback": ""}
    return store.fail("default", job_id=job_id, token=claim_one(job_id), error=error, delay=0)


def failures(data):
    return sorted(data.failures)


def test_failed_attempts_count_once_at_their_time_through_a_requeue(settings):
    """A job fails 8 times (dead), is requeued, fails twice more and succeeds: 10 failed
    attempts and one dead letter, whether read from the job table or from the rollup run in
    later minutes; the "Requeued" marker is not a failed attempt. A job that failed and is
    retried later is counted once, while it waits, not again when it finishes."""
    from django_dbqueue.enqueue import enqueue

    settings.DBQUEUE = {"QUEUES": {"default": {}}}
    failing = enqueue("fail", {}, max_attempts=8).id
    retried = enqueue("noop", {}, max_attempts=3, priority=-1).id  # claimed last
    assert Rollup().run_once()["sampled"] == 1  # this minute's sample: the counting starts
    for _ in range(7):
        assert fail_once(failing) == "pending"
    assert fail_once(failing) == "dead"
    assert fail_once(retried) == "pending"
    assert failures(dashboard.build(hours=1)) == [("fail", 1, 8), ("noop", 0, 1)]

    travel(2)
    assert Rollup().run_once()["rolled"] == 2  # fail and noop, in the minute they failed
    data = dashboard.build(hours=1)
    assert data.from_table_since > data.starts[0]
    assert failures(data) == [("fail", 1, 8), ("noop", 0, 1)]

    assert store.requeue("default", [failing]) == {failing: "default"}
    assert fail_once(failing) == "pending"
    assert fail_once(failing) == "pending"
    assert store.complete("default", [(failing, claim_one(failing), None)]) == {failing}
    assert store.complete("default", [(retried, claim_one(retried), None)]) == {retried}
    # Read from the rollup (the minutes before) and the job table (this minute) together.
    assert failures(dashboard.build(hours=1)) == [("fail", 1, 10), ("noop", 0, 1)]

    travel(2)
    Rollup().run_once()
    assert failures(dashboard.build(hours=1)) == [("fail", 1, 10), ("noop", 0, 1)]
    # Each failed attempt in the minute it failed: 8 then 2 for fail; done in the second.
    rows = list(
        FinishedMinute.objects.order_by("minute", "type").values_list(
            "type", "done", "dead", "failed_attempts"
        )
    )
    assert rows == [
        ("fail", 0, 1, 8),
        ("noop", 0, 0, 1),
        ("fail", 1, 0, 2),
        ("noop", 1, 0, 0),
    ]


def test_failed_attempts_are_read_through_indexes_not_a_scan_of_the_table():
    """The failed attempts read the pending rows with an error history through
    dbqueue_job_retried_idx: their cost follows the retries, not the backlog or the history."""
    from django_dbqueue.store import dashboard as dashboard_sql

    insert("done", count=20000, ago=7200)
    insert("pending", count=20000, ago=-600)
    insert("pending", count=20, ago=-600, errors=1)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE dbqueue_job")
        cursor.execute(
            "EXPLAIN (FORMAT JSON) " + dashboard_sql.FAILED_ATTEMPTS_SQL,
            {"from": scalar("SELECT date_trunc('minute', now())")},
        )
        plan = json.dumps(cursor.fetchone()[0])
    assert "dbqueue_job_retried_idx" in plan
    assert '"Seq Scan"' not in plan, plan
