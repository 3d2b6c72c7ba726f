"""The package's own statements, attacked as test_sql_security.py attacks its SQL functions
(issue 35; docs/concepts/security.md, "Statements of the package").

The worker's statements are not SECURITY DEFINER, but they run as the application's role,
usually the owner of the tables: a role with CREATE on the schema of the tables that plants an
operator or a function which is a better match than pg_catalog's, for the types a statement
passes, has its code run with the application's rights. Before issue 35, EXPLAIN showed the
claim calling a public dbqueue_serial_turn(varchar, bigint), the wake-up look a public
hashtext(varchar), and so on. Every statement of the package now calls exactly typed (a
varchar column cast to text, a parameter cast to its type) or schema-qualified (the
polymorphic and variadic functions: unnest, json_agg, jsonb_build_object, ...) operators and
functions, so that pg_catalog's, searched first, is the exact match.

The attacker of test_sql_security.py plants its shadows (its operator and function sweeps, for
every name the package's statements call as well as the functions' bodies, and aggregates over
the sweep's types), each recording the statement that ran it. Then a whole worker cycle runs as
the application: enqueues of every kind, plain, fair and limited claims, completions, retries,
dead letters, heartbeats, the sweeper's rescue, cancels, a requeue, a signal, steps, the wake-up,
the scheduler, pause and resume, deliveries, the rollup, retention, the status command, the
metrics and every admin page. No planted body may have run from a statement of the package.
Django's own ORM statements are not the package's to type (CVE-2018-1058, docs/sql.md): the
test shows that they do reach the plants (so that the plants are known to work) and leaves them
aside, by the double-quoted table names that Django writes and the package never does.
"""

import contextlib
import io
import pathlib
import re
import threading

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import ProgrammingError
from django.urls import reverse

import django_dbqueue
from django_dbqueue import (
    cancel,
    enqueue,
    enqueue_many,
    metrics,
    pause_queue,
    publish,
    resume_queue,
    schedule_job,
    signal_job,
    store,
)
from django_dbqueue import registry as job_registry
from django_dbqueue.conf import get_settings
from django_dbqueue.deliveries import deliver
from django_dbqueue.models import ScheduleEntry
from django_dbqueue.sweeper import Sweeper
from tests.integration.conftest import FAST
from tests.integration.test_sql_security import (  # noqa: F401 (owner, attacker: fixtures)
    PLANTER,
    SCALARS,
    _called_names,
    attacker,
    function_shadows,
    operator_shadows,
    owner,
    plant,
    written_shadows,
)
from tests.utils import job_row, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

# The attacker's record of each planted body that ran: what, as whom, and the statement (the
# top-level text of the session that ran it, current_query()).
RECORDER = """
CREATE TABLE public.dbq_evil_log (what text, by_user name, query text);
GRANT INSERT, SELECT ON public.dbq_evil_log TO PUBLIC;
CREATE FUNCTION public.dbq_evil_ran(what text) RETURNS boolean LANGUAGE plpgsql AS $b$
BEGIN
    INSERT INTO public.dbq_evil_log (what, by_user, query)
    VALUES (what, current_user, pg_catalog.current_query());
    RETURN true;
END
$b$;
"""

# Django writes every table name of its SQL in double quotes; the package's statements never do.
DJANGO = re.compile(r'"(dbqueue|django|auth|testapp)_[a-z_]+"')


def statement_names():
    """Every name the package's Python source calls like a function: the SQL functions its
    statements call among them (the others match nothing in pg_proc)."""
    root = pathlib.Path(django_dbqueue.__file__).parent
    names = set()
    for path in root.rglob("*.py"):
        if "migrations" not in path.parts:
            names.update(re.findall(r"([a-z_][a-z0-9_]*)\s*\(", path.read_text()))
    return names


def aggregate_shadows(session, names):
    """An aggregate in public over each type of the sweep that pg_catalog has no aggregate of
    that name for (count(text), json_agg(bigint), ...), for every aggregate among ``names``:
    a polymorphic or "any" one of pg_catalog would otherwise be chosen by a cast."""
    ddl = []
    for t in SCALARS:
        fn = "public.dbq_evil_aggs_" + re.sub(r"\W", "_", t)
        ddl.append(
            f"CREATE FUNCTION {fn}(s {t}[], v {t}) RETURNS {t}[] LANGUAGE plpgsql AS $b$"
            f" BEGIN PERFORM public.dbq_evil_ran('aggregate over {t}');"
            f" RETURN pg_catalog.array_append(s, v); END $b$"
        )
    for name, t in session.run(
        """
        SELECT DISTINCT p.proname, t
        FROM pg_proc AS p, unnest(%s::text[]) AS t
        WHERE p.prokind = 'a' AND p.pronamespace = 'pg_catalog'::regnamespace
          AND p.proname = ANY(%s) AND to_regprocedure('pg_catalog.' || p.proname || '(' || t || ')')
              IS NULL
        """,
        [SCALARS, sorted(names)],
    ):
        fn = "public.dbq_evil_aggs_" + re.sub(r"\W", "_", t)
        ddl.append(f"CREATE AGGREGATE public.{name}({t}) (SFUNC = {fn}, STYPE = {t}[])")
    return ddl


@pytest.fixture
def planted(owner, attacker):  # noqa: F811 - test_sql_security's fixtures, imported above
    """The attacker's shadows, planted; yields a function returning what ran since, as
    ``[(what, query)]`` of the package's statements and the number of Django's."""
    attacker.run(RECORDER)
    attacker.run(PLANTER)
    names = sorted(set(_called_names(owner)) | statement_names())
    shadows = (
        operator_shadows(owner)
        + function_shadows(owner, names=names)
        + written_shadows()
        + aggregate_shadows(owner, names)
    )
    assert plant(attacker, shadows) > 3000

    def ran():
        rows = owner.run("SELECT DISTINCT what, query FROM public.dbq_evil_log")
        ours = sorted({(what, query) for what, query in rows if not DJANGO.search(query)})
        return ours, sum(1 for _, query in rows if DJANGO.search(query))

    return ran


def _hold(ctx):
    """Runs until its cancel arrives (the heartbeat carries it, or the notification)."""
    while not ctx.cancelled:
        threading.Event().wait(0.02)
    ctx.raise_if_cancelled()


def _steps(ctx):
    ctx.step("one", lambda: {"n": 1})
    return ctx.wait_for_signal("go", timeout=30)


def _flaky(ctx):
    if ctx.attempt == 1:
        raise ValueError("first attempt fails")
    return ctx.attempt


def _deliver(ctx):
    with deliver(ctx, f"stmt-delivery:{ctx.id}") as delivery:
        if delivery.proceed:
            delivery.sent("provider-ref")


TYPES = {
    "stmt-hold": (_hold, {"lease": 1.0}),
    "stmt-steps": (_steps, {}),
    "stmt-flaky": (_flaky, {"max_attempts": 3}),
    "stmt-dead": (lambda ctx: 1 / 0, {"max_attempts": 1}),
    "stmt-deliver": (_deliver, {}),
    "stmt-fair": (lambda ctx: None, {"queue": "tenants", "fair_key": lambda p: p["tenant"]}),
    "stmt-fair-batch": (
        lambda batch: None,
        {"queue": "tenants", "fair_key": lambda p: p["tenant"], "batch_size": 4},
    ),
    "stmt-batch": (lambda batch: None, {"queue": "batches", "batch_size": 4}),
    "stmt-limited": (lambda ctx: None, {"queue": "limited"}),
    "stmt-ghost": (lambda ctx: None, {"lease": 0.2}),
}


@pytest.fixture
def cycle_settings(fast_settings):
    fast_settings.DBQUEUE = {
        **FAST,
        "QUEUES": {
            "default": {},
            "emails": {},
            "batches": {},
            "tenants": {"fair": True},
            "limited": {
                "global_concurrency": 2,
                "rate_limit": {"limit": 100, "period": 60, "key": "acct"},
            },
        },
        "SCHEDULE": {"stmt-tick": {"type": "echo", "every": 1}},
    }
    for name, (func, options) in TYPES.items():
        job_registry.job(name, **options)(func)
    yield fast_settings
    for name in TYPES:
        job_registry.unregister(name)


def page(client, url):
    """GET an admin page: 200, or Django's own SQL (an ORM lookup such as ``errors #>> '{-1,
    class}'``) made ambiguous by the plants, which is not the package's statement to type."""
    try:
        response = client.get(url)
    except ProgrammingError as exc:
        assert "is not unique" in str(exc) and DJANGO.search(str(exc)), (url, exc)
        return
    assert response.status_code == 200, url


def done(job_id, state="done"):
    wait_until(lambda: job_row(job_id)["state"] == state, timeout=20, message=f"#{job_id} {state}")


def test_a_worker_cycle_runs_no_planted_body_from_a_statement_of_the_package(
    planted, cycle_settings, start_worker, client, monkeypatch
):
    database = get_settings().DATABASE
    # -- enqueues of every kind, before any worker runs
    plain = enqueue("echo", {"a": [1, "x"]}).id
    keyed = enqueue("echo", idempotency_key="stmt-key").id
    assert enqueue("echo", idempotency_key="stmt-key").id == keyed
    unique = enqueue("unique-record", {"key": "u1"}).id
    debounced = enqueue("echo", unique_key="d1", unique_while="pending", debounce=True).id
    serial = [enqueue("serial-record", {"account": "a1"}).id for _ in range(2)]
    fair = [job.id for job in enqueue_many([("stmt-fair", {"tenant": t}) for t in "aabc"])]
    fair_batch = [
        j.id for j in enqueue_many([("stmt-fair-batch", {"tenant": t}) for t in "abcabcab"])
    ]
    batch = [job.id for job in enqueue_many([("stmt-batch", {"n": n}) for n in range(9)])]
    limited = [
        job.id for job in enqueue_many([("stmt-limited", {"acct": f"x{n % 2}"}) for n in range(4)])
    ]
    parent = enqueue("echo", {"p": 1}).id
    child = enqueue("echo", {"c": 1}, depends_on=[parent]).id
    later = enqueue("echo", delay=3600).id
    store.run_now(database, [later])
    flaky = enqueue("stmt-flaky").id
    dead = enqueue("stmt-dead").id
    steps = enqueue("stmt-steps").id
    delivering = enqueue("stmt-deliver").id
    held = enqueue("stmt-hold").id
    event = publish("test.invoice.paid", {"invoice": 7}, idempotency_key="stmt-event")
    schedule_job("stmt-stored", "echo", every=1)
    pause_queue("emails", by="test")
    emailed = enqueue("echo", queue="emails").id

    # -- a ghost's claim whose lease runs out: the sweeper takes it back
    ghost = enqueue("stmt-ghost").id
    ghost_token = store.new_token()
    taken = store.claim(
        database, worker_id="ghost", queues=["default"], limits=[50], limit=50, token=ghost_token
    )
    ghost_held = [(job.id, ghost_token) for job in taken if job.id != ghost]
    store.release(database, ghost_held)  # the others back, unspent

    # -- two workers: the plain and fair claims (and batches), the limited claim
    start_worker(queues=["default", "emails", "batches", "tenants"], concurrency=4)
    start_worker(queues=["limited"], concurrency=2)
    for job_id in [plain, keyed, unique, debounced, *serial, *fair, *fair_batch, *batch]:
        done(job_id)
    for job_id in [*limited, parent, child, later, flaky, delivering, ghost]:
        done(job_id)
    done(dead, "dead")
    store.requeue(database, [dead])
    done(dead, "dead")
    wait_until(lambda: job_row(steps)["wait_reason"] == "signal:go", message="the wait")
    signal_job(steps, "go", {"went": True})
    done(steps)
    wait_until(lambda: job_row(held)["state"] == "running", message="the held job running")
    beat = job_row(held)["leased_until"]
    wait_until(lambda: job_row(held)["leased_until"] > beat, message="a heartbeat")
    cancel(held)
    done(held, "cancelled")
    resume_queue("emails", by="test")
    done(emailed)
    for job_id, *_ in store.event_jobs(database, event.id):
        done(job_id)
    wait_until(
        lambda: (
            store.schedule_status(database)[0]["stmt-tick"][1] is not None
            and ScheduleEntry.objects.get(name="stmt-stored").last_enqueued is not None
        ),
        timeout=20,
        message="a tick of each schedule enqueued",
    )

    # -- the maintenance a worker runs, and what operators and the admin read
    Sweeper().run_once()
    store.rollup_minute(database, queues=["default"], bounds=[0.1, 1.0], catch_up=3600)
    store.prune(database, state="done", age=0, limit=10)
    store.prune_events(database, age=0, limit=10)
    store.prune_rollup(database, age=0, limit=10)
    store.status(database, ["default"])
    store.job_status(database, plain)
    store.metrics_snapshot(database)
    # What the job pages read with the package's statements (the pages themselves run ORM
    # lookups of Django's that the plants may make ambiguous: see page()).
    store.job_steps(database, steps, limit=10, chars=100)
    store.list_steps(database, steps)
    store.workflow_neighbours(database, child)
    store.dependency_results(database, child)
    store.event(database, event.id)
    store.delivery(database, f"stmt-delivery:{delivering}")
    store.live_workers(database)
    store.flow_state(database)
    store.rate_window(database, scope="queue", name="limited", part="x0", limit=100, period=60)
    store.dead_ids(database, job_type="stmt-dead", queue="default")
    store.count_dead(database, job_type="stmt-dead")
    store.requeue_blocked(database, [dead])
    store.delete_finished(database, [plain])
    out = io.StringIO()
    with contextlib.suppress(SystemExit):  # exit 1: there is a dead letter
        call_command("jobqueue_status", stdout=out, stderr=out)
    call_command("jobqueue_status", "--job", str(steps), stdout=out)
    client.force_login(User.objects.create_superuser("stmt-boss", password="pw"))
    collector = metrics.TableCollector(cache=0)  # the metrics page's, closed below
    monkeypatch.setattr(metrics, "_table_collector", collector)
    try:
        assert client.get("/dbqueue-metrics/").status_code in (200, 501)
    finally:
        collector.close()
    for url in [
        reverse("admin:django_dbqueue_backgroundjob_changelist"),
        reverse("admin:django_dbqueue_backgroundjob_change", args=[dead]),
        reverse("admin:django_dbqueue_backgroundjob_change", args=[steps]),
        reverse("admin:django_dbqueue_deadletter_changelist"),
        reverse("admin:django_dbqueue_dashboard"),
        reverse("admin:django_dbqueue_workerrecord_changelist"),
        reverse("admin:django_dbqueue_queuestate_changelist"),
        reverse("admin:django_dbqueue_event_changelist"),
        reverse("admin:django_dbqueue_jobdelivery_changelist"),
    ]:
        page(client, url)

    ours, djangos = planted()
    assert djangos > 0  # the plants work: Django's ORM statements (not ours to type) reach them
    assert ours == []
