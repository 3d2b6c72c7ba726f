"""Every SQL function the migrations install, attacked by a role that may create objects in the
schema of the tables (issue 35; migration 0026; docs/sql.md, "Privileges").

The attacker is a role of its own, connected as itself: EXECUTE on the functions a producer is
granted (docs/sql.md) and CREATE on the schema public, where the tables and the functions live
(PostgreSQL's default before 15, kept by pg_upgrade). It plants, in public:

- an operator for every pair of types (of those our columns and bodies use) that has no operator
  of exactly those types in pg_catalog, but one that PostgreSQL would reach by an implicit
  cast (float8 > int, numeric >= int, varchar = varchar, text || bigint, ...): an exact match
  wins over a cast, whatever schema it is in;
- an overload of every function the bodies call (their names are read from the bodies
  themselves), for the argument types an implicit cast or a polymorphic parameter would
  otherwise take (hashtextextended(text, int), format(text, text), unnest(text[]), ...), and
  of our own helpers (dbqueue_wake_at_commit(text, int), dbqueue_serial_turn(varchar, bigint));
  array_agg() over the types the bodies aggregate; jsonb_build_object() as the triggers call it;
- casts and a domain of its own types, and (temporary) tables and functions named like ours,
  with a search_path of its own when it calls;
- then, for the one test that sets search_path = public, pg_catalog: an operator, a function
  and a type with the very signature of pg_catalog's, which only a caller that puts public
  first reaches, to prove the helpers without a SET clause name everything with its schema.

Each planted body records that it ran (a row, and a WARNING that a rollback does not take back)
and, when it runs as a superuser, makes the attacker one. Then the attacker calls its doors, and
a superuser (the owner of the functions, as a worker or an operator would) calls every other
function and fires every trigger. The attacker must stay a plain role and no planted body may
have run as anybody but the attacker.
"""

import contextlib
import datetime
import hashlib
import itertools
import json
import re

import psycopg
import pytest
from django.db import connection

from django_dbqueue import enqueue
from django_dbqueue.connections import connection_params
from tests.utils import job_row

pytestmark = pytest.mark.django_db(transaction=True)

MARK = "dbq-evil ran"

# The types our columns, arguments and bodies use, for the pairs of the operator sweep and the
# arguments of the function sweep.
SCALARS = [
    "smallint",
    "integer",
    "bigint",
    "numeric",
    "double precision",
    "text",
    "character varying",
    "name",
    '"char"',
    "boolean",
    "jsonb",
    "jsonpath",
    "timestamp with time zone",
    "interval",
]
ARRAYS = [
    "text[]",
    "character varying[]",
    "integer[]",
    "bigint[]",
    "double precision[]",
    "timestamp with time zone[]",
    "boolean[]",
    "jsonb[]",
]
TYPES = SCALARS + ARRAYS
OPERATORS = [
    "=", "<>", "<", ">", "<=", ">=", "||", "+", "-", "*", "/",
    "->", "->>", "#>>", "?", "@>", "<@", "~", "!~", "~~", "&&",
]  # fmt: skip
# What a variadic "any" argument is tried with (format(), jsonb_build_object(), ...).
ANY = ["text", "integer", "bigint", "numeric", "double precision", "jsonb", "boolean", "text[]"]
ELEMENT = {"anyelement", "anynonarray", "anycompatible", "anycompatiblenonarray"}
ARRAY = {"anyarray", "anycompatiblearray"}
# Our SECURITY DEFINER doors: an overload of them only fools whoever calls it (the attacker
# itself here), not a body of ours.
DOORS = {"dbqueue_enqueue", "dbqueue_enqueue_many", "dbqueue_debounce"}


def _role_name():
    """A role per test database: roles are the cluster's, test databases are per checkout."""
    return "dbq_attacker_" + hashlib.md5(connection.settings_dict["NAME"].encode()).hexdigest()[:10]


class Session:
    """A psycopg connection in autocommit that keeps every notice it receives."""

    def __init__(self, **params):
        self.conn = psycopg.connect(**params, autocommit=True)
        self.notices = []
        self.conn.add_notice_handler(lambda diag: self.notices.append(diag.message_primary))

    def run(self, sql, params=None):
        cur = self.conn.execute(sql, params, prepare=False)
        return cur.fetchall() if cur.description else None

    def attempt(self, sql, params=None, failures=None):
        """Run ``sql``; a failure is appended to ``failures`` rather than raised."""
        try:
            self.run(sql, params)
        except psycopg.Error as exc:
            failures.append((sql, f"{type(exc).__name__}: {exc}"))

    def refused(self, sql, params=None):
        """Run ``sql``, which must fail; return its error (the session stays usable)."""
        with pytest.raises(psycopg.Error) as caught:
            self.run(sql, params)
        return caught.value

    def evil(self):
        return [n for n in self.notices if n and MARK in n]

    def close(self):
        self.conn.close()


@pytest.fixture
def owner():
    """A superuser session on the test database: the owner of the functions, as a worker or
    an operator connects (search_path as the server sets it: "$user", public)."""
    session = Session(**connection_params("default"))
    yield session
    session.close()


@pytest.fixture
def attacker(owner):
    """The attacker's role, with the producer's grants and CREATE on public, and a session
    connected as it. Dropped, with everything it owns, at the end."""
    role = _role_name()
    password = hashlib.sha256(role.encode()).hexdigest()
    with contextlib.suppress(psycopg.Error):
        owner.run(f"DROP OWNED BY {role}")
    owner.run(f"DROP ROLE IF EXISTS {role}")
    owner.run(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    owner.run(f"GRANT CREATE ON SCHEMA public TO {role}")
    for door in (  # (in the schema dbqueue since migration 0029)
        "dbqueue.dbqueue_enqueue(text, jsonb, text, int, timestamptz, interval, int,"
        " double precision, text, text, text, boolean, text)",
        "dbqueue.dbqueue_enqueue_many(jsonb)",
        "dbqueue.dbqueue_debounce(text, jsonb, text, text, int, timestamptz, interval, int,"
        " double precision, text)",
    ):
        if owner.run("SELECT to_regprocedure(%s) IS NOT NULL", [door])[0][0]:
            owner.run(f"GRANT EXECUTE ON FUNCTION {door} TO {role}")
    params = {**connection_params("default"), "user": role, "password": password}
    session = Session(**params)
    session.role = role
    try:
        yield session
    finally:
        session.close()
        owner.run("RESET search_path")
        owner.run(
            "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity"
            " WHERE usename OPERATOR(pg_catalog.=) %s::pg_catalog.name",
            [role],
        )
        owner.run(f"DROP OWNED BY {role} CASCADE")
        owner.run(f"DROP ROLE {role}")


# -- what the attacker plants ---------------------------------------------------------------------

RECORDER = """
CREATE TABLE public.dbq_evil_log (what text, by_user name);
GRANT INSERT, SELECT ON public.dbq_evil_log TO PUBLIC;
CREATE FUNCTION public.dbq_evil_ran(what text) RETURNS boolean LANGUAGE plpgsql AS $b$
BEGIN
    INSERT INTO public.dbq_evil_log (what, by_user) VALUES (what, current_user);
    RAISE WARNING 'dbq-evil ran: % as %', what, current_user;
    BEGIN
        EXECUTE pg_catalog.format('ALTER ROLE %I SUPERUSER', '{role}');
    EXCEPTION WHEN insufficient_privilege THEN
        NULL;
    END;
    RETURN true;
END
$b$;
"""

# The attacker's planting: each statement in a savepoint of its own, so that one PostgreSQL
# refuses (a body that cannot compile for a type pair) is left out and the rest is planted.
PLANTER = """
CREATE FUNCTION pg_temp.dbq_plant(statements text[]) RETURNS int LANGUAGE plpgsql AS $b$
DECLARE
    ddl text;
    planted int := 0;
BEGIN
    FOREACH ddl IN ARRAY statements LOOP
        BEGIN
            EXECUTE ddl;
            planted := planted + 1;
        EXCEPTION WHEN OTHERS THEN
            NULL;
        END;
    END LOOP;
    RETURN planted;
END
$b$
"""

# pg_catalog's result type for each operator and pair of the sweep that pg_catalog has no exact
# operator for (NULL where it has none at all), resolved with pg_catalog alone on the path.
PROBE = """
CREATE FUNCTION pg_temp.dbq_probe(ops text[], types text[])
RETURNS TABLE (op text, l text, r text, result text)
LANGUAGE plpgsql SET search_path = pg_catalog AS $b$
BEGIN
    FOREACH op IN ARRAY ops LOOP
        FOREACH l IN ARRAY types LOOP
            FOREACH r IN ARRAY types LOOP
                CONTINUE WHEN to_regoperator(format('pg_catalog.%s(%s,%s)', op, l, r))
                              IS NOT NULL;
                BEGIN
                    EXECUTE format('SELECT pg_typeof(NULL::%s %s NULL::%s)::text', l, op, r)
                    INTO result;
                EXCEPTION WHEN OTHERS THEN
                    CONTINUE;
                END;
                RETURN NEXT;
            END LOOP;
        END LOOP;
    END LOOP;
END
$b$
"""


def _quote(text):
    return "'" + text.replace("'", "''") + "'"


def operator_shadows(owner):
    """CREATE FUNCTION + CREATE OPERATOR in public for every (operator, left, right) of the
    sweep that pg_catalog has no exact operator for but reaches by a cast: each returns what
    pg_catalog's returns, after it recorded that it ran."""
    owner.run(PROBE)
    ddl = []
    rows = owner.run("SELECT * FROM pg_temp.dbq_probe(%s, %s)", [OPERATORS, TYPES])
    for number, (op, left, right, result) in enumerate(rows):
        label = _quote(f"{op}({left}, {right})")
        fn = f"public.dbq_evil_op_{number}"
        ddl.append(
            f"CREATE FUNCTION {fn}(a {left}, b {right}) RETURNS {result}"
            f" LANGUAGE plpgsql AS $b$ BEGIN PERFORM public.dbq_evil_ran({label});"
            f" RETURN a OPERATOR(pg_catalog.{op}) b; END $b$"
        )
        ddl.append(
            f"CREATE OPERATOR public.{op} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = {fn})"
        )
    return ddl


def _called_names(owner):
    """The names the bodies of our functions call (pg_catalog's and ours)."""
    rows = owner.run(
        r"""
        SELECT DISTINCT m[1] FROM pg_proc AS p,
            regexp_matches(p.prosrc, '([a-z_][a-z0-9_]*)\s*\(', 'g') AS m
        WHERE p.proname LIKE 'dbqueue\_%%'
        """
    )
    return sorted({row[0] for row in rows} - DOORS)


def _implicit_sources(owner):
    """{type: the types of the sweep that reach it in a call}: itself, those an implicit cast
    turns into it, and text (an unknown literal at that position prefers text)."""
    sources = {t: {t, "text"} for t in TYPES}
    for source, target in owner.run(
        """
        SELECT s::regtype::text, c.casttarget::regtype::text
        FROM pg_cast AS c, unnest(%s::regtype[]) AS s
        WHERE c.castsource = s AND c.castcontext = 'i'
        """,
        [TYPES],
    ):
        sources.setdefault(target, {target, "text"}).add(source)
    return sources


def function_shadows(owner, names=None):
    """CREATE FUNCTION in public for each function the bodies call (pg_catalog's and ours),
    with argument types that reach it only by an implicit cast, a polymorphic parameter or an
    unknown literal: any of them is a better match than the function it shadows. ``names``:
    the functions to shadow instead (test_sql_statements.py: those the package's statements
    call too)."""
    sources = _implicit_sources(owner)
    shadows = {}
    overloads = owner.run(
        """
        SELECT p.proname, n.nspname, p.proargtypes::regtype[]::text[], p.provariadic <> 0,
               p.pronargdefaults, p.proretset, p.prorettype::regtype::text
        FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace
        WHERE p.proname = ANY(%s) AND p.prokind = 'f'
          AND n.nspname IN ('pg_catalog', 'public')
        """,
        [_called_names(owner) if names is None else names],
    )
    for name, schema, args, variadic, defaults, retset, returns in overloads:
        if retset and schema == "public":
            continue
        for params in _arities(args, variadic, defaults):
            for types, element in _tuples(params, sources):
                result = _result(returns, element)
                if result is None or result == "record" or types == params:
                    continue
                shadows.setdefault(
                    f"{name}({', '.join(types)})",
                    _shadow(name, schema, types, params, result, retset),
                )
    # Not one with the very signature of a function of pg_catalog (only a caller that puts
    # public first reaches those: the second phase of the test).
    kept = owner.run(
        "SELECT s FROM unnest(%s::text[]) AS s WHERE to_regprocedure('pg_catalog.' || s) IS NULL",
        [list(shadows)],
    )
    return [shadows[row[0]] for row in kept]


def _arities(args, variadic, defaults):
    """The parameter lists a call can match: without the trailing defaulted ones, and a
    variadic parameter as 0 to 3 arguments of its element type."""
    if not variadic:
        return [list(args[:n]) for n in range(len(args) - defaults, len(args) + 1)]
    element = '"any"' if args[-1] == '"any"' else args[-1].removesuffix("[]")
    return [list(args[:-1]) + [element] * n for n in range(4)]


def _tuples(params, sources):
    """Argument types to try against ``params``: polymorphic ones made concrete (one element
    type at a time), each position by what reaches it; every combination when there are few,
    else one position changed at a time. Yields (types, element type)."""
    polymorphic = any(p in ELEMENT | ARRAY for p in params)
    for element in [t for t in SCALARS if t + "[]" in ARRAYS] if polymorphic else [None]:
        exact, choices = [], []
        for p in params:
            if p in ELEMENT:
                exact.append(element)
                choices.append([element])
            elif p in ARRAY:
                exact.append(element + "[]")
                choices.append([element + "[]"])
            elif p == '"any"':
                exact.append("text")
                choices.append(ANY)
            elif p in sources:
                exact.append(p)
                choices.append(sorted(sources[p]))
            else:
                return  # a parameter of a type outside the sweep (internal, regclass, ...)
        combinations = 1
        for c in choices:
            combinations *= len(c)
        if combinations <= 64:
            for types in itertools.product(*choices):
                yield list(types), element
        else:
            for i, c in enumerate(choices):
                for t in c:
                    yield [*exact[:i], t, *exact[i + 1 :]], element


def _result(returns, element):
    if returns in ELEMENT:
        return element
    if returns in ARRAY:
        return element and element + "[]"
    if returns.startswith("any") or returns in ('"any"', "internal", "trigger", "record"):
        return None
    return returns


def _shadow(name, schema, types, params, result, retset):
    label = _quote(f"{name}({', '.join(types)})")
    names = [f"a{i}" for i in range(len(types))]
    if schema == "public":  # ours: call the real one, with its own types, after recording
        call = (
            f"public.{name}({', '.join(f'{a}::{p}' for a, p in zip(names, params, strict=True))})"
        )
    else:
        call = f"pg_catalog.{name}({', '.join(names)})"
    if retset:
        body = f"RETURN QUERY SELECT * FROM {call};"
    elif result == "void":
        body = f"PERFORM {call}; RETURN;"
    else:
        body = f"RETURN {call};"
    signature = ", ".join(f"{a} {t}" for a, t in zip(names, types, strict=True))
    return (
        f"CREATE FUNCTION public.{name}({signature}) RETURNS {'SETOF ' if retset else ''}{result}"
        f" LANGUAGE plpgsql AS $b$ BEGIN PERFORM public.dbq_evil_ran({label}); {body} END $b$"
    )


# jsonb_build_object() as the triggers call it: a DependencyFailed and a DependencyRequeued
# entry of a dependent's errors; and as dbqueue_enqueue_many() turns a [type, payload] pair.
_FAILED = ["text", "integer", "text", "text", "text", "text", "text", "text", "text", "text",
           "text", "bigint", "text", "timestamp with time zone"]  # fmt: skip
_REQUEUED = [*_FAILED[:11], "boolean", *_FAILED[10:]]
BUILD_OBJECT_CALLS = [_FAILED, _REQUEUED, ["text", "jsonb", "text", "jsonb"]]


def written_shadows():
    """What the sweeps do not generate: array_agg() over the types the bodies aggregate,
    jsonb_build_object() with as many arguments as the triggers give it, make_interval()'s
    named argument; a type of the attacker's own with an implicit cast to text, and a domain
    over jsonb whose check is the attacker's function."""
    ddl = []
    for t in ["character varying", "text", "bigint", "integer", "timestamp with time zone"]:
        fn = "public.dbq_evil_agg_" + re.sub(r"\W", "_", t)
        ddl.append(
            f"CREATE FUNCTION {fn}(s {t}[], v {t}) RETURNS {t}[] LANGUAGE plpgsql AS $b$"
            f" BEGIN PERFORM public.dbq_evil_ran('array_agg({t})');"
            f" RETURN pg_catalog.array_append(s, v); END $b$"
        )
        ddl.append(f"CREATE AGGREGATE public.array_agg({t}) (SFUNC = {fn}, STYPE = {t}[])")
    for types in BUILD_OBJECT_CALLS:
        names = [f"a{i}" for i in range(len(types))]
        ddl.append(
            f"CREATE FUNCTION public.jsonb_build_object("
            f"{', '.join(f'{a} {t}' for a, t in zip(names, types, strict=True))}) RETURNS jsonb"
            f" LANGUAGE plpgsql AS $b$ BEGIN PERFORM public.dbq_evil_ran("
            f"'jsonb_build_object({len(names)} arguments)');"
            f" RETURN pg_catalog.jsonb_build_object({', '.join(names)}); END $b$"
        )
    ddl += [
        "CREATE FUNCTION public.make_interval(secs double precision) RETURNS interval"
        " LANGUAGE plpgsql AS $b$ BEGIN PERFORM public.dbq_evil_ran('make_interval(secs)');"
        " RETURN pg_catalog.make_interval(secs => secs); END $b$",
        "CREATE TYPE public.dbq_evil_t AS (v text)",
        "CREATE FUNCTION public.dbq_evil_text(x public.dbq_evil_t) RETURNS text"
        " LANGUAGE plpgsql AS $b$ BEGIN PERFORM public.dbq_evil_ran('cast to text');"
        " RETURN x.v; END $b$",
        "CREATE CAST (public.dbq_evil_t AS text)"
        " WITH FUNCTION public.dbq_evil_text(public.dbq_evil_t) AS IMPLICIT",
        "CREATE FUNCTION public.dbq_evil_check(x jsonb) RETURNS boolean LANGUAGE plpgsql"
        " AS $b$ BEGIN RETURN public.dbq_evil_ran('domain check'); END $b$",
        "CREATE DOMAIN public.dbq_evil_jsonb AS jsonb CHECK (public.dbq_evil_check(VALUE))",
    ]
    return ddl


# The five functions migration 0026 leaves without a SET clause: they resolve names with their
# caller's search_path, so they name everything with its schema themselves.
UNPINNED = ["dbqueue_serial_turn", "dbqueue_serial_free", "dbqueue_limiter_lock",
            "dbqueue_slot_channel", "dbqueue_rate_room"]  # fmt: skip


def same_signature_shadows(owner):
    """For a caller that puts public before pg_catalog: an operator, function, aggregate and
    type in public with the very signature of pg_catalog's, for every operator of the sweep's
    types and every function the helpers without a SET clause call (read from their bodies)."""
    text = " ".join(
        row[0]
        for row in owner.run("SELECT prosrc FROM pg_proc WHERE proname = ANY(%s)", [UNPINNED])
    )
    ddl = []
    operators = owner.run(
        """
        SELECT o.oprname, o.oprleft::regtype::text, o.oprright::regtype::text,
               o.oprresult::regtype::text
        FROM pg_operator AS o
        WHERE o.oprnamespace = 'pg_catalog'::regnamespace AND o.oprkind = 'b'
          AND o.oprname = ANY(%s) AND o.oprleft = ANY(%s::regtype[])
          AND o.oprright = ANY(%s::regtype[])
        """,
        [OPERATORS, TYPES, TYPES],
    )
    for number, (op, left, right, result) in enumerate(operators):
        fn = f"public.dbq_evil_same_op_{number}"
        label = _quote(f"{op}({left}, {right}), pg_catalog's signature")
        ddl.append(
            f"CREATE FUNCTION {fn}(a {left}, b {right}) RETURNS {result} LANGUAGE plpgsql AS $b$"
            f" BEGIN PERFORM public.dbq_evil_ran({label});"
            f" RETURN a OPERATOR(pg_catalog.{op}) b; END $b$"
        )
        ddl.append(
            f"CREATE OPERATOR public.{op} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = {fn})"
        )
    names = set(re.findall(r"([a-z_][a-z0-9_]*)\s*\(", text)) - set(UNPINNED)
    for name, args, retset, returns in owner.run(
        """
        SELECT p.proname, p.proargtypes::regtype[]::text[], p.proretset,
               p.prorettype::regtype::text
        FROM pg_proc AS p
        WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname = ANY(%s)
          AND p.prokind = 'f' AND p.provariadic = 0
        """,
        [sorted(names)],
    ):
        if all(a in TYPES for a in args) and returns in [*TYPES, "void"]:
            ddl.append(_shadow(name, "pg_catalog", list(args), list(args), returns, retset))
    ddl += [
        "CREATE FUNCTION public.dbq_evil_count(n bigint) RETURNS bigint LANGUAGE plpgsql AS $b$"
        " BEGIN PERFORM public.dbq_evil_ran('count(*)'); RETURN n + 1; END $b$",
        "CREATE AGGREGATE public.count(*) (SFUNC = public.dbq_evil_count, STYPE = bigint,"
        " INITCOND = '0')",
    ]
    for kind in ["text", "int4", "int8", "bool", "float8", "timestamptz", "jsonb"]:
        ddl.append(
            f"CREATE DOMAIN public.{kind} AS pg_catalog.{kind}"
            f" CHECK (public.dbq_evil_ran('domain public.{kind}'))"
        )
    return ddl


def plant(attacker, ddl):
    """Plant ``ddl`` as the attacker; forget what its own planting ran. Returns how many
    statements PostgreSQL took."""
    planted = attacker.run("SELECT pg_temp.dbq_plant(%s)", [ddl])[0][0]
    attacker.run("TRUNCATE public.dbq_evil_log")
    attacker.notices.clear()
    return planted


def shadows_in_public(owner):
    """'public.name(type,type)' of every function and operator in public. (Every statement the
    owner runs once something is planted has exact types or names pg_catalog's operators:
    with public on its path, ``'public.' || p.proname`` would call the attacker's
    ||(name, name), as a superuser.)"""
    cat = "OPERATOR(pg_catalog.||)"
    return {
        row[0]
        for row in owner.run(
            f"""
            SELECT 'public.'::pg_catalog.text {cat} p.proname::pg_catalog.text {cat} '('
                   {cat} pg_catalog.replace(pg_catalog.oidvectortypes(p.proargtypes),
                                            ', '::pg_catalog.text, ','::pg_catalog.text)
                   {cat} ')'
            FROM pg_catalog.pg_proc AS p
            WHERE p.pronamespace OPERATOR(pg_catalog.=) 'public'::pg_catalog.regnamespace::oid
            UNION ALL
            SELECT 'public.'::pg_catalog.text {cat} o.oprname::pg_catalog.text {cat} '('
                   {cat} pg_catalog.format_type(o.oprleft, NULL) {cat} ','
                   {cat} pg_catalog.format_type(o.oprright, NULL) {cat} ')'
            FROM pg_catalog.pg_operator AS o
            WHERE o.oprnamespace OPERATOR(pg_catalog.=) 'public'::pg_catalog.regnamespace::oid
            """
        )
    }


# -- the calls ------------------------------------------------------------------------------------

JOB = """
INSERT INTO public.dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
    max_attempts, lease_seconds, errors, created_at, serial_key, waiting_on, dependents)
VALUES (%s::text, %s::text, %s::jsonb, %s::text, 0, pg_catalog.now(), 0, 10, 60, '[]',
        pg_catalog.now(), %s::text, %s::integer, %s::bigint[])
RETURNING id
"""


def job(owner, *, type="noop", queue="default", payload=None, state="pending", serial=None,
        waiting_on=0, dependents=None):  # fmt: skip
    return owner.run(
        JOB, [type, queue, json.dumps(payload or {}), state, serial, waiting_on, dependents]
    )[0][0]


def edge(owner, job_id, depends_on, run_on_failure=False):
    owner.run(
        "INSERT INTO public.dbqueue_dependency (job_id, depends_on_id, run_on_failure)"
        " VALUES (%s::bigint, %s::bigint, %s::boolean)",
        [job_id, depends_on, run_on_failure],
    )


def fixtures(owner):
    """The rows the calls below work on, written before anything is planted: the claims take
    the jobs of 'default' and 'q-limited'; the others are in a queue nobody claims."""
    f = {}
    for _ in range(2):
        job(owner)
    for n in range(3):
        job(owner, type="rate-t", queue="q-limited", payload={"acct": f"a{n}"})
    job(owner, type="rate-t", queue="q-limited", payload={"acct": "s"}, serial="sk2")
    rows = {"queue": "untouched"}
    f["serial_a"] = job(owner, serial="sk", **rows)
    f["serial_b"] = job(owner, serial="sk", **rows)
    f["child"] = job(owner, state="waiting", waiting_on=1, **rows)
    f["child_on_failure"] = job(owner, state="waiting", waiting_on=1, **rows)
    f["parent"] = job(owner, dependents=[f["child"], f["child_on_failure"]], **rows)
    edge(owner, f["child"], f["parent"])
    edge(owner, f["child_on_failure"], f["parent"], run_on_failure=True)
    f["linked"] = job(owner, state="waiting", waiting_on=1, **rows)
    f["link_parent"] = job(owner, **rows)
    f["late"] = job(owner, state="waiting", waiting_on=1, **rows)
    f["late_parent"] = job(owner, dependents=[f["late"]], **rows)
    edge(owner, f["late"], f["late_parent"])
    f["to_cancel"] = job(owner, **rows)
    f["signalled"] = job(owner, **rows)
    return f


def call_doors(attacker):
    """The attacker's calls: every door, every option, every refusal (each words its error
    with format() and our helpers), with the caller's search_path as the attacker sets it."""
    enqueue = "public.dbqueue_enqueue"
    good = [
        f"SELECT {enqueue}('noop'::text)",
        f"SELECT {enqueue}('noop'::text, '{{\"a\": [1, 1.5, \"x\"]}}'::jsonb, 'emails'::text,"
        " 5, now() + interval '1 hour')",
        f"SELECT {enqueue}('noop'::text, delay => interval '5 minutes')",
        f"SELECT {enqueue}('noop'::text, '[1, [\"x\"], 2.5]'::jsonb)",
        f"SELECT {enqueue}('noop'::text, '\"text\"'::jsonb)",
        f"SELECT {enqueue}('noop'::text, idempotency_key => 'k1'::text)",
        f"SELECT {enqueue}('noop'::text, idempotency_key => 'k1'::text)",
        f"SELECT {enqueue}('noop'::text, unique_key => 'u1'::text)",
        f"SELECT {enqueue}('noop'::text, unique_key => 'u2'::text, unique_while => 'pending')",
        f"SELECT {enqueue}('noop'::text, serial_key => 'sk3'::text)",
        f"SELECT {enqueue}(ROW('noop')::public.dbq_evil_t)",
        f"SELECT {enqueue}('noop'::text, '{{}}'::public.dbq_evil_jsonb)",
        """SELECT public.dbqueue_enqueue_many('[["noop", {"a": 1}], {"type": "noop",
            "payload": {"b": [0.5]}, "queue": "emails", "priority": 3,
            "run_after": "2030-01-31T12:00:00+00:00", "max_attempts": 4, "lease_seconds": 30,
            "idempotency_key": "k2", "serial_key": "sk4"}, {"type": "noop", "delay": 1.5}]')""",
        "SELECT public.dbqueue_debounce('noop'::text, '{}'::jsonb, 'd1'::text)",
        "SELECT public.dbqueue_debounce('noop'::text, '{\"n\": 2}'::jsonb, 'd1'::text,"
        " delay => interval '1 minute')",
    ]
    bad = [
        f"SELECT {enqueue}(NULL::text)",
        f"SELECT {enqueue}('noop'::text, queue => ''::text)",
        f"SELECT {enqueue}('noop'::text, priority => 500)",
        f"SELECT {enqueue}('noop'::text, run_after => now(), delay => interval '1 s')",
        f"SELECT {enqueue}('noop'::text, run_after => 'infinity'::timestamptz)",
        f"SELECT {enqueue}('noop'::text, run_after => '4000-01-01 BC'::timestamptz)",
        f"SELECT {enqueue}('noop'::text, delay => interval '-1 s')",
        f"SELECT {enqueue}('noop'::text, max_attempts => 0)",
        f"SELECT {enqueue}('noop'::text, lease_seconds => 0::double precision)",
        f"SELECT {enqueue}('noop'::text, idempotency_key => ''::text)",
        f"SELECT {enqueue}('noop'::text, unique_key => ''::text)",
        f"SELECT {enqueue}('noop'::text, serial_key => ''::text)",
        f"SELECT {enqueue}('noop'::text, unique_key => 'u'::text, unique_while => 'x'::text)",
        f"SELECT {enqueue}('noop'::text, unique_while => 'pending'::text)",
        f"SELECT {enqueue}('noop'::text, unique_key => 'u'::text, debounce => true)",
        f"SELECT {enqueue}('noop'::text, unique_key => 'u'::text, idempotency_key => 'k'::text)",
        f"SELECT {enqueue}('noop'::text, ('{{\"a\":' || repeat('9', 5000) || '}}')::jsonb)",
        f"SELECT {enqueue}('noop'::text, ('{{\"a\":' || repeat('[', 150) || repeat(']', 150)"
        " || '}')::jsonb)",
        f"SELECT {enqueue}('noop'::text, '{{\"a\": 0.1000000000000000055}}'::jsonb)",
        f"SELECT {enqueue}('noop'::text, '{{\"a\": 12345678901234567.5}}'::jsonb)",
        "SELECT public.dbqueue_enqueue_many('{}'::jsonb)",
        "SELECT public.dbqueue_enqueue_many('[3]'::jsonb)",
        """SELECT public.dbqueue_enqueue_many('[{"type": "noop", "unique_key": "u"}]'::jsonb)""",
        """SELECT public.dbqueue_enqueue_many('[{"payload": {}}]'::jsonb)""",
        """SELECT public.dbqueue_enqueue_many('[{"type": 3}]'::jsonb)""",
        """SELECT public.dbqueue_enqueue_many('[{"type": "noop", "priority": 1.5}]'::jsonb)""",
        """SELECT public.dbqueue_enqueue_many('[{"type": "noop", "priority": 900}]'::jsonb)""",
        """SELECT public.dbqueue_enqueue_many('[{"type": "noop", "max_attempts": 0}]'::jsonb)""",
        """SELECT public.dbqueue_enqueue_many('[{"type": "noop", "lease_seconds": 0}]'::jsonb)""",
        """SELECT public.dbqueue_enqueue_many('[{"type": "noop", "delay": -1}]'::jsonb)""",
        """SELECT public.dbqueue_enqueue_many('[{"type": "noop", "run_after": "tomorrow"}]')""",
        """SELECT public.dbqueue_enqueue_many('[{"type": "noop",
            "run_after": "2030-01-01T00:00:00+16:00"}]')""",
        f"SELECT {enqueue}('noop'::text, idempotency_key => 'dbqueue:event:1:x'::text)",
        """SELECT public.dbqueue_enqueue_many('[{"type": "noop",
            "idempotency_key": "dbqueue-schedule:x"}]')""",
        "SELECT public.dbqueue_debounce('noop'::text, '{}'::jsonb, NULL::text)",
    ]
    # The documented calls, qualified with the doors' schema (migration 0029); the ones above
    # name the old names in public, wrappers that forward to them.
    good += [
        sql.replace("public.dbqueue_", "dbqueue.dbqueue_")
        for sql in good
        if "public.dbqueue_" in sql and "dbq_evil" not in sql
    ]
    bad += [sql.replace("public.dbqueue_", "dbqueue.dbqueue_") for sql in bad]
    debounce = _exists(attacker, "dbqueue_debounce")
    surprises = []
    for path in ["DEFAULT", "public, pg_temp, pg_catalog", "pg_temp, public"]:
        attacker.run(f"SET search_path = {path}")
        for sql, should_pass in [(sql, True) for sql in good] + [(sql, False) for sql in bad]:
            if "dbqueue_debounce" in sql and not debounce:
                continue
            try:
                attacker.run(sql)
                passed = True
            except psycopg.Error as exc:
                passed, error = False, exc
            if passed != should_pass:
                surprises.append((path, sql, None if passed else str(error)))
    attacker.run("RESET search_path")
    return surprises


def _exists(session, name):
    return session.run(
        "SELECT pg_catalog.count(*) FROM pg_catalog.pg_proc"
        " WHERE proname OPERATOR(pg_catalog.=) %s::pg_catalog.name",
        [name],
    )[0][0]


def temporary_objects(attacker):
    """Tables, a trigger and functions in the attacker's pg_temp named like ours and
    pg_catalog's, found first by its search_path: the doors must write to public's tables."""
    attacker.run(
        """
        CREATE TEMP TABLE dbqueue_job (
            id bigserial, type text, queue text, payload jsonb, state text, priority int,
            run_after timestamptz, attempts int, max_attempts int, lease_seconds float8,
            idempotency_key text, errors jsonb, created_at timestamptz, serial_key text,
            unique_key text, unique_while text, started_at timestamptz)
        """
    )
    attacker.run(
        "CREATE FUNCTION pg_temp.dbq_evil_row() RETURNS trigger LANGUAGE plpgsql AS $b$"
        " BEGIN PERFORM public.dbq_evil_ran('temp table'); RETURN NEW; END $b$"
    )
    attacker.run(
        "CREATE TRIGGER dbq_evil BEFORE INSERT OR UPDATE ON pg_temp.dbqueue_job"
        " FOR EACH ROW EXECUTE FUNCTION pg_temp.dbq_evil_row()"
    )
    for sql in [
        "CREATE FUNCTION pg_temp.now() RETURNS timestamptz LANGUAGE plpgsql AS $b$"
        " BEGIN PERFORM public.dbq_evil_ran('pg_temp.now()'); RETURN pg_catalog.now(); END $b$",
        "CREATE FUNCTION pg_temp.format(a text, b text) RETURNS text LANGUAGE plpgsql AS $b$"
        " BEGIN PERFORM public.dbq_evil_ran('pg_temp.format()'); RETURN a; END $b$",
        "CREATE FUNCTION pg_temp.dbqueue_wake_at_commit(a text, b integer) RETURNS boolean"
        " LANGUAGE plpgsql AS $b$"
        " BEGIN PERFORM public.dbq_evil_ran('pg_temp.dbqueue_wake_at_commit()'); RETURN true;"
        " END $b$",
    ]:
        attacker.run(sql)
    for path in ["pg_temp, public, pg_catalog", "pg_temp"]:
        attacker.run(f"SET search_path = {path}")
        attacker.run("SELECT public.dbqueue_enqueue('noop'::text, idempotency_key => 'temp'::text)")
    attacker.run("RESET search_path")
    assert attacker.run("SELECT count(*) FROM pg_temp.dbqueue_job")[0][0] == 0


def call_everything_else(owner, holder, f, *, qualified_types=False):
    failures = []
    """The owner's calls of every other function, with exactly typed arguments and no operator
    of its own (so that what runs a planted body can only be one of ours)."""
    t = "pg_catalog." if qualified_types else ""
    calls = [
        f"SELECT public.dbqueue_serial_turn('sk'::{t}text, {f['serial_a']}::{t}int8),"
        f" public.dbqueue_serial_turn('sk'::{t}text, {f['serial_a']}::{t}int8),"
        f" public.dbqueue_serial_turn('sk'::{t}text, {f['serial_b']}::{t}int8)",
        f"SELECT public.dbqueue_serial_free('sk'::{t}text, {f['serial_b']}::{t}int8)",
        f"SELECT public.dbqueue_limiter_lock('queue'::{t}text, 'default'::{t}text, ''::{t}text)",
        f"SELECT * FROM public.dbqueue_rate_room(ARRAY[pg_catalog.now()]::{t}timestamptz[],"
        f" 1::{t}int4, 60::{t}float8)",
        f"SELECT * FROM public.dbqueue_partition_room('queue'::{t}text, 'q1'::{t}text,"
        f" 'p'::{t}text, 5::{t}int4, 60::{t}float8)",
        f"SELECT * FROM public.dbqueue_slot_channel('dbqueue'::{t}text, 'default'::{t}text,"
        f" 0::{t}int4)",
        f"SELECT public.dbqueue_pick_slots('dbqueue:default'::{t}text, 0::{t}int4, 4::{t}int4)",
        f"SELECT public.dbqueue_wakeup_payload('dbqueue'::{t}text, '0:default'::{t}text,"
        f" 4::{t}int4)",
        f"SELECT public.dbqueue_wake('dbqueue'::{t}text, '0:default'::{t}text, 4::{t}int4),"
        f" public.dbqueue_wake('dbqueue'::{t}text, 'plain'::{t}text, 4::{t}int4)",
        f"SELECT public.dbqueue_wakeup_wanted('default'::{t}text),"
        f" public.dbqueue_wake_at_commit('default'::{t}text, 1::{t}int8)",
        f"SELECT public.dbqueue_enqueue_shown('x'::{t}text)",
        f"SELECT public.dbqueue_enqueue_number('w'::{t}text, 'k'::{t}text, '2'::{t}jsonb,"
        f" true), public.dbqueue_enqueue_string('w'::{t}text, 'k'::{t}text, '\"s\"'::{t}jsonb)",
        f"SELECT public.dbqueue_enqueue_check('w: '::{t}text, 'type'::{t}text, 'noop'::{t}text,"
        f" '{{}}'::{t}jsonb, 'default'::{t}text, 0::{t}int4, NULL::{t}timestamptz,"
        f" NULL::interval, 3::{t}int4, 30::{t}float8, NULL::{t}text, NULL::{t}text,"
        f" NULL::{t}text, false, NULL::{t}text)",
        f"SELECT * FROM public.dbqueue_enqueue_row('noop'::{t}text, '{{}}'::{t}jsonb,"
        f" 'default'::{t}text, 0::{t}int4, pg_catalog.now(), 3::{t}int4, 30::{t}float8,"
        f" 'direct'::{t}text, NULL::{t}text, NULL::{t}text, false, NULL::{t}text)",
        f"SELECT * FROM public.dbqueue_claim_limited(ARRAY['default']::{t}text[],"
        f" ARRAY[10]::{t}int4[], 10::{t}int4, 'w'::{t}text, 1::{t}int8, ARRAY[5]::{t}int4[],"
        f" ARRAY[100]::{t}int4[], ARRAY[60]::{t}float8[], ARRAY[NULL]::{t}text[],"
        f" '{{}}'::{t}text[], '{{}}'::{t}int4[], '{{}}'::{t}int4[], '{{}}'::{t}float8[],"
        f" '{{}}'::{t}text[])",
        f"SELECT * FROM public.dbqueue_claim_within_limits(ARRAY['q-limited']::{t}text[],"
        f" ARRAY[10]::{t}int4[], 10::{t}int4, 'w'::{t}text, 2::{t}int8, ARRAY[NULL]::{t}int4[],"
        f" ARRAY[100]::{t}int4[], ARRAY[60]::{t}float8[], ARRAY['acct']::{t}text[],"
        f" ARRAY['rate-t']::{t}text[], ARRAY[5]::{t}int4[], ARRAY[2]::{t}int4[],"
        f" ARRAY[60]::{t}float8[], ARRAY['acct']::{t}text[])",
        f"SELECT * FROM public.dbqueue_release_late(ARRAY[{f['late']}]::{t}int8[],"
        f" ARRAY[{f['late_parent']}]::{t}int8[])",
    ]
    for listened in ["NULL", "1"]:
        holder.attempt(
            f"SELECT public.dbqueue_take_slots('dbqueue'::{t}text, ARRAY['default']::{t}text[],"
            f" 4::{t}int4, ARRAY[{listened}]::{t}int4[])",
            failures=failures,
        )
    for sql in calls:
        owner.attempt(sql, failures=failures)
    error = owner.refused(
        f"SELECT public.dbqueue_enqueue_fail('w: '::{t}text, 'm'::{t}text, NULL::{t}text)"
    )
    if not isinstance(error, psycopg.errors.InvalidParameterValue):
        failures.append(("dbqueue_enqueue_fail", str(error)))
    if _exists(owner, "dbqueue_enqueue_payload_problem"):
        owner.attempt(
            f'SELECT public.dbqueue_enqueue_payload_problem(\'{{"a": [0.1000000000000000055,'
            f" 1e400]}}'::{t}jsonb), public.dbqueue_enqueue_number_problem(1.5::numeric),"
            f" (SELECT pg_catalog.count(*) FROM public.dbqueue_enqueue_payload_walk("
            f"'{{\"a\": [1]}}'::{t}jsonb))",
            failures=failures,
        )
    return failures


TRIGGERS = [
    # dbqueue_settle_dependents: a parent with dependents dies, then is requeued.
    "UPDATE public.dbqueue_job SET state = 'dead', finished_at = pg_catalog.now()"
    " WHERE id = {parent}::bigint",
    "UPDATE public.dbqueue_job SET state = 'pending', finished_at = NULL"
    " WHERE id = {parent}::bigint",
    # dbqueue_apply_link, dbqueue_apply_cancel, dbqueue_apply_signal: at the commit.
    "INSERT INTO public.dbqueue_link_at_commit (job_id, depends_on_id, run_on_failure)"
    " VALUES ({linked}::bigint, {link_parent}::bigint, false)",
    "INSERT INTO public.dbqueue_cancel_at_commit (job_id, cancelled_by)"
    " VALUES ({to_cancel}::bigint, 'operator')",
    "INSERT INTO public.dbqueue_signal (name, seq, job_id) VALUES ('go', 0, {signalled}::bigint)",
]

# Which call above reaches each function (every function the migrations install must be here).
REACHED_BY = {
    "dbqueue_enqueue": "doors",
    "dbqueue_enqueue_many": "doors",
    "dbqueue_debounce": "doors",
    "dbqueue_enqueue_check": "doors, direct",
    "dbqueue_enqueue_row": "doors, direct",
    "dbqueue_enqueue_fail": "doors, direct",
    "dbqueue_enqueue_shown": "doors, direct",
    "dbqueue_enqueue_number": "doors, direct",
    "dbqueue_enqueue_string": "doors, direct",
    "dbqueue_enqueue_payload_problem": "doors, direct",
    "dbqueue_enqueue_number_problem": "doors, direct",
    "dbqueue_enqueue_payload_walk": "direct",  # (no longer called by a door: migration 0029)
    "dbqueue_wakeup_wanted": "doors, direct",
    "dbqueue_wake_at_commit": "doors, direct",
    "dbqueue_serial_turn": "direct, claims",
    "dbqueue_serial_free": "direct, claims",
    "dbqueue_limiter_lock": "direct, claims",
    "dbqueue_rate_room": "direct, claims",
    "dbqueue_partition_room": "direct, claims",
    "dbqueue_claim_limited": "direct",
    "dbqueue_claim_within_limits": "direct",
    "dbqueue_release_late": "direct",
    "dbqueue_slot_channel": "direct, wake, take_slots",
    "dbqueue_take_slots": "direct",
    "dbqueue_pick_slots": "direct, wake",
    "dbqueue_wakeup_payload": "direct, wake",
    "dbqueue_wake": "direct",
    "dbqueue_settle_dependents": "trigger",
    "dbqueue_apply_link": "trigger",
    "dbqueue_apply_cancel": "trigger",
    "dbqueue_apply_signal": "trigger",
}


def still_plain(owner, role):
    return owner.run(
        """
        SELECT NOT (r.rolsuper OR r.rolcreaterole OR r.rolcreatedb OR r.rolreplication
                    OR r.rolbypassrls)
               AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_auth_members AS m
                               WHERE m.member OPERATOR(pg_catalog.=) r.oid)
        FROM pg_catalog.pg_roles AS r WHERE r.rolname OPERATOR(pg_catalog.=) %s::pg_catalog.name
        """,
        [role],
    )[0][0]


def ran(owner):
    """What the planted bodies recorded: {(what, as whom)}."""
    return set(owner.run("SELECT DISTINCT what, by_user::pg_catalog.text FROM public.dbq_evil_log"))


def test_every_function_is_called_here():
    """A function added by a later migration must be attacked here too."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT proname FROM pg_proc WHERE proname LIKE 'dbqueue\\_%%'")
        installed = {row[0] for row in cursor.fetchall()}
    assert len(installed) >= 27
    assert installed <= set(REACHED_BY), installed - set(REACHED_BY)


def test_no_planted_object_runs_as_anybody_but_the_role_that_planted_it(owner, attacker):
    f = fixtures(owner)
    role = attacker.role
    attacker.run(RECORDER.replace("{role}", role))
    attacker.run(PLANTER)

    # What is planted is read from the catalogs before anything is.
    shadows = operator_shadows(owner) + function_shadows(owner) + written_shadows()
    same_signature = same_signature_shadows(owner)

    # 1. Shadows that win over pg_catalog's (and our) functions and operators by their types,
    # for a caller with the usual search_path ("$user", public: pg_catalog first).
    planted = plant(attacker, shadows)
    public = shadows_in_public(owner)
    for expected in [  # each hijacked a body of ours before migration 0026
        "public.>(double precision,integer)",
        "public.>=(numeric,integer)",
        "public.=(character varying,character varying)",
        "public.||(text,bigint)",
        "public.hashtextextended(text,integer)",
        "public.format(text,text)",
        "public.unnest(text[])",
        "public.array_agg(character varying)",
        "public.array_position(text[],text)",
        "public.dbqueue_wake_at_commit(text,integer)",
        "public.dbqueue_serial_turn(character varying,bigint)",
    ]:
        assert expected in public, expected
    assert planted > 1000, planted
    # A cast between types the attacker does not own is not its to create.
    error = attacker.refused("CREATE CAST (text AS bigint) WITH INOUT AS IMPLICIT")
    assert isinstance(error, psycopg.errors.InsufficientPrivilege), error

    surprises = call_doors(attacker)
    temporary_objects(attacker)
    with contextlib.closing(Session(**connection_params("default"))) as holder:
        failures = call_everything_else(owner, holder, f)
        for sql in TRIGGERS:
            owner.attempt(sql.format(**f), failures=failures)
        notices = owner.evil() + holder.evil()
    assert still_plain(owner, role), sorted(ran(owner))
    assert {by for _, by in ran(owner)} <= {role}, ran(owner)
    assert notices == []
    # The attacker's own cast and domain did run, in its own statements, as itself: before
    # the door was entered, with its own rights.
    assert {("cast to text", role), ("domain check", role)} <= ran(owner)
    assert surprises == []
    assert failures == []
    # The calls did their work, so the bodies ran through.
    assert owner.run(
        "SELECT state::pg_catalog.text FROM public.dbqueue_job WHERE id = %s::bigint",
        [f["to_cancel"]],
    ) == [("cancelled",)]
    assert owner.run(
        "SELECT pg_catalog.count(*) FROM public.dbqueue_job"
        " WHERE idempotency_key::pg_catalog.text OPERATOR(pg_catalog.=) 'temp'::pg_catalog.text"
    ) == [(1,)]

    # 2. A caller that puts public before pg_catalog reaches public's operators and functions
    # even where pg_catalog has the very same signature: the helpers that run with their
    # caller's search_path (no SET clause: migration 0026 says why) must name pg_catalog's.
    planted = plant(attacker, same_signature)
    public = shadows_in_public(owner)
    for expected in [
        "public.=(text,text)",
        "public.hashtextextended(text,bigint)",
        "public.strpos(text,text)",
        "public.now()",
        "public.md5(text)",
    ]:
        assert expected in public, expected
    assert planted > 100, planted
    owner.run("SET search_path = public, pg_catalog")
    with contextlib.closing(Session(**connection_params("default"))) as holder:
        holder.run("SET search_path = public, pg_catalog")
        failures = call_everything_else(owner, holder, f, qualified_types=True)
        notices = owner.evil() + holder.evil()
    owner.run("RESET search_path")
    assert still_plain(owner, role), sorted(ran(owner))
    assert {by for _, by in ran(owner)} <= {role}, ran(owner)
    assert notices == []
    assert failures == []


# -- the grants of docs/sql.md, exactly -----------------------------------------------------------

PRODUCER_GRANT = (
    "GRANT EXECUTE ON FUNCTION dbqueue.dbqueue_enqueue(text, jsonb, text, int, timestamptz,"
    " interval, int, double precision, text, text, text, boolean, text),"
    " dbqueue.dbqueue_enqueue_many(jsonb) TO {}"
)
DEBOUNCE_GRANT = (
    "GRANT EXECUTE ON FUNCTION dbqueue.dbqueue_debounce(text, jsonb, text, text, int,"
    " timestamptz, interval, int, double precision, text) TO {}"
)


@pytest.fixture
def roles(owner):
    """Two login roles: a producer with docs/sql.md's grant, and one also granted
    dbqueue_debounce(). Yields {name: session}."""
    made, sessions = [], {}
    try:
        for kind, grants in [
            ("producer", [PRODUCER_GRANT]),
            ("debouncer", [PRODUCER_GRANT, DEBOUNCE_GRANT]),
        ]:
            role = f"{_role_name()}_{kind}"
            password = hashlib.sha256(role.encode()).hexdigest()
            owner.run(f"DROP ROLE IF EXISTS {role}")
            owner.run(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
            made.append(role)
            for grant in grants:
                if grant is DEBOUNCE_GRANT and not _exists(owner, "dbqueue_debounce"):
                    continue  # (before migration 0026: the test fails further on, as it should)
                owner.run(grant.format(role))
            sessions[kind] = Session(
                **{**connection_params("default"), "user": role, "password": password}
            )
        yield sessions
    finally:
        for session in sessions.values():
            session.close()
        for role in made:
            owner.run(f"DROP OWNED BY {role}")
            owner.run(f"DROP ROLE {role}")


def test_a_producer_adds_jobs_and_changes_none_a_debounce_grant_changes_the_keys_pending_job(
    owner, roles
):
    producer, debouncer = roles["producer"], roles["debouncer"]
    held = enqueue("noop", {"invoice": 1}, unique_key="invoice-1", unique_while="pending").id
    before = job_row(held)

    # The producer's own jobs, any type, queue and key: what docs/sql.md says it may do.
    mine = producer.run("SELECT dbqueue_enqueue('noop', '{\"n\": 1}', queue => 'emails')")[0][0]
    assert job_row(mine)["queue"] == "emails"
    # It learns the id of the job that holds a key, and changes nothing of it.
    assert producer.run(
        "SELECT dbqueue_enqueue('noop', '{\"invoice\": 666}', unique_key => 'invoice-1',"
        " unique_while => 'pending')"
    ) == [(held,)]
    # It cannot push another caller's pending job back nor replace its payload.
    error = producer.refused(
        "SELECT dbqueue_enqueue('noop', '{\"invoice\": 666}', unique_key => 'invoice-1',"
        " unique_while => 'pending', debounce => true, delay => interval '1 day')"
    )
    assert isinstance(error, psycopg.errors.InvalidParameterValue)
    assert "dbqueue_debounce()'s, granted on its own" in error.diag.message_primary
    error = producer.refused(
        "SELECT dbqueue_debounce('noop', '{\"invoice\": 666}', 'invoice-1',"
        " delay => interval '1 day')"
    )
    assert isinstance(error, psycopg.errors.InsufficientPrivilege)
    for sql in [
        "SELECT count(*) FROM dbqueue_job",
        "UPDATE dbqueue_job SET payload = '{}'",
        "SELECT * FROM dbqueue_enqueue_row('noop', '{}', 'default', 0, now(), 1, 1, NULL, NULL,"
        " NULL, false, NULL)",
        "SELECT dbqueue_enqueue_payload_problem('{}')",
    ]:
        assert isinstance(producer.refused(sql), psycopg.errors.InsufficientPrivilege), sql
    assert job_row(held) == before

    # Granted dbqueue_debounce(), a role does that.
    assert debouncer.run(
        "SELECT dbqueue_debounce('noop', '{\"invoice\": 2}', 'invoice-1',"
        " delay => interval '1 hour')"
    ) == [(held,)]
    after = job_row(held)
    assert after["payload"] == {"invoice": 2}
    assert after["run_after"] > before["run_after"] + datetime.timedelta(minutes=59)
    # A key with no pending holder: a new job holds it.
    fresh = debouncer.run("SELECT dbqueue_debounce('noop', '{}', 'report')")[0][0]
    assert job_row(fresh)["unique_key"] == "report"
    assert job_row(fresh)["unique_while"] == "pending"
