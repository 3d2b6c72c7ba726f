# A row of dbqueue_job may no longer hold a value that the worker's own statements cannot compute
# with (issue 35; docs/concepts/security.md, "A row cannot stop a worker").
#
# Until now a lease_seconds of Infinity or 1e300 passed the CHECK "lease_seconds > 0", and every
# claim that picked the row failed ("interval out of range", computing leased_until): an error of
# the whole statement, so the queue stopped for every worker, claim after claim. A run_after of
# -infinity failed every limited claim of its queue (dbqueue_claim_within_limits() returns
# now() - run_after). No door writes such values (the Python API and the SQL functions refuse
# them with errors of their own); a plain UPDATE or INSERT did. Now the table refuses them too:
# - lease_seconds at most validation.MAX_SECONDS (ten years; NaN fails "<=" as well, Infinity
#   fails it): the doors take at most a day (registry.MAX_LEASE); the bound is the table's
#   backstop, not a second rule for callers;
# - every timestamp column NULL or within validation.TIMESTAMP_MIN..MAX (0001-01-02 to
#   9999-12-30 UTC, inclusive): what Python reads back, and what every door accepts.
#
# The constraints are added VALID, in one ALTER TABLE (one pass over the table), after the rows
# that break them are repaired. NOT VALID would not have been safe: PostgreSQL checks a NOT VALID
# constraint on every new row version, so the claim's UPDATE of an old bad row would have failed
# the claim of everybody instead of the interval arithmetic. The repair loses nothing:
# - each value out of bounds is replaced by the nearest bound (a timestamp before the minimum by
#   the minimum, after the maximum or infinite by the maximum; a lease by registry.MAX_LEASE, the
#   longest any door writes), and an entry appended to the job's error history names the
#   column, its old text and the new value (class "UnreadableJob", as the worker records a row
#   it cannot read);
# - a live job (pending, waiting or running) so repaired is ended: dead (cancelled when a cancel
#   was asked for while it ran), as the worker ends a job whose row it cannot read; its entry
#   says so. A finished one keeps its state.
# The same bounds hold the times of the tables the scheduler, the metrics and the admin read
# (OTHER_TABLES: events, workers, paused queues, the schedules' state and stored entries): a
# schedule entry's last tick of year 200000 failed the scheduler's one read of every entry
# (psycopg's typed value of it fails the fetch of the whole reply), so no entry ticked, and a
# worker's heartbeat of -infinity failed the metrics' one statement (now() - heartbeat_at).
# Their rows are repaired the same way, the value replaced by the nearest bound.
# Migrating back drops the constraints; the repaired values stay as repaired.
#
# And the SQL doors take every payload enqueue() takes (docs/sql.md, "Payloads"): a JSON object
# as before, and a list, a string, a number or a boolean, each held to the same rules (Python
# reads it back unchanged: dbqueue_enqueue_payload_problem() walks a scalar or a list as it
# walks an object); a JSON null is the empty object, as enqueue(payload=None) and
# dbqueue_enqueue_many() make it. Until now dbqueue_enqueue() and dbqueue_enqueue_many()
# refused every payload but an object, so a producer in SQL could not send what a producer in
# Python could. This installs again, whole, hardened as migration 0026 writes them (the pinned
# path; our functions named with the schema of dbqueue_job, every argument of its declared
# type): dbqueue_enqueue_check() without the object test, and dbqueue_enqueue() and
# dbqueue_debounce() reading a null payload as {}. And dbqueue_wakeup_wanted(), whose text is
# that of store.wakeups._wakeup_wanted() (which casts a varchar queue column to text: issue 35's
# statements of the package, docs/concepts/security.md). Migrating back installs 0026's texts of
# the four again.

import datetime
import importlib
import re

from django.db import migrations, models

TIMESTAMP_MIN = "0001-01-02 00:00:00+00"  # validation.TIMESTAMP_MIN
TIMESTAMP_MAX = "9999-12-30 00:00:00+00"  # validation.TIMESTAMP_MAX
MAX_SECONDS = 315360000  # validation.MAX_SECONDS
MAX_LEASE = 86400  # registry.MAX_LEASE: the longest lease a door writes
TIMESTAMPS = (
    "run_after",
    "created_at",
    "started_at",
    "finished_at",
    "leased_until",
    "cancel_requested_at",
)
# The other tables whose times the worker, the scheduler, the metrics and the admin read:
# {table: (model, columns)}. Their rows hold no history: a time out of bounds is replaced by
# the nearest bound (a schedule's last tick of year 200000 becomes 9999-12-30: that entry ticks
# no more, as before, but no longer fails the scheduler's pass over every entry).
OTHER_TABLES = {
    "dbqueue_event": ("event", ("published_at",)),
    "dbqueue_worker": ("workerrecord", ("started_at", "heartbeat_at", "stale_at", "expires_at")),
    "dbqueue_queue": ("queuestate", ("changed_at",)),
    "dbqueue_schedule": ("schedulestate", ("last_tick", "last_enqueued", "updated_at")),
    "dbqueue_schedule_entry": (
        "scheduleentry",
        ("last_tick", "last_enqueued", "created_at", "updated_at"),
    ),
}
LIVE = "state::text IN ('pending', 'waiting', 'running')"

# The statements below run once, as the role that migrates; each call and operator in them is
# one of pg_catalog's by its exact types or its schema (varchar columns cast to text, the
# variadic jsonb builders qualified), so that nothing planted elsewhere runs with that role's
# rights (migration 0026 says how).
# One column's values out of bounds, replaced, each job's history told. {column}, {bad}: the
# test of a bad value, {fixed}: the value put in its place, {wanted}: what the column holds.
REPAIR_COLUMN = f"""
UPDATE dbqueue_job
SET {{column}} = {{fixed}},
    errors = errors || pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
        'attempt', attempts,
        'class', 'UnreadableJob',
        'message', '{{column}}: ' || {{column}}::text || ' is not {{wanted}}; migration 0027 '
                   || 'replaced it with ' || ({{fixed}})::text
                   || CASE WHEN {LIVE} THEN ' and ended the job, whose claims would have failed'
                           ELSE '' END,
        'traceback', '',
        'worker', NULL,
        'column', '{{column}}',
        'was', {{column}}::text,
        'at', now()))
WHERE {{bad}}
RETURNING id
"""

# The live jobs repaired: ended, as the worker ends a job it cannot read. A running one whose
# cancel was asked for ends cancelled (the CHECK dbqueue_job_cancel_mark_running: only a running
# or cancelled job carries the mark).
END_REPAIRED = f"""
UPDATE dbqueue_job
SET state = CASE WHEN cancel_requested_at IS NULL THEN 'dead' ELSE 'cancelled' END,
    finished_at = now(), leased_until = NULL, waiting_on = 0
WHERE id = ANY(%s::bigint[]) AND {LIVE}
"""

# Another table's times out of bounds, replaced by the nearest bound.
CLAMP_COLUMN = """
UPDATE {table} SET {column} = {fixed} WHERE {bad}
"""


def _in_bounds(column):
    return (
        f"{column} >= '{TIMESTAMP_MIN}'::timestamptz AND {column} <= '{TIMESTAMP_MAX}'::timestamptz"
    )


def _clamped(column):
    return (
        f"CASE WHEN {column} < '{TIMESTAMP_MIN}'::timestamptz"
        f" THEN '{TIMESTAMP_MIN}'::timestamptz ELSE '{TIMESTAMP_MAX}'::timestamptz END"
    )


# The constraints, one statement per table (one pass over each table to validate them).
_JOB_CHECKS = [
    f"ADD CONSTRAINT dbqueue_job_lease_bounded CHECK (lease_seconds <= {MAX_SECONDS}::double precision)",
    *(f"ADD CONSTRAINT dbqueue_job_{c}_range CHECK ({_in_bounds(c)})" for c in TIMESTAMPS),
]
ADD_CONSTRAINTS = (
    "ALTER TABLE dbqueue_job\n    "
    + ",\n    ".join(_JOB_CHECKS)
    + ";\n"
    + "".join(
        f"ALTER TABLE {table}\n    "
        + ",\n    ".join(
            f"ADD CONSTRAINT {table}_{c}_range CHECK ({_in_bounds(c)})" for c in columns
        )
        + ";\n"
        for table, (_model, columns) in OTHER_TABLES.items()
    )
)
DROP_CONSTRAINTS = "".join(
    f"ALTER TABLE {table}\n    "
    + ",\n    ".join(f"DROP CONSTRAINT {table}_{name}" for name in names)
    + ";\n"
    for table, names in [
        ("dbqueue_job", ["lease_bounded", *(f"{c}_range" for c in TIMESTAMPS)]),
        *((t, [f"{c}_range" for c in columns]) for t, (_m, columns) in OTHER_TABLES.items()),
    ]
)


def _repairs():
    """(column, bad, fixed, wanted) of every repair."""
    for column in TIMESTAMPS:
        yield (
            column,
            f"NOT ({_in_bounds(column)})",
            _clamped(column),
            f"from {TIMESTAMP_MIN} to {TIMESTAMP_MAX}, what Python reads back",
        )
    yield (
        "lease_seconds",
        f"NOT (lease_seconds <= {MAX_SECONDS}::double precision)",
        f"{MAX_LEASE}::double precision",
        f"a finite number of seconds of at most {MAX_SECONDS}",
    )


def repair_rows(cursor):
    """Replace every value the constraints refuse (REPAIR_COLUMN), then end the live jobs that
    held one (END_REPAIRED). Returns the ids of the jobs repaired."""
    repaired = set()
    for column, bad, fixed, wanted in _repairs():
        cursor.execute(
            REPAIR_COLUMN.replace("{column}", column)
            .replace("{bad}", bad)
            .replace("{fixed}", fixed)
            .replace("{wanted}", wanted)
        )
        repaired.update(row[0] for row in cursor.fetchall())
    if repaired:
        cursor.execute(END_REPAIRED, [sorted(repaired)])
    for table, (_model, columns) in OTHER_TABLES.items():
        for column in columns:
            cursor.execute(
                CLAMP_COLUMN.format(
                    table=table,
                    column=column,
                    fixed=_clamped(column),
                    bad=f"NOT ({_in_bounds(column)})",
                )
            )
    return repaired


def repair(apps, schema_editor):
    """:func:`repair_rows`, in the migration's transaction, before the constraints."""
    with schema_editor.connection.cursor() as cursor:
        repair_rows(cursor)


# -- the SQL doors: any JSON payload ----------------------------------------------------------------

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

-- debounce => true is refused here: it is dbqueue_debounce()'s, granted on its own.
CREATE OR REPLACE FUNCTION {schema}.dbqueue_enqueue(
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
) RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_payload jsonb := coalesce(nullif(payload, 'null'::jsonb), '{}'::jsonb);
    v_queue text := coalesce(queue, 'default');
    v_priority int := coalesce(priority, 0);
    v_max_attempts int := coalesce(max_attempts, 10);
    v_lease double precision := coalesce(lease_seconds, 60::double precision);
    v_unique_while text := unique_while;
    job record;
BEGIN
    IF debounce THEN
        PERFORM {schema}.dbqueue_enqueue_fail('dbqueue_enqueue: '::text,
            'debounce => true is refused: it replaces the payload and run_after of the pending '
            'job that holds the unique key, which another caller may have enqueued, so it is '
            'dbqueue_debounce()''s, granted on its own'::text,
            'SELECT dbqueue_debounce(job_type, payload, unique_key, ...): see docs/sql.md'::text);
    END IF;
    PERFORM {schema}.dbqueue_enqueue_check(
        'dbqueue_enqueue: '::text, 'job_type'::text, job_type, v_payload, v_queue, v_priority,
        run_after, delay, v_max_attempts, v_lease, idempotency_key, unique_key, v_unique_while,
        false, serial_key
    );
    IF unique_key IS NOT NULL AND v_unique_while IS NULL THEN
        v_unique_while := 'active';
    END IF;
    job := {schema}.dbqueue_enqueue_row(
        job_type, v_payload, v_queue, v_priority,
        coalesce(run_after, now() + coalesce(delay, interval '0')), v_max_attempts, v_lease,
        idempotency_key, unique_key, v_unique_while, false, serial_key
    );
    IF job.o_due THEN
        PERFORM {schema}.dbqueue_wake_at_commit(v_queue, 1::bigint);
    END IF;
    RETURN job.o_id;
END
$fn$;

-- dbqueue_enqueue(..., unique_key, unique_while => 'pending', debounce => true) as 0022 had it:
-- the pending, not yet started holder of the unique key (of the same type) takes this call's
-- payload and run_after, whoever enqueued it; else a new job holds the key. A door of its own,
-- so that a role granted dbqueue_enqueue() can add jobs but not change another's.
CREATE OR REPLACE FUNCTION {schema}.dbqueue_debounce(
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
) RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    v_payload jsonb := coalesce(nullif(payload, 'null'::jsonb), '{}'::jsonb);
    v_queue text := coalesce(queue, 'default');
    v_priority int := coalesce(priority, 0);
    v_max_attempts int := coalesce(max_attempts, 10);
    v_lease double precision := coalesce(lease_seconds, 60::double precision);
    job record;
BEGIN
    IF unique_key IS NULL THEN
        PERFORM {schema}.dbqueue_enqueue_fail('dbqueue_debounce: '::text,
            'unique_key must be a non-empty string of at most 300 characters, got NULL'::text,
            'the key of the pending job that this call pushes back'::text);
    END IF;
    PERFORM {schema}.dbqueue_enqueue_check(
        'dbqueue_debounce: '::text, 'job_type'::text, job_type, v_payload, v_queue, v_priority,
        run_after, delay, v_max_attempts, v_lease, NULL::text, unique_key, 'pending'::text,
        true, serial_key
    );
    job := {schema}.dbqueue_enqueue_row(
        job_type, v_payload, v_queue, v_priority,
        coalesce(run_after, now() + coalesce(delay, interval '0')), v_max_attempts, v_lease,
        NULL::text, unique_key, 'pending'::text, true, serial_key
    );
    IF job.o_due THEN
        PERFORM {schema}.dbqueue_wake_at_commit(v_queue, 1::bigint);
    END IF;
    RETURN job.o_id;
END
$fn$;

-- The look of store.wakeups._wakeup_wanted() (a test compares them), which now names the queue
-- as text wherever it is a varchar column (hashtext(queue::text)); here it is text already.
CREATE OR REPLACE FUNCTION {schema}.dbqueue_wakeup_wanted(p_queue text) RETURNS boolean
LANGUAGE sql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT CASE WHEN NOT pg_try_advisory_lock(1684173105, hashtext(p_queue::text)) THEN true WHEN NOT pg_advisory_unlock(1684173105, hashtext(p_queue::text)) THEN true WHEN NOT pg_try_advisory_xact_lock_shared(1684173106, hashtext(p_queue::text)) THEN true WHEN pg_try_advisory_lock(1684173105, hashtext(p_queue::text)) THEN NOT pg_advisory_unlock(1684173105, hashtext(p_queue::text)) ELSE true END
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


def any_payload(apps, schema_editor):
    """Install FUNCTIONS (the three functions above), in the migration's transaction."""
    _install(schema_editor, FUNCTIONS)


def object_payloads(apps, schema_editor):
    """Install the three functions as migration 0026 wrote them."""
    previous = importlib.import_module("django_dbqueue.migrations.0026_hardened_functions")
    texts = {m.group(1): m.group(0) for m in _FUNCTION.finditer(previous.ENQUEUE)}
    names = [m.group(1) for m in _FUNCTION.finditer(FUNCTIONS)]
    _install(schema_editor, "\n".join(texts[name] for name in names))


def _range(table, column):
    return models.CheckConstraint(
        condition=models.Q(
            (f"{column}__gte", datetime.datetime(1, 1, 2, 0, 0, tzinfo=datetime.UTC)),
            (f"{column}__lte", datetime.datetime(9999, 12, 30, 0, 0, tzinfo=datetime.UTC)),
        ),
        name=f"{table}_{column}_range",
    )


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0026_hardened_functions"),
    ]

    operations = [
        migrations.RunPython(any_payload, object_payloads),
        migrations.RunPython(repair, migrations.RunPython.noop),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(ADD_CONSTRAINTS, DROP_CONSTRAINTS)],
            state_operations=[
                migrations.AddConstraint(
                    model_name="backgroundjob",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("lease_seconds__lte", MAX_SECONDS)),
                        name="dbqueue_job_lease_bounded",
                    ),
                ),
                *(
                    migrations.AddConstraint(
                        model_name="backgroundjob", constraint=_range("dbqueue_job", c)
                    )
                    for c in TIMESTAMPS
                ),
                *(
                    migrations.AddConstraint(model_name=model, constraint=_range(table, c))
                    for table, (model, columns) in OTHER_TABLES.items()
                    for c in columns
                ),
            ],
        ),
    ]
