"""dbqueue_enqueue() and dbqueue_enqueue_many() (migration 0022, docs/sql.md): the rows enqueue()
writes, every refusal naming its argument, idempotency and unique keys, rollbacks, a trigger,
psql, a raw psycopg connection, and workers that run the jobs and are woken at the commit."""

import datetime
import os
import shutil
import subprocess
import time

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from django_dbqueue import enqueue
from django_dbqueue.store.wakeups import _wakeup_wanted
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

# Every column but the ones that differ by nature between two jobs enqueued one after the other.
VARYING = {"id", "created_at", "run_after"}


def _params():
    settings = connection.settings_dict
    return {
        "dbname": settings["NAME"],
        "user": settings["USER"],
        "host": settings["HOST"],
        "port": settings["PORT"] or 5432,
        "password": settings["PASSWORD"] or None,
    }


@pytest.fixture
def raw():
    """A plain psycopg connection, as a service in another language would hold one."""
    with psycopg.connect(**_params(), autocommit=True) as conn:
        yield conn


def sql_enqueue(conn, *args, function="dbqueue_enqueue", **kwargs):
    """``SELECT dbqueue_enqueue(...)`` (or ``function``) with named arguments (``name =>
    value``)."""
    parts = ["%s"] * len(args) + [f"{name} => %s" for name in kwargs]
    row = conn.execute(
        f"SELECT {function}({', '.join(parts)})", [*args, *kwargs.values()]
    ).fetchone()
    return row[0]


def columns(job_id):
    row = job_row(job_id)
    return {name: value for name, value in row.items() if name not in VARYING}


# -- the rows -------------------------------------------------------------------------------------


def test_the_row_is_the_one_enqueue_writes(raw):
    python = enqueue("echo", {"a": [1, "x"]}, queue="emails", priority=7, max_attempts=3)
    sql = sql_enqueue(
        raw,
        "echo",
        psycopg.types.json.Jsonb({"a": [1, "x"]}),
        queue="emails",
        priority=7,
        max_attempts=3,
        lease_seconds=job_row(python.id)["lease_seconds"],
    )
    assert columns(sql) == columns(python.id)
    row = job_row(sql)
    assert row["run_after"] == row["created_at"]  # due at once, by the database's clock


def test_defaults_are_the_dbqueue_defaults_of_a_type_without_options(raw, settings):
    settings.DBQUEUE = {"QUEUES": {"default": {}, "emails": {}}}  # MAX_ATTEMPTS 10, LEASE 60
    python = enqueue("noop")
    sql = sql_enqueue(raw, "noop")
    assert columns(sql) == columns(python.id)
    assert (job_row(sql)["max_attempts"], job_row(sql)["lease_seconds"]) == (10, 60.0)
    # NULL is the default too (a trigger passing a nullable column)
    nulls = sql_enqueue(raw, "noop", None, queue=None, priority=None, max_attempts=None)
    assert columns(nulls) == columns(python.id)


@pytest.mark.parametrize(
    "python_kwargs, sql_kwargs",
    [
        ({"idempotency_key": "k-1"}, {"idempotency_key": "k-1"}),
        ({"serial_key": "account-7"}, {"serial_key": "account-7"}),
        ({"unique_key": "u-1"}, {"unique_key": "u-1"}),
        (
            {"unique_key": "u-2", "unique_while": "pending", "debounce": True},
            {"unique_key": "u-2", "function": "dbqueue_debounce"},
        ),
    ],
)
def test_keys_are_written_as_enqueue_writes_them(raw, python_kwargs, sql_kwargs):
    python = job_row(enqueue("noop", **python_kwargs).id)
    with connection.cursor() as cursor:  # the key is free again for the SQL call
        cursor.execute("DELETE FROM dbqueue_job")
    sql = sql_enqueue(
        raw,
        "noop",
        max_attempts=python["max_attempts"],
        lease_seconds=python["lease_seconds"],
        **sql_kwargs,
    )
    got = {k: v for k, v in job_row(sql).items() if k not in VARYING}
    assert got == {k: v for k, v in python.items() if k not in VARYING}


@pytest.mark.parametrize(
    "payload", [[1, "x", {"a": None}], [], "text", "", 42, -1.5, 10**40, True, False, None, {}]
)
def test_any_payload_enqueue_takes_is_taken_and_read_back_as_enqueue_writes_it(
    raw, start_worker, payload
):
    python = job_row(enqueue("echo", payload).id)["payload"]
    sql = sql_enqueue(raw, "echo", psycopg.types.json.Jsonb(payload))
    many = raw.execute(
        "SELECT dbqueue_enqueue_many(%s::jsonb)",
        [psycopg.types.json.Jsonb([["echo", payload], {"type": "echo", "payload": payload}])],
    ).fetchone()[0]
    assert python == ({} if payload is None else payload)  # None is the empty object
    for job_id in [sql, *many]:
        assert job_row(job_id)["payload"] == python
    start_worker()
    for job_id in [sql, *many]:
        wait_until(lambda j=job_id: job_row(j)["state"] == "done", message=f"job {job_id}")
        assert job_row(job_id)["result"] == python  # what the handler read as ctx.payload


def test_run_after_and_delay(raw):
    at = timezone.now() + datetime.timedelta(hours=1)
    job_id = sql_enqueue(raw, "noop", run_after=at)
    assert job_row(job_id)["run_after"] == at
    delayed = job_row(sql_enqueue(raw, "noop", delay=datetime.timedelta(seconds=90)))
    assert (delayed["run_after"] - delayed["created_at"]).total_seconds() == 90


# -- the refusals ---------------------------------------------------------------------------------

LONG = "x" * 301


@pytest.mark.parametrize(
    "args, kwargs, fragment",
    [
        ([None], {}, "job_type must be a non-empty string of at most 200 characters, got NULL"),
        ([""], {}, "job_type must be a non-empty string"),
        (["x" * 201], {}, "job_type must be a non-empty string of at most 200"),
        (["noop"], {"queue": ""}, "queue must be a non-empty string of at most 100"),
        (["noop"], {"queue": "q" * 101}, "queue must be a non-empty string"),
        (["noop"], {"priority": 101}, "priority must be an integer from -100 to 100"),
        (["noop"], {"priority": -101}, "priority must be an integer from -100 to 100"),
        (
            ["noop"],
            {
                "run_after": datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC),
                "delay": datetime.timedelta(1),
            },
            "pass run_after or delay, not both",
        ),
        (["noop"], {"delay": datetime.timedelta(seconds=-1)}, "delay must be an interval from 0"),
        (["noop"], {"delay": datetime.timedelta(days=3651)}, "delay must be an interval from 0"),
        (["noop"], {"max_attempts": 0}, "max_attempts must be an integer from 1"),
        (
            ["noop"],
            {"lease_seconds": 0},
            "lease_seconds must be a number of seconds greater than 0",
        ),
        (["noop"], {"lease_seconds": 86401}, "lease_seconds must be a number of seconds"),
        (["noop"], {"lease_seconds": float("nan")}, "lease_seconds must be a number of seconds"),
        (["noop"], {"idempotency_key": ""}, "idempotency_key must be a non-empty string"),
        (["noop"], {"idempotency_key": LONG}, "idempotency_key must be a non-empty string"),
        (["noop"], {"unique_key": LONG}, "unique_key must be a non-empty string"),
        (["noop"], {"serial_key": ""}, "serial_key must be a non-empty string"),
        (
            ["noop"],
            {"unique_key": "u", "unique_while": "done"},
            "unique_while must be 'pending' or 'active'",
        ),
        (["noop"], {"unique_while": "pending"}, "unique_while='pending' needs a unique_key"),
        (
            ["noop"],
            {"unique_key": "u", "unique_while": "pending", "debounce": True},
            "debounce => true is refused: it replaces the payload and run_after of the pending "
            "job that holds the unique key, which another caller may have enqueued, so it is "
            "dbqueue_debounce()'s, granted on its own",
        ),
        (
            ["noop"],
            {"unique_key": "u", "idempotency_key": "k"},
            "pass idempotency_key or unique_key, not both",
        ),
    ],
)
def test_every_refusal_names_its_argument(raw, args, kwargs, fragment):
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        sql_enqueue(raw, *args, **kwargs)
    assert caught.value.diag.message_primary.startswith("dbqueue_enqueue: ")
    assert fragment in caught.value.diag.message_primary
    assert caught.value.diag.message_hint
    assert scalar("SELECT count(*) FROM dbqueue_job") == 0


def test_an_infinite_run_after_is_refused(raw):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="run_after must be a finite"):
        raw.execute("SELECT dbqueue_enqueue('noop', run_after => 'infinity')")


# -- keys -----------------------------------------------------------------------------------------


def test_an_idempotency_key_returns_the_existing_job_also_one_enqueue_made(raw):
    python = enqueue("noop", idempotency_key="invoice-email:1")
    assert sql_enqueue(raw, "noop", idempotency_key="invoice-email:1") == python.id
    first = sql_enqueue(raw, "noop", idempotency_key="k2")
    assert sql_enqueue(raw, "noop", idempotency_key="k2") == first
    assert enqueue("noop", idempotency_key="k2").id == first
    assert scalar("SELECT count(*) FROM dbqueue_job") == 2


def test_a_unique_key_is_held_while_the_job_is_live_and_free_after(raw):
    first = sql_enqueue(raw, "noop", unique_key="report")
    assert sql_enqueue(raw, "noop", unique_key="report") == first
    assert enqueue("noop", unique_key="report").id == first
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET state = 'done', finished_at = now() WHERE id = %s", [first]
        )
    second = sql_enqueue(raw, "noop", unique_key="report")
    assert second != first


def test_unique_while_pending_frees_the_key_once_the_job_started(raw):
    first = sql_enqueue(raw, "noop", unique_key="r", unique_while="pending")
    with connection.cursor() as cursor:  # claimed once, back to pending for a retry
        cursor.execute("UPDATE dbqueue_job SET started_at = now() WHERE id = %s", [first])
    assert sql_enqueue(raw, "noop", unique_key="r", unique_while="pending") != first


def test_debounce_moves_the_pending_holder(raw):
    first = sql_enqueue(
        raw, "noop", psycopg.types.json.Jsonb({"n": 1}), "d", function="dbqueue_debounce"
    )
    again = sql_enqueue(
        raw,
        "noop",
        psycopg.types.json.Jsonb({"n": 2}),
        "d",
        function="dbqueue_debounce",
        delay=datetime.timedelta(minutes=5),
    )
    assert again == first
    row = job_row(first)
    assert row["payload"] == {"n": 2}
    assert 299 <= (row["run_after"] - row["created_at"]).total_seconds() <= 301


# -- transactions ---------------------------------------------------------------------------------


def test_a_rollback_leaves_no_job(raw):
    with raw.transaction(force_rollback=True):
        job_id = sql_enqueue(raw, "noop")
        assert raw.execute("SELECT count(*) FROM dbqueue_job WHERE id = %s", [job_id]).fetchone()[0]
    assert scalar("SELECT count(*) FROM dbqueue_job") == 0


def test_a_trigger_enqueues_a_job_when_a_row_is_inserted(raw):
    raw.execute("CREATE TABLE sql_enqueue_order (id bigserial PRIMARY KEY, email text NOT NULL)")
    try:
        raw.execute(
            """
            CREATE FUNCTION sql_enqueue_order_created() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM dbqueue_enqueue(
                    'echo',
                    jsonb_build_object('order_id', NEW.id, 'email', NEW.email),
                    idempotency_key => 'order-created:' || NEW.id
                );
                RETURN NEW;
            END $$;
            CREATE TRIGGER sql_enqueue_order_created AFTER INSERT ON sql_enqueue_order
            FOR EACH ROW EXECUTE FUNCTION sql_enqueue_order_created();
            """
        )
        order_id = raw.execute(
            "INSERT INTO sql_enqueue_order (email) VALUES ('a@example.com') RETURNING id"
        ).fetchone()[0]
        with raw.transaction(force_rollback=True):  # the order and its job roll back together
            raw.execute("INSERT INTO sql_enqueue_order (email) VALUES ('b@example.com')")
        rows = scalar("SELECT json_agg(payload ORDER BY id) FROM dbqueue_job")
        assert _json(rows) == [{"order_id": order_id, "email": "a@example.com"}]
    finally:
        raw.execute("DROP TABLE sql_enqueue_order")
        raw.execute("DROP FUNCTION sql_enqueue_order_created()")


def _json(value):
    import json

    return json.loads(value) if isinstance(value, str) else value


# -- the bulk form --------------------------------------------------------------------------------


def test_many_returns_the_ids_in_order_with_the_rows_enqueue_many_writes(raw):
    jobs = [
        {"type": "echo", "payload": {"i": 0}, "queue": "emails", "priority": 5},
        ["noop", {"i": 1}],
        {"type": "noop", "idempotency_key": "m1"},
        {"type": "noop", "idempotency_key": "m1"},
        {"type": "noop", "delay": 60, "serial_key": "s", "max_attempts": 2, "lease_seconds": 5},
    ]
    ids = raw.execute(
        "SELECT dbqueue_enqueue_many(%s)", [psycopg.types.json.Jsonb(jobs)]
    ).fetchone()[0]
    assert len(ids) == 5 and ids[2] == ids[3] and ids[:3] == sorted(ids[:3])
    assert scalar("SELECT count(*) FROM dbqueue_job") == 4
    first, delayed = job_row(ids[0]), job_row(ids[4])
    assert (first["type"], first["queue"], first["priority"], first["payload"]) == (
        "echo",
        "emails",
        5,
        {"i": 0},
    )
    assert job_row(ids[1])["payload"] == {"i": 1}
    assert (delayed["serial_key"], delayed["max_attempts"], delayed["lease_seconds"]) == (
        "s",
        2,
        5.0,
    )
    assert (delayed["run_after"] - delayed["created_at"]).total_seconds() == 60


@pytest.mark.parametrize(
    "jobs, fragment",
    [
        ({"type": "noop"}, "jobs must be a JSON array of objects"),
        ([{"type": "noop"}, 7], "jobs[1]: must be an object of dbqueue_enqueue() arguments"),
        ([{"type": "noop"}, {"payload": {}}], "jobs[1]: has no 'type'"),
        ([{"type": "noop", "unique_key": "u"}], "jobs[0]: has unknown keys {unique_key}"),
        ([{"type": 5}], "jobs[0]: type must be a string"),
        ([{"type": ""}], "jobs[0]: type must be a non-empty string"),
        (
            [{"type": "noop"}, {"type": "noop", "priority": 1.5}],
            "jobs[1]: priority must be an integer",
        ),
        ([{"type": "noop", "priority": 500}], "jobs[0]: priority must be an integer from -100"),
        ([{"type": "noop", "max_attempts": 0}], "jobs[0]: max_attempts must be an integer from 1"),
        ([{"type": "noop", "delay": -1}], "jobs[0]: delay must be a number of seconds from 0"),
        ([{"type": "noop", "run_after": "soon"}], "jobs[0]: run_after must be a timestamp"),
        ([{"type": "noop", "queue": 3}], "jobs[0]: queue must be a string"),
    ],
)
def test_many_checks_every_item_before_writing_and_names_its_index(raw, jobs, fragment):
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        raw.execute("SELECT dbqueue_enqueue_many(%s)", [psycopg.types.json.Jsonb(jobs)])
    assert caught.value.diag.message_primary.startswith("dbqueue_enqueue_many: ")
    assert fragment in caught.value.diag.message_primary
    assert scalar("SELECT count(*) FROM dbqueue_job") == 0


# -- security -------------------------------------------------------------------------------------


def test_the_functions_are_not_public_and_pin_their_search_path(raw):
    # (Migration 0026: the path names no schema a caller can write; tests/integration/
    # test_sql_security.py attacks them.)
    # (Migration 0029: the doors, SECURITY DEFINER, are in the schema dbqueue; under their old
    # names in public, wrappers that run as their caller forward to them, so anybody may call
    # a wrapper: the door checks the caller's EXECUTE.)
    rows = raw.execute(
        """
        SELECT p.proname, p.pronamespace::regnamespace::text, p.prosecdef, p.proconfig,
               has_function_privilege('public', p.oid, 'EXECUTE')
        FROM pg_proc AS p WHERE p.proname LIKE 'dbqueue\\_enqueue%%'
           OR p.proname IN ('dbqueue_wakeup_wanted', 'dbqueue_wake_at_commit',
                            'dbqueue_debounce')
        """
    ).fetchall()
    assert len(rows) == 17
    doors = {"dbqueue_enqueue", "dbqueue_enqueue_many", "dbqueue_debounce"}
    assert {(name, schema) for name, schema, *_ in rows if schema == "dbqueue"} == {
        (door, "dbqueue") for door in doors
    }
    for name, schema, definer, config, public in rows:
        wrapper = name in doors and schema == "public"
        assert public == wrapper, (name, schema)
        assert "search_path=pg_catalog, pg_temp" in config, (name, config)
        assert definer == (schema == "dbqueue"), (name, schema)


def test_a_role_granted_execute_only_can_enqueue_and_nothing_else(raw):
    role = "dbqueue_sql_enqueue_test_role"
    raw.execute(f"DROP ROLE IF EXISTS {role}")
    raw.execute(f"CREATE ROLE {role}")
    try:
        raw.execute(
            f"GRANT EXECUTE ON FUNCTION dbqueue.dbqueue_enqueue(text, jsonb, text, int, "
            f"timestamptz, interval, int, double precision, text, text, text, boolean, "
            f"text) TO {role}"
        )
        with raw.transaction(force_rollback=True):
            raw.execute(f"SET LOCAL ROLE {role}")
            job_id = sql_enqueue(raw, "noop", function="dbqueue.dbqueue_enqueue")
            assert job_id
            # and through the old name's wrapper, which forwards to the door
            assert sql_enqueue(raw, "noop") > job_id
            with pytest.raises(psycopg.errors.InsufficientPrivilege), raw.transaction():
                raw.execute("SELECT count(*) FROM dbqueue_job")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                raw.execute("SELECT dbqueue.dbqueue_enqueue_many('[]')")
    finally:
        raw.execute(
            f"REVOKE ALL ON FUNCTION dbqueue.dbqueue_enqueue(text, jsonb, text, int, "
            f"timestamptz, interval, int, double precision, text, text, text, boolean, "
            f"text) FROM {role}"
        )
        raw.execute(f"DROP ROLE {role}")


# -- psql -----------------------------------------------------------------------------------------


def test_from_psql_a_script_enqueues_and_a_rollback_leaves_nothing():
    psql = shutil.which("psql")
    if psql is None:
        print("psql not found on PATH: skipped")
        pytest.skip("psql not found on PATH")
    params = _params()
    env = {**os.environ, "PGPASSWORD": params["password"] or ""}
    args = [
        psql,
        "-X",
        "-q",
        "-v",
        "ON_ERROR_STOP=1",
        "-At",
        "-h",
        params["host"] or "",
        "-p",
        str(params["port"]),
        "-U",
        params["user"] or "",
        "-d",
        params["dbname"],
    ]
    script = """
        BEGIN;
        SELECT dbqueue_enqueue('echo', '{"from": "psql"}', queue => 'emails', priority => 3);
        COMMIT;
        BEGIN;
        SELECT dbqueue_enqueue('echo', '{"from": "rolled back"}');
        ROLLBACK;
    """
    out = subprocess.run(args, input=script, env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    job_id, rolled_back = (int(line) for line in out.stdout.split())
    row = job_row(job_id)
    assert (row["payload"], row["queue"], row["priority"]) == ({"from": "psql"}, "emails", 3)
    assert job_row(rolled_back) is None
    assert scalar("SELECT count(*) FROM dbqueue_job") == 1
    bad = subprocess.run(
        args,
        input="SELECT dbqueue_enqueue('noop', priority => 1000);",
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode != 0
    assert "dbqueue_enqueue: priority must be an integer from -100 to 100" in bad.stderr
    assert "HINT:" in bad.stderr


# -- wake-ups -------------------------------------------------------------------------------------


def test_the_wakeup_look_is_the_one_enqueue_runs(raw):
    body = raw.execute(
        "SELECT prosrc FROM pg_proc WHERE proname = 'dbqueue_wakeup_wanted'"
    ).fetchone()[0]
    assert _wakeup_wanted("p_queue") in body


def _waiting_worker(conn, queue="default"):
    """Hold WAITING for ``queue`` as a waiting worker does (store.wakeups.START_WAITING)."""
    from django_dbqueue.store.wakeups import START_WAITING

    conn.execute(START_WAITING, {"queues": [queue], "timeout": "1000"})


def test_a_notification_only_when_a_worker_waits_and_only_at_the_commit(raw):
    with psycopg.connect(**_params(), autocommit=True) as listener:
        listener.execute("LISTEN dbqueue")
        sql_enqueue(raw, "noop")  # nobody waits: nothing is sent
        assert not list(listener.notifies(timeout=0.3, stop_after=1))
        _waiting_worker(listener)
        with raw.transaction():
            for _ in range(5):
                sql_enqueue(raw, "noop")
            raw.execute("SELECT dbqueue_enqueue('noop', delay => '1 hour')")  # not due: nothing
            assert not list(listener.notifies(timeout=0.2, stop_after=1))  # not before the commit
        got = [n.payload for n in listener.notifies(timeout=2, stop_after=3)]
        assert got == ["1:default", "2:default", "4:default"]  # the 1st, 2nd and 4th job
        with raw.transaction(force_rollback=True):
            sql_enqueue(raw, "noop")
        raw.execute(
            "SELECT dbqueue_enqueue_many(%s)",
            [
                psycopg.types.json.Jsonb(
                    [["noop"], ["noop"], ["email"], {"type": "x", "queue": "emails"}]
                )
            ],
        )
        assert [n.payload for n in listener.notifies(timeout=2, stop_after=1)] == ["3:default"]


def test_a_worker_runs_a_job_enqueued_from_sql_woken_not_polled(raw, start_worker, fast_settings):
    fast_settings.DBQUEUE = {**fast_settings.DBQUEUE, "POLL_INTERVAL": 60}
    worker = start_worker()
    wait_until(lambda: worker.listening is not None and worker.listening.is_set(), message="LISTEN")
    wait_until(lambda: worker.claimed_total == 0 and worker.free_slots() > 0)
    wait_until(
        lambda: scalar(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1684173105"
        ),
        message="the worker to wait for wake-ups",
    )
    started = time.monotonic()
    with raw.transaction():
        job_id = sql_enqueue(raw, "echo", psycopg.types.json.Jsonb({"from": "sql"}))
    wait_until(lambda: job_row(job_id)["state"] == "done", timeout=10, message="the job done")
    assert time.monotonic() - started < 5  # far sooner than the 60 s poll
    assert job_row(job_id)["result"] == {"from": "sql"}


def test_an_unknown_type_is_taken_by_the_worker_and_deferred_with_its_error(raw, start_worker):
    job_id = sql_enqueue(raw, "no-such-type")
    start_worker()
    wait_until(lambda: job_row(job_id)["errors"], timeout=10, message="the unknown type's error")
    row = job_row(job_id)
    assert row["state"] == "pending" and row["attempts"] == 0
    assert "no handler is registered for job type 'no-such-type'" in row["errors"][0]["message"]


def test_a_statement_trigger_passes_all_inserted_rows_to_enqueue_many(raw):
    raw.execute("CREATE TABLE sql_enqueue_line (id bigserial PRIMARY KEY, sku text NOT NULL)")
    try:
        raw.execute(
            """
            CREATE FUNCTION sql_enqueue_lines_created() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM dbqueue_enqueue_many(coalesce(jsonb_agg(
                    jsonb_build_object('type', 'echo', 'payload', jsonb_build_object('sku', sku))
                    ORDER BY id), '[]')) FROM new_rows;
                RETURN NULL;
            END $$;
            CREATE TRIGGER sql_enqueue_lines_created AFTER INSERT ON sql_enqueue_line
            REFERENCING NEW TABLE AS new_rows
            FOR EACH STATEMENT EXECUTE FUNCTION sql_enqueue_lines_created();
            """
        )
        raw.execute("INSERT INTO sql_enqueue_line (sku) VALUES ('a'), ('b'), ('c')")
        rows = scalar("SELECT json_agg(payload ORDER BY id) FROM dbqueue_job")
        assert _json(rows) == [{"sku": "a"}, {"sku": "b"}, {"sku": "c"}]
    finally:
        raw.execute("DROP TABLE sql_enqueue_line")
        raw.execute("DROP FUNCTION sql_enqueue_lines_created()")
