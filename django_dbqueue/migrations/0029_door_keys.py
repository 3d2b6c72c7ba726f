# What the SQL doors refuse, and what they cost to refuse (issue 35, the hostile review of the SQL
# doors: tests/integration/test_review_doors_sql.py). This installs again, whole, hardened as
# migration 0026 writes them (the pinned path; our functions named with the schema of
# dbqueue_job, every argument of its declared type):
# - dbqueue_enqueue_check(): an idempotency key that starts with 'dbqueue:' or 'dbqueue-' is
#   refused. Those are the keys of the package's own jobs: 'dbqueue:event:<id>:<subscriber>'
#   (store/events.py) and 'dbqueue-schedule:<entry>:<tick>' (schedule.Schedule.key), and both
#   can be computed in advance (event ids are a sequence, ticks are arithmetic). A producer that
#   took one made publish() fail, a replay skip a subscriber, or its own job stand in for a
#   periodic one. enqueue() and enqueue_many() refuse them too (validation.producer_key()).
# - dbqueue_enqueue_many(): a run_after whose UTC offset PostgreSQL refuses (past +-15:59, e.g.
#   +16:00, which the ISO shape lets through) is refused with the function's own error, naming
#   the item, instead of PostgreSQL's 22009 naming nothing.
# - dbqueue_enqueue_payload_problem(): the path of a value it refuses (a container more than 100
#   levels down: its first two steps; a number: all of them) is found by going down from the
#   payload, into the first child that a jsonpath test finds the value in, instead of
#   dbqueue_enqueue_payload_walk(), whose recursive CTE copied every subtree at every level
#   into a tuplestore (a 2 MB payload: ~400 MB of temporary files, 10 MB: 26 s). The walk is
#   no longer called; it stays installed, granted to nobody, so that migrating back needs it.
# And the three doors move to a schema of their own, "dbqueue", which only their owner (the role
# that migrates) can create objects in. Until now they lived in the schema of the tables
# (public), and a caller's unqualified call, dbqueue_enqueue('noop', '{"a": 1}') as docs/sql.md
# showed it, was resolved among everything of that name on the caller's search_path: a role with
# CREATE on public (PostgreSQL's default before 15) created public.dbqueue_enqueue(text, text), a
# better match for two untyped literals than ours, and its body ran with the caller's rights (a
# superuser's, a trigger's); or it created dbqueue_enqueue(text, jsonb, text, text), and every
# INSERT of a table whose trigger called ours failed as ambiguous. A qualified call,
# dbqueue.dbqueue_enqueue(...), is resolved in that schema alone, where nobody else can add a
# function: docs/sql.md now shows only such calls. What moves:
# - ALTER FUNCTION ... SET SCHEMA keeps each door's oid, owner and grants: a role granted
#   EXECUTE on dbqueue_enqueue() before this migration may call dbqueue.dbqueue_enqueue() now.
# - USAGE on the schema is granted to PUBLIC (it only lets a role name what is in it: every
#   function there has EXECUTE revoked from PUBLIC), so a producer still needs EXECUTE on the
#   door and nothing else. (PostgreSQL grants EXECUTE to PUBLIC on a new function, and a
#   schema's default privileges cannot take that back: a later migration that creates a
#   function in this schema must REVOKE it, as 0022 and 0026 do.)
# - Under the old names, in the schema of the tables, three wrappers with the same signatures
#   forward every argument to the door (SECURITY INVOKER, executable by anybody: the door
#   checks the caller's EXECUTE), so that existing triggers and services keep working. They
#   are as exposed as the old names were: an unqualified call is only as safe as the schemas on
#   the caller's search_path (the database check dbqueue.W005 names who can create objects in
#   them).
# - Should the tables themselves be in a schema named dbqueue, nothing moves. Should a schema
#   dbqueue exist already, owned by another role or with CREATE granted to another role, the
#   migration stops and says so.
# A later migration that installs a door again must name it dbqueue.dbqueue_enqueue(...).
#
# Migrating back moves the doors back under their names, drops the wrappers and the schema (if
# nothing else is in it), and installs the texts of migrations 0026 and 0027 again.

import importlib
import re

from django.db import migrations

FUNCTIONS = r"""
-- The rules of validation.py, jobspec.prepare(), payloads.check() and enqueue() that SQL can
-- check, worded as they are; p_where starts each message ('dbqueue_enqueue: ',
-- 'dbqueue_enqueue_many: jobs[3]: ').
CREATE OR REPLACE FUNCTION {schema}.dbqueue_enqueue_check(
    p_where text, p_type_label text, p_type text, p_payload jsonb, p_queue text,
    p_priority int, p_run_after timestamptz, p_delay interval, p_max_attempts int,
    p_lease double precision, p_idempotency_key text, p_unique_key text,
    p_unique_while text, p_debounce boolean, p_serial_key text
) RETURNS void LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    delay_seconds numeric;
    problem text;
BEGIN
    IF p_type IS NULL OR p_type = '' OR length(p_type) > 200 THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            '%s must be a non-empty string of at most 200 characters, got %s',
            p_type_label, {schema}.dbqueue_enqueue_shown(p_type::text)),
            'the name of a registered @job type'::text);
    END IF;
    problem := {schema}.dbqueue_enqueue_payload_problem(p_payload::jsonb);
    IF problem IS NOT NULL THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, problem,
            'the worker reads a payload with Python''s json: a value it would read back '
            'changed is refused, as enqueue() refuses it (docs/sql.md, "Payloads")'::text);
    END IF;
    IF p_queue = '' OR length(p_queue) > 100 THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            'queue must be a non-empty string of at most 100 characters, got %s',
            {schema}.dbqueue_enqueue_shown(p_queue::text)), 'a queue of DBQUEUE[''QUEUES'']'::text);
    END IF;
    IF p_priority NOT BETWEEN -100 AND 100 THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            'priority must be an integer from -100 to 100 (higher runs first), got %s',
            p_priority), NULL::text);
    END IF;
    IF p_run_after IS NOT NULL AND p_delay IS NOT NULL THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, 'pass run_after or delay, not both'::text,
                                              NULL::text);
    END IF;
    IF NOT isfinite(p_run_after) THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            'run_after must be a finite timestamptz, got %s', p_run_after), NULL::text);
    END IF;
    -- validation.TIMESTAMP_MIN and TIMESTAMP_MAX: a time Python's datetime holds in every
    -- time zone (a test compares them).
    IF p_run_after < '0001-01-02 00:00:00+00'::timestamptz
       OR p_run_after > '9999-12-30 00:00:00+00'::timestamptz THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            'run_after must be from 0001-01-02 00:00:00+00 to 9999-12-30 00:00:00+00 (a time '
            'Python''s datetime can hold in every time zone), got %s', p_run_after), NULL::text);
    END IF;
    delay_seconds := extract(epoch FROM p_delay);
    IF delay_seconds NOT BETWEEN 0::numeric AND 315360000::numeric THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            'delay must be an interval from 0 to 315360000 seconds (ten years), got %s',
            {schema}.dbqueue_enqueue_shown(p_delay::text)), NULL::text);
    END IF;
    IF p_max_attempts < 1 THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            'max_attempts must be an integer from 1 to 2147483647, got %s', p_max_attempts),
            NULL::text);
    END IF;
    IF NOT (p_lease > 0::double precision AND p_lease <= 86400::double precision) THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            'lease_seconds must be a number of seconds greater than 0 and at most 86400, got %s',
            p_lease), NULL::text);
    END IF;
    IF p_idempotency_key = '' OR length(p_idempotency_key) > 300 THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            'idempotency_key must be a non-empty string of at most 300 characters, got %s',
            {schema}.dbqueue_enqueue_shown(p_idempotency_key::text)), NULL::text);
    END IF;
    IF starts_with(p_idempotency_key, 'dbqueue:') OR starts_with(p_idempotency_key, 'dbqueue-')
    THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            'idempotency_key %s starts with %s, which is reserved for the keys of the package''s '
            'own jobs (an event''s subscribers, a schedule''s ticks)',
            {schema}.dbqueue_enqueue_shown(p_idempotency_key::text),
            {schema}.dbqueue_enqueue_shown(left(p_idempotency_key, 8)::text)),
            'use a prefix of your own, e.g. ''invoice-email:42'''::text);
    END IF;
    IF p_unique_key = '' OR length(p_unique_key) > 300 THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            'unique_key must be a non-empty string of at most 300 characters, got %s',
            {schema}.dbqueue_enqueue_shown(p_unique_key::text)), NULL::text);
    END IF;
    IF p_serial_key = '' OR length(p_serial_key) > 300 THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            'serial_key must be a non-empty string of at most 300 characters, got %s',
            {schema}.dbqueue_enqueue_shown(p_serial_key::text)), NULL::text);
    END IF;
    IF p_unique_while IS NOT NULL THEN
        IF p_unique_while NOT IN ('pending', 'active') THEN
            PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
                'unique_while must be ''pending'' or ''active'', got %s',
                {schema}.dbqueue_enqueue_shown(p_unique_while::text)), NULL::text);
        END IF;
        IF p_unique_key IS NULL THEN
            PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
                'unique_while=%s needs a unique_key',
                {schema}.dbqueue_enqueue_shown(p_unique_while::text)), NULL::text);
        END IF;
    END IF;
    IF p_debounce AND p_unique_while IS DISTINCT FROM 'pending' THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            'debounce needs unique_while=''pending'' (and a unique_key), got unique_while=%s',
            {schema}.dbqueue_enqueue_shown(coalesce(
                p_unique_while, CASE WHEN p_unique_key IS NOT NULL THEN 'active' END)::text)),
            'only a job that has not started can be pushed back'::text);
    END IF;
    IF p_idempotency_key IS NOT NULL AND p_unique_key IS NOT NULL THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            'pass idempotency_key or unique_key, not both (got idempotency_key=%s, unique_key=%s)',
            {schema}.dbqueue_enqueue_shown(p_idempotency_key::text),
            {schema}.dbqueue_enqueue_shown(p_unique_key::text)),
            'an idempotency key already allows one job per key in any state'::text);
    END IF;
END
$fn$;

-- The payload rules of enqueue() (payloads.check()) that a jsonb can break, as
-- '<path> <what is wrong>', or NULL (migration 0026 says which).
CREATE OR REPLACE FUNCTION {schema}.dbqueue_enqueue_payload_problem(p_payload jsonb)
RETURNS text LANGUAGE plpgsql STABLE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    suspect CONSTANT jsonpath := 'strict $.** ? (@.type() == "number" && (@.floor() != @ '
        '|| @ >= 9007199254740992 || @ <= -9007199254740992))';
    v numeric;
    problem text;
    node jsonb;
    child jsonb;
    deeper jsonpath;
    k text;
    steps text := '';
    equal CONSTANT jsonpath := 'strict $.** ? (@.type() == "number" && @ == $v)';
BEGIN
    IF jsonb_path_exists(p_payload,
                         'strict $.**{100} ? (@.type() == "object" || @.type() == "array")') THEN
        -- The first two steps of the path, as payloads.check() names it: the child of each
        -- level that holds a container one level less deep, found with the same jsonpath.
        node := p_payload;
        FOR level IN 1 .. 2 LOOP
            EXIT WHEN jsonb_typeof(node) NOT IN ('object', 'array');  -- (never: found above)
            child := NULL;
            deeper := format('strict $.**{%s} ? (@.type() == "object" || @.type() == "array")',
                             100 - level)::jsonpath;
            IF jsonb_typeof(node) = 'object' THEN
                FOR k IN SELECT jsonb_object_keys(node) LOOP
                    IF jsonb_path_exists(node -> k, deeper) THEN
                        child := node -> k;
                        steps := steps || '[' || to_json(k)::text || ']';
                        EXIT;
                    END IF;
                END LOOP;
            ELSE
                FOR i IN 0 .. jsonb_array_length(node) - 1 LOOP
                    IF jsonb_path_exists(node -> i, deeper) THEN
                        child := node -> i;
                        steps := steps || '[' || i::text || ']';
                        EXIT;
                    END IF;
                END LOOP;
            END IF;
            node := child;
        END LOOP;
        RETURN 'payload' || steps || '... is nested more than 100 levels deep';
    END IF;
    IF NOT jsonb_path_exists(p_payload, suspect) THEN
        RETURN NULL;
    END IF;
    FOR v IN SELECT x::numeric FROM jsonb_path_query(p_payload, suspect) AS x LOOP
        problem := {schema}.dbqueue_enqueue_number_problem(v::numeric);
        IF problem IS NOT NULL THEN
            -- Its path: down from the payload, each level into the first child that holds a
            -- number equal to it (as the jsonpath above compares them).
            node := p_payload;
            WHILE jsonb_typeof(node) IN ('object', 'array') LOOP
                child := NULL;  -- (found in every container on the way; NULL ends the loop)
                IF jsonb_typeof(node) = 'object' THEN
                    FOR k IN SELECT jsonb_object_keys(node) LOOP
                        IF jsonb_path_exists(node -> k, equal, jsonb_build_object('v', v)) THEN
                            child := node -> k;
                            steps := steps || '[' || to_json(k)::text || ']';
                            EXIT;
                        END IF;
                    END LOOP;
                ELSE
                    FOR i IN 0 .. jsonb_array_length(node) - 1 LOOP
                        IF jsonb_path_exists(node -> i, equal, jsonb_build_object('v', v)) THEN
                            child := node -> i;
                            steps := steps || '[' || i::text || ']';
                            EXIT;
                        END IF;
                    END LOOP;
                END IF;
                node := child;
            END LOOP;
            RETURN 'payload' || steps || ' ' || problem;
        END IF;
    END LOOP;
    RETURN NULL;
END
$fn$;

-- run_after: the ISO 8601 shape (date, time, offset) before PostgreSQL reads it, which would
-- also take 'tomorrow', 'epoch', a time without an offset (in the session's TimeZone) or a
-- year of six digits; an offset PostgreSQL cannot read is the function's refusal too.
CREATE OR REPLACE FUNCTION {schema}.dbqueue_enqueue_many(jobs jsonb) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    allowed CONSTANT text[] := ARRAY[
        'type', 'payload', 'queue', 'priority', 'run_after', 'delay', 'max_attempts',
        'lease_seconds', 'idempotency_key', 'serial_key'
    ];
    iso CONSTANT text := '^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}'
                         '(:[0-9]{2}(\.[0-9]+)?)?([Zz]|[+-][0-9]{2}(:?[0-9]{2})?)$';
    n int;
    item jsonb;
    w text;
    unknown text[];
    num numeric;
    types text[] := '{}';
    payloads jsonb[] := '{}';
    queues text[] := '{}';
    priorities int[] := '{}';
    run_afters timestamptz[] := '{}';
    max_attempts int[] := '{}';
    leases double precision[] := '{}';
    keys text[] := '{}';
    serial_keys text[] := '{}';
    v_text text;
    v_delay interval;
    v_run_after timestamptz;
    ids bigint[] := '{}';
    job record;
    due_queues text[] := '{}';
    v_queue text;
BEGIN
    IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' THEN
        PERFORM {schema}.dbqueue_enqueue_fail('dbqueue_enqueue_many: '::text, format(
            'jobs must be a JSON array of objects, got %s',
            {schema}.dbqueue_enqueue_shown(jobs::text)),
            'jsonb_build_array(jsonb_build_object(''type'', ''send-email'', ''payload'', ...))'::text);
    END IF;
    n := jsonb_array_length(jobs);
    -- Every item is read and checked before anything is written.
    FOR i IN 0 .. n - 1 LOOP
        item := jobs -> i;
        w := format('dbqueue_enqueue_many: jobs[%s]: ', i);
        IF jsonb_typeof(item) = 'array' AND jsonb_array_length(item) IN (1, 2) THEN
            item := jsonb_build_object('type', item -> 0, 'payload', item -> 1);
        END IF;
        IF jsonb_typeof(item) <> 'object' THEN
            PERFORM {schema}.dbqueue_enqueue_fail(w, format(
                'must be an object of dbqueue_enqueue() arguments or a [type, payload] pair, '
                'got %s', {schema}.dbqueue_enqueue_shown(item::text)), NULL::text);
        END IF;
        SELECT array_agg(k ORDER BY k) INTO unknown
        FROM jsonb_object_keys(item) AS k WHERE k <> ALL (allowed);
        IF unknown IS NOT NULL THEN
            PERFORM {schema}.dbqueue_enqueue_fail(w, format(
                'has unknown keys %s; allowed: %s', unknown, allowed),
                CASE WHEN 'unique_key' = ANY (unknown)
                     THEN 'dbqueue_enqueue_many() takes no unique jobs: call dbqueue_enqueue() for each' END);
        END IF;
        IF NOT item ? 'type' THEN
            PERFORM {schema}.dbqueue_enqueue_fail(w, 'has no ''type'''::text, NULL::text);
        END IF;
        v_text := {schema}.dbqueue_enqueue_string(w, 'type'::text, item -> 'type');
        types := types || v_text;
        payloads := payloads || coalesce(nullif(item -> 'payload', 'null'::jsonb), '{}'::jsonb);
        queues := queues || coalesce(
            {schema}.dbqueue_enqueue_string(w, 'queue'::text, item -> 'queue'), 'default');
        num := {schema}.dbqueue_enqueue_number(w, 'priority'::text, item -> 'priority', true);
        IF num NOT BETWEEN -100::numeric AND 100::numeric THEN
            PERFORM {schema}.dbqueue_enqueue_fail(w, format(
                'priority must be an integer from -100 to 100 (higher runs first), got %s', num),
                NULL::text);
        END IF;
        priorities := priorities || coalesce(num::int, 0);
        num := {schema}.dbqueue_enqueue_number(w, 'max_attempts'::text, item -> 'max_attempts',
                                               true);
        IF num NOT BETWEEN 1::numeric AND 2147483647::numeric THEN
            PERFORM {schema}.dbqueue_enqueue_fail(w, format(
                'max_attempts must be an integer from 1 to 2147483647, got %s', num), NULL::text);
        END IF;
        max_attempts := max_attempts || coalesce(num::int, 10);
        num := {schema}.dbqueue_enqueue_number(w, 'lease_seconds'::text, item -> 'lease_seconds',
                                               false);
        -- (checked before the conversion, which fails past a double's range)
        IF num <= 0::numeric OR num > 86400::numeric OR num < 2.4703282292062328e-324 THEN
            PERFORM {schema}.dbqueue_enqueue_fail(w, format(
                'lease_seconds must be a number of seconds greater than 0 and at most 86400, '
                'got %s', {schema}.dbqueue_enqueue_shown(num::text)), NULL::text);
        END IF;
        leases := leases || coalesce(num::double precision, 60::double precision);
        num := {schema}.dbqueue_enqueue_number(w, 'delay'::text, item -> 'delay', false);
        IF num NOT BETWEEN 0::numeric AND 315360000::numeric THEN
            PERFORM {schema}.dbqueue_enqueue_fail(w, format(
                'delay must be a number of seconds from 0 to 315360000 (ten years), got %s',
                {schema}.dbqueue_enqueue_shown(num::text)), NULL::text);
        END IF;
        -- (an interval counts microseconds: a smaller delay is none)
        v_delay := make_interval(secs => CASE WHEN num < 0.0000005 THEN 0::double precision
                                              ELSE num::double precision END);
        v_text := {schema}.dbqueue_enqueue_string(w, 'run_after'::text, item -> 'run_after');
        v_run_after := NULL;
        IF v_text IS NOT NULL THEN
            BEGIN
                IF v_text !~ iso THEN
                    RAISE invalid_datetime_format;
                END IF;
                v_run_after := v_text::timestamptz;
            EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow
                           OR invalid_parameter_value THEN
                PERFORM {schema}.dbqueue_enqueue_fail(w, format(
                    'run_after must be a timestamp with a UTC offset, in ISO 8601 '
                    '(2030-01-31T12:00:00+00:00), got %s',
                    {schema}.dbqueue_enqueue_shown(v_text::text)),
                    'ISO 8601: 2030-01-31T12:00:00+00:00'::text);
            WHEN invalid_time_zone_displacement_value THEN
                PERFORM {schema}.dbqueue_enqueue_fail(w, format(
                    'run_after must have a UTC offset from -15:59 to +15:59 (what PostgreSQL '
                    'reads), got %s', {schema}.dbqueue_enqueue_shown(v_text::text)),
                    'ISO 8601: 2030-01-31T12:00:00+00:00'::text);
            END;
        END IF;
        keys := keys || {schema}.dbqueue_enqueue_string(w, 'idempotency_key'::text,
                                                        item -> 'idempotency_key');
        serial_keys := serial_keys || {schema}.dbqueue_enqueue_string(w, 'serial_key'::text,
                                                                      item -> 'serial_key');
        PERFORM {schema}.dbqueue_enqueue_check(
            w, 'type'::text, types[i + 1], payloads[i + 1], queues[i + 1], priorities[i + 1],
            v_run_after, v_delay, max_attempts[i + 1], leases[i + 1], keys[i + 1], NULL::text,
            NULL::text, false, serial_keys[i + 1]
        );
        run_afters := run_afters || coalesce(v_run_after, now() + coalesce(v_delay, interval '0'));
    END LOOP;
    FOR i IN 1 .. n LOOP
        job := {schema}.dbqueue_enqueue_row(
            types[i], payloads[i], queues[i], priorities[i], run_afters[i], max_attempts[i],
            leases[i], keys[i], NULL::text, NULL::text, false, serial_keys[i]
        );
        ids := ids || job.o_id;
        IF job.o_due THEN
            due_queues := due_queues || queues[i];
        END IF;
    END LOOP;
    -- One wake-up per queue with its count of due jobs, as enqueue_many() sends after its commit.
    FOR v_queue, num IN
        SELECT d.q, count(*) FROM unnest(due_queues) AS d(q) GROUP BY d.q ORDER BY d.q
    LOOP
        PERFORM {schema}.dbqueue_wake_at_commit(v_queue, num::bigint);
    END LOOP;
    RETURN ids;
END
$fn$;
"""

# The schema of dbqueue_job, as this connection finds the table (0026's TABLES_SCHEMA).
TABLES_SCHEMA = """
SELECT pg_catalog.quote_ident(n.nspname)
FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.oid = pg_catalog.to_regclass('dbqueue_job')
"""
_FUNCTION = re.compile(r"CREATE OR REPLACE FUNCTION \{schema\}\.(dbqueue_\w+)\(.*?\$fn\$;", re.S)


def _install(schema_editor, text):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(TABLES_SCHEMA)
        (quoted,) = cursor.fetchone()
        cursor.execute(text.replace("{schema}", quoted))


def refuse(apps, schema_editor):
    """Install FUNCTIONS, in the migration's transaction."""
    _install(schema_editor, FUNCTIONS)


def previous_texts():
    """Each function of FUNCTIONS as the last migration before this one wrote it."""
    texts = {}
    for module, constant in [
        ("0026_hardened_functions", "ENQUEUE"),
        ("0027_bounded_rows", "FUNCTIONS"),
    ]:
        text = getattr(importlib.import_module(f"django_dbqueue.migrations.{module}"), constant)
        texts.update((m.group(1), m.group(0)) for m in _FUNCTION.finditer(text))
    return "\n".join(texts[m.group(1)] for m in _FUNCTION.finditer(FUNCTIONS))


def accept(apps, schema_editor):
    """Install the functions as migrations 0026 and 0027 left them."""
    _install(schema_editor, previous_texts())


# -- the doors in a schema of their own ------------------------------------------------------------

DOOR_SCHEMA = "dbqueue"
DOORS = (
    "dbqueue_enqueue(text, jsonb, text, int, timestamptz, interval, int, double precision, text,"
    " text, text, boolean, text)",
    "dbqueue_enqueue_many(jsonb)",
    "dbqueue_debounce(text, jsonb, text, text, int, timestamptz, interval, int, double precision,"
    " text)",
)

# The old names: each forwards its arguments, every one of the door's declared type, to the door
# of the same signature in {doors} (an exact match: no other function is considered there).
WRAPPERS = r"""
CREATE FUNCTION {schema}.dbqueue_enqueue(
    job_type text,
    payload jsonb DEFAULT '{}',
    queue text DEFAULT 'default',
    priority int DEFAULT 0,
    run_after timestamptz DEFAULT NULL,
    delay interval DEFAULT NULL,
    max_attempts int DEFAULT 10,
    lease_seconds double precision DEFAULT 60,
    idempotency_key text DEFAULT NULL,
    unique_key text DEFAULT NULL,
    unique_while text DEFAULT NULL,
    debounce boolean DEFAULT false,
    serial_key text DEFAULT NULL
) RETURNS bigint LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT {doors}.dbqueue_enqueue(
        job_type, payload, queue, priority, run_after, delay, max_attempts, lease_seconds,
        idempotency_key, unique_key, unique_while, debounce, serial_key)
$fn$;

CREATE FUNCTION {schema}.dbqueue_enqueue_many(jobs jsonb) RETURNS bigint[]
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT {doors}.dbqueue_enqueue_many(jobs)
$fn$;

CREATE FUNCTION {schema}.dbqueue_debounce(
    job_type text,
    payload jsonb DEFAULT '{}',
    unique_key text DEFAULT NULL,
    queue text DEFAULT 'default',
    priority int DEFAULT 0,
    run_after timestamptz DEFAULT NULL,
    delay interval DEFAULT NULL,
    max_attempts int DEFAULT 10,
    lease_seconds double precision DEFAULT 60,
    serial_key text DEFAULT NULL
) RETURNS bigint LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT {doors}.dbqueue_debounce(
        job_type, payload, unique_key, queue, priority, run_after, delay, max_attempts,
        lease_seconds, serial_key)
$fn$;
"""

# The schema of the doors, if it exists: its owner is the role that migrates, and who else may
# create objects in it.
DOOR_SCHEMA_STATE = """
SELECT n.nspowner OPERATOR(pg_catalog.=) (
           SELECT r.oid FROM pg_catalog.pg_roles AS r
           WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER),
       pg_catalog.pg_get_userbyid(n.nspowner)::pg_catalog.text,
       ARRAY(SELECT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                         ELSE pg_catalog.pg_get_userbyid(a.grantee)::pg_catalog.text END
             FROM pg_catalog.aclexplode(
                 COALESCE(n.nspacl, pg_catalog.acldefault('n'::"char", n.nspowner))) AS a
             WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'::pg_catalog.text
               AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner)
FROM pg_catalog.pg_namespace AS n WHERE n.nspname OPERATOR(pg_catalog.=) %s::pg_catalog.name
"""

# Whether anything but the doors is in the schema (back to 0027 drops it only when not).
DOOR_SCHEMA_OTHERS = """
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_depend AS d
               WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::regclass
                 AND d.refobjid OPERATOR(pg_catalog.=) %s::pg_catalog.regnamespace::pg_catalog.oid)
"""


def _schemas(cursor):
    cursor.execute(TABLES_SCHEMA)
    (tables,) = cursor.fetchone()
    cursor.execute("SELECT pg_catalog.quote_ident(%s::pg_catalog.text)", [DOOR_SCHEMA])
    (doors,) = cursor.fetchone()
    return tables, doors


def own_schema(apps, schema_editor):
    """Move the doors to DOOR_SCHEMA, and put the wrappers under their old names."""
    with schema_editor.connection.cursor() as cursor:
        tables, doors = _schemas(cursor)
        if tables == doors:
            return  # the tables, and so the doors, are in a schema named dbqueue already
        cursor.execute(DOOR_SCHEMA_STATE, [DOOR_SCHEMA])
        state = cursor.fetchone()
        if state is None:
            cursor.execute(
                "SELECT pg_catalog.has_database_privilege("
                "pg_catalog.current_database(), 'CREATE'::pg_catalog.text), CURRENT_USER::text"
            )
            allowed, user = cursor.fetchone()
            if not allowed:
                raise RuntimeError(
                    f"migration 0029: the role {user!r} may not create the schema "
                    f"{DOOR_SCHEMA!r}, where the SQL doors go (no CREATE on the database). "
                    f"Create it for this role first: CREATE SCHEMA {doors} AUTHORIZATION "
                    f"{user}; (docs/sql.md, 'The schema dbqueue')"
                )
            cursor.execute(f"CREATE SCHEMA {doors}")
        else:
            owned, owner, writers = state
            if not owned or writers:
                raise RuntimeError(
                    f"migration 0029: schema {DOOR_SCHEMA!r} exists already"
                    + ("" if owned else f", owned by {owner!r}, not by the role that migrates")
                    + (f", and {', '.join(writers)} may create objects in it" if writers else "")
                    + ": the SQL doors need a schema only their owner can create objects in. "
                    f"Drop it, or make it the migrating role's with no CREATE for others."
                )
        moves = "".join(
            f"ALTER FUNCTION {tables}.{door} SET SCHEMA {doors};\n" for door in DOORS
        )
        cursor.execute(
            moves
            + f"GRANT USAGE ON SCHEMA {doors} TO PUBLIC;\n"
            + WRAPPERS.replace("{schema}", tables).replace("{doors}", doors)
        )


def shared_schema(apps, schema_editor):
    """Back to 0027: drop the wrappers, move the doors back, drop the schema if empty."""
    with schema_editor.connection.cursor() as cursor:
        tables, doors = _schemas(cursor)
        if tables == doors:
            return
        cursor.execute(
            "".join(f"DROP FUNCTION {tables}.{door};\n" for door in DOORS)
            + "".join(f"ALTER FUNCTION {doors}.{door} SET SCHEMA {tables};\n" for door in DOORS)
        )
        cursor.execute(DOOR_SCHEMA_OTHERS, [DOOR_SCHEMA])
        if not cursor.fetchone()[0]:
            cursor.execute(f"DROP SCHEMA {doors}")


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0028_held_rows"),
    ]

    operations = [
        migrations.RunPython(refuse, accept),
        migrations.RunPython(own_schema, shared_schema),
    ]
