"""A hostile review of the SQL doors of issue 35 (migration 0026, docs/sql.md "Privileges"):
what a role with exactly the documented producer grants, CREATE on public and TEMP can still do
to other callers. Each finding is an xfail(strict=True) test: it passes once the finding is
fixed, and then the marker must go.

The producer is a role of its own, connected as itself (no SET ROLE: nothing of the superuser's
session is left to it), with EXECUTE on dbqueue_enqueue() and dbqueue_enqueue_many() (the
documented producer grant), CREATE on public (PostgreSQL's default before 15, and what the
hardening of 0026 was written against) and TEMP (PUBLIC's default on a database). Its victims
are the other callers: a superuser running the calls docs/sql.md shows, the application's
trigger, and publish()/replay_event() on Django's connection.
"""

import contextlib
import datetime
import hashlib
import pathlib

import psycopg
import pytest
from django.db import connection, transaction

from django_dbqueue import enqueue, publish, replay_event
from django_dbqueue.checks import check_schema_writers
from django_dbqueue.connections import connection_params
from django_dbqueue.exceptions import EnqueueError
from django_dbqueue.scheduler import Scheduler
from tests.utils import job_row, scalar

pytestmark = pytest.mark.django_db(transaction=True)

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"

PRODUCER_GRANT = (
    "GRANT EXECUTE ON FUNCTION dbqueue.dbqueue_enqueue(text, jsonb, text, int, timestamptz,"
    " interval, int, double precision, text, text, text, boolean, text),"
    " dbqueue.dbqueue_enqueue_many(jsonb) TO {role}"
)


class Session:
    """An autocommit psycopg connection that keeps the notices it receives."""

    def __init__(self, **params):
        self.conn = psycopg.connect(**params, autocommit=True)
        self.notices = []
        self.conn.add_notice_handler(lambda diag: self.notices.append(diag.message_primary))

    def run(self, sql, params=None):
        cur = self.conn.execute(sql, params, prepare=False)
        return cur.fetchall() if cur.description else None

    def close(self):
        self.conn.close()


def _role():
    digest = hashlib.md5(connection.settings_dict["NAME"].encode()).hexdigest()[:10]
    return f"dbq_review_producer_{digest}"


@pytest.fixture
def owner():
    """A superuser session: the owner of the functions, as an operator or a worker connects."""
    session = Session(**connection_params("default"))
    yield session
    session.close()


@pytest.fixture
def producer(owner):
    """A session of a role with exactly the producer's grants, CREATE on public and TEMP."""
    role = _role()
    password = hashlib.sha256(role.encode()).hexdigest()
    with contextlib.suppress(psycopg.Error):
        owner.run(f"DROP OWNED BY {role} CASCADE")
    owner.run(f"DROP ROLE IF EXISTS {role}")
    owner.run(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    owner.run(f"GRANT CREATE ON SCHEMA public TO {role}")
    owner.run(PRODUCER_GRANT.format(role=role))
    session = Session(**{**connection_params("default"), "user": role, "password": password})
    session.role = role
    # What the producer's planted functions record: who ran them. Owned by the producer,
    # writable by anybody, so a body running as its victim can write it.
    session.run("CREATE TABLE public.dbq_review_ran (what text, by_user name)")
    session.run("GRANT INSERT, SELECT ON public.dbq_review_ran TO PUBLIC")
    try:
        yield session
    finally:
        session.close()
        owner.run(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
        )
        owner.run(f"DROP OWNED BY {role} CASCADE")
        owner.run(f"DROP ROLE {role}")


def ran_as(owner):
    return owner.run("SELECT what, by_user::text FROM public.dbq_review_ran ORDER BY 1")


# -- finding 1: an overload planted in public runs as whoever makes the documented calls -----------

HIJACKS = """
CREATE FUNCTION public.dbqueue_enqueue(job_type text, payload text) RETURNS bigint
LANGUAGE plpgsql AS $b$
BEGIN
    INSERT INTO public.dbq_review_ran VALUES ('dbqueue_enqueue(text, text)', current_user);
    RETURN -1;
END $b$;
CREATE FUNCTION public.dbqueue_enqueue_many(jobs text) RETURNS bigint[]
LANGUAGE plpgsql AS $b$
BEGIN
    INSERT INTO public.dbq_review_ran VALUES ('dbqueue_enqueue_many(text)', current_user);
    RETURN '{}';
END $b$;
CREATE FUNCTION public.dbqueue_debounce(job_type text, payload text, unique_key text,
                                        delay interval)
RETURNS bigint LANGUAGE plpgsql AS $b$
BEGIN
    INSERT INTO public.dbq_review_ran VALUES ('dbqueue_debounce(text, text, text, interval)',
                                              current_user);
    RETURN -1;
END $b$;
"""


# Fixed by migration 0029: the doors are in the schema dbqueue, where only their owner can create
# a function, and docs/sql.md shows only calls qualified with it, which PostgreSQL resolves in
# that schema alone. An unqualified call (the old names, now wrappers in public) is as safe as
# the schemas on its caller's search_path: the database check dbqueue.W005 names the roles that
# can create objects there.
def test_a_producers_overload_never_runs_as_the_caller_of_the_documented_calls(owner, producer):
    producer.run(HIJACKS)
    # The calls as docs/sql.md writes them (its error example, its debounce example, and a
    # psql-style batch), made by a superuser, whose session's search_path is the default one.
    [(job_id,)] = owner.run("""SELECT dbqueue.dbqueue_enqueue('noop', '{"a": 1}')""")
    [(ids,)] = owner.run("""SELECT dbqueue.dbqueue_enqueue_many('[["noop", {"b": 2}]]')""")
    [(debounced,)] = owner.run(
        """SELECT dbqueue.dbqueue_debounce('noop', '{"shop": 7}', 'reindex:7',
                                           delay => interval '30 seconds')"""
    )
    assert ran_as(owner) == []  # no body of the producer's ran, as anybody
    assert job_row(job_id)["payload"] == {"a": 1}
    assert [job_row(i)["payload"] for i in ids] == [{"b": 2}]
    assert job_row(debounced)["unique_key"] == "reindex:7"
    assert not owner.run("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [producer.role])[0][0]
    # Nobody but the owner can create a function where the doors are.
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        producer.run(HIJACKS.replace("public.dbqueue_", "dbqueue.dbqueue_"))
    # The producer's CREATE on public is what the database check names.
    warnings = check_schema_writers(databases=["default"])
    assert [w.id for w in warnings] == ["dbqueue.W005"]
    assert producer.role in warnings[0].msg and "'public'" in warnings[0].msg
    assert f"REVOKE CREATE ON SCHEMA public FROM {producer.role}" in warnings[0].hint


# -- finding 2: an overload with the trigger's own signature makes every INSERT of the table fail --

TRIGGER = """
CREATE TABLE public.dbq_review_order (id bigint PRIMARY KEY);
CREATE FUNCTION public.dbq_review_order_created() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM dbqueue.dbqueue_enqueue(
        'send-order-confirmation',
        jsonb_build_object('order_id', NEW.id),
        queue => 'emails',
        idempotency_key => 'order-confirmation:' || NEW.id
    );
    RETURN NEW;
END
$$;
CREATE TRIGGER dbq_review_order_created AFTER INSERT ON public.dbq_review_order
FOR EACH ROW EXECUTE FUNCTION public.dbq_review_order_created();
"""


@pytest.fixture
def shop_trigger(owner):
    owner.run(TRIGGER)
    yield
    owner.run("DROP TABLE IF EXISTS public.dbq_review_order")
    owner.run("DROP FUNCTION IF EXISTS public.dbq_review_order_created()")


# Fixed by migration 0029: the trigger of docs/sql.md calls dbqueue.dbqueue_enqueue(), which an
# overload in public cannot make ambiguous.
def test_a_producers_overload_does_not_make_the_documented_trigger_fail(
    owner, producer, shop_trigger
):
    with connection.cursor() as cursor:  # the trigger works (another session than owner's,
        cursor.execute("INSERT INTO public.dbq_review_order VALUES (1)")  # which caches no plan)
    producer.run(
        """
        CREATE FUNCTION public.dbqueue_enqueue(job_type text, payload jsonb, queue text,
                                               idempotency_key text)
        RETURNS bigint LANGUAGE sql AS $b$ SELECT -1::bigint $b$
        """
    )
    owner.run("INSERT INTO public.dbq_review_order VALUES (2)")  # was ambiguous before 0029
    assert (
        scalar(
            "SELECT count(*) FROM dbqueue_job WHERE idempotency_key LIKE 'order-confirmation:%%'"
        )
        == 2
    )


# -- finding 3: the package's own idempotency keys are in the producers' namespace ----------------


def _next_event_id():
    return scalar(
        "SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END "
        "FROM dbqueue_event_id_seq"
    )


def _plant(producer, key):
    """The producer tries to take ``key`` with a job of its own choosing (type and payload),
    through each of its doors: each refuses, naming the key (migration 0029)."""
    calls = [
        (
            "SELECT dbqueue_enqueue('noop', '{\"planted\": true}'::jsonb, idempotency_key => %s)",
            "dbqueue_enqueue: idempotency_key ",
        ),
        (
            "SELECT dbqueue_enqueue_many(jsonb_build_array(jsonb_build_object("
            "'type', 'noop', 'payload', '{\"planted\": true}'::jsonb, 'idempotency_key', %s::text)))",
            "dbqueue_enqueue_many: jobs[0]: idempotency_key ",
        ),
    ]
    for sql, start in calls:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            producer.run(sql, [key])
        message = caught.value.diag.message_primary
        assert message.startswith(start), message
        assert "reserved for the keys of the package's own jobs" in message
    with pytest.raises(EnqueueError, match="reserved for the keys of the package's own jobs"):
        enqueue("noop", {"planted": True}, idempotency_key=key)
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE idempotency_key = %s", [key]) == 0


def test_a_producer_cannot_make_publish_fail_by_taking_an_event_key(producer):
    first = _next_event_id()
    for event_id in range(first, first + 5):  # the next five events, for one subscriber
        _plant(producer, f"dbqueue:event:{event_id}:email-on-paid")
    with transaction.atomic():
        event = publish("test.invoice.paid", {"invoice": 7})
    assert sorted(job.type for job in event.jobs) == [
        "email-on-paid",
        "flaky-on-paid",
        "ledger-on-paid",
    ]
    for job in event.jobs:
        row = job_row(job.id)
        assert (row["type"], row["event_id"], row["payload"]) == (
            job.type,
            event.id,
            {"invoice": 7},
        )


def test_a_producer_cannot_make_a_replay_skip_a_subscriber(producer):
    event = publish("test.invoice.paid", {"invoice": 8})
    _plant(producer, f"dbqueue:event:{event.id}:late-subscriber")
    made = replay_event(event.id, ["late-subscriber"])
    assert [job.type for job in made] == ["late-subscriber"]
    assert job_row(made[0].id)["event_id"] == event.id


def test_a_producer_cannot_stand_in_for_a_periodic_job(producer, settings):
    settings.DBQUEUE = {
        "QUEUES": {"default": {}},
        "SCHEDULE": {
            "hourly": {"every": 3600, "type": "echo", "payload": {"a": 1}, "catch_up": "all"}
        },
    }
    Scheduler().run_once()  # first sight: the entry gets its row
    with connection.cursor() as cursor:  # its last tick just before the latest whole hour
        cursor.execute(
            "UPDATE dbqueue_schedule SET last_tick = to_timestamp("
            "floor(extract(epoch FROM now()) / 3600) * 3600 - 1) WHERE name = 'hourly' "
            "RETURNING last_tick + interval '1 second'"
        )
        tick = cursor.fetchone()[0]
    key = f"dbqueue-schedule:hourly:{tick.astimezone(datetime.UTC).isoformat()}"
    _plant(producer, key)
    Scheduler().run_once()
    row = job_row(scalar("SELECT id FROM dbqueue_job WHERE idempotency_key = %s", [key]))
    assert (row["type"], row["payload"]) == ("echo", {"a": 1})


# -- finding 9: the debounce grant sets another producer's run_after, earlier included ------------
# docs/sql.md said the grant lets a role "push back" the run_after; it sets it to this call's,
# as enqueue(debounce=True) does (the last call wins: a debounce resets the timer). The docs now
# say so, and that the role can make such a job due now.


def test_the_debounce_grant_sets_another_producers_run_after_as_the_docs_say(owner, producer):
    owner.run(
        "GRANT EXECUTE ON FUNCTION dbqueue.dbqueue_debounce(text, jsonb, text, text, int, timestamptz,"
        f" interval, int, double precision, text) TO {producer.role}"
    )
    job = enqueue(
        "noop",
        {"report": "monthly"},
        unique_key="monthly-report",
        unique_while="pending",
        delay=30 * 86400,
    )
    before = job_row(job.id)["run_after"]
    [(same,)] = producer.run(
        "SELECT dbqueue_debounce('noop', '{}'::jsonb, 'monthly-report', run_after => now())"
    )
    assert same == job.id
    assert job_row(job.id)["run_after"] < before  # made due now, as documented
    assert job_row(job.id)["payload"] == {}
    # Python's door does the same.
    enqueue(
        "noop",
        {"n": 2},
        unique_key="monthly-report",
        unique_while="pending",
        debounce=True,
        delay=86400,
    )
    again = job_row(job.id)["run_after"]
    assert again > before - datetime.timedelta(days=29)
    enqueue(
        "noop",
        {"n": 3},
        unique_key="monthly-report",
        unique_while="pending",
        debounce=True,
        delay=0,
    )
    assert job_row(job.id)["run_after"] < again
    with open(DOCS / "sql.md", encoding="utf-8") as docs:
        text = " ".join(docs.read().split())
    assert "earlier or later than the one it replaces" in text
    assert "push back the `run_after`" not in text


# -- finding 10: a run_after offset PostgreSQL refuses is not the function's named refusal ------


def test_enqueue_many_names_the_item_of_an_offset_out_of_range(producer):
    with pytest.raises(psycopg.Error) as caught:
        producer.run(
            "SELECT dbqueue_enqueue_many(%s::jsonb)",
            ['[{"type": "noop"}, {"type": "noop", "run_after": "2030-01-01T00:00:00+16:00"}]'],
        )
    assert caught.value.sqlstate == "22023"
    assert str(caught.value).startswith("dbqueue_enqueue_many: jobs[1]: run_after")


# -- finding 11: refusing a deep payload copies it once per level -------------------------------

TEMP_BYTES = "SELECT temp_bytes FROM pg_stat_database WHERE datname = current_database()"


def _temp_bytes(owner, flushing):
    """The database's temp_bytes, after ``flushing`` (a session) reported its statistics."""
    flushing.run("SELECT pg_stat_force_next_flush()")
    flushing.run("SELECT 1")  # the flush happens as this statement's transaction ends
    return owner.run(TEMP_BYTES)[0][0]


def test_refusing_a_deep_payload_costs_about_its_size(owner, producer):
    producer.run("SET work_mem = '4MB'")  # the default, whatever the server's is
    deep = "('{\"a\":' || repeat('[', 101) || '\"' || repeat('x', 2000000) || '\"' || " + (
        "repeat(']', 101) || '}')::jsonb"
    )
    size = producer.run(f"SELECT pg_column_size({deep})")[0][0]
    before = _temp_bytes(owner, producer)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="nested more than 100"):
        producer.run(f"SELECT dbqueue_enqueue('noop', {deep})")
    written = _temp_bytes(owner, producer) - before
    assert written < 10 * size, f"{written:,} bytes of temporary files for a {size:,}-byte payload"
