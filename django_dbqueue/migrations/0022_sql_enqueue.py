# Enqueue from plain SQL (docs/sql.md, issue 28): dbqueue_enqueue() and dbqueue_enqueue_many(), so
# that a trigger, a psql script or a service in another language puts a job in the queue inside
# its own transaction, with the rows enqueue() writes and the wake-up enqueue() would send.
#
# - dbqueue_enqueue(job_type, payload, queue, ...): one job; returns its id (or, for an
#   idempotency key or a unique key already held, the holder's id, as enqueue() returns it).
# - dbqueue_enqueue_many(jobs jsonb): an array of objects with the same keys (no unique keys, as
#   enqueue_many() takes none); every item is checked before anything is written; the ids come
#   back as a bigint[] in the order given.
#
# Both are SECURITY DEFINER with a fixed search_path (pg_catalog, the schema the tables are in,
# pg_temp last), and EXECUTE is revoked from PUBLIC: a role granted EXECUTE on them needs no
# privilege on dbqueue_job, and can do nothing to it but enqueue. No statement is built from an
# argument; every value is bound. The helpers below are SECURITY INVOKER and revoked from PUBLIC
# too: nobody but the owner calls them except through the two functions, so no row is written
# that the checks did not see.
#
# The SQL cannot read the Django settings nor the @job registry: NULL (or a missing argument)
# means a fixed default, documented in docs/sql.md (queue 'default', priority 0, max_attempts 10,
# lease 60 s: the DBQUEUE defaults for a type with no options), and a job type no worker knows is
# not refused here (a worker defers it, then dead-letters it: UNKNOWN_TYPE_DELAY/GRACE).
#
# The rows: the columns and values of store/jobs.py's INSERT statements (INSERT_JOB_VARIANTS), the
# same ON CONFLICT arbiters (the idempotency key's unique index; the live unique key's partial
# index, whose predicate is store.jobs.UNIQUE_HELD_SQL), the same debounce update, the same
# "insert again when the holder finished in between" loop as enqueue._enqueue_unique.
#
# The wake-up: there is no after-commit hook in SQL, so the notification is sent inside the
# caller's transaction (delivered at its commit, dropped by its rollback), on the main channel,
# naming no slot (as store.wakeups.NOTIFY_AT_COMMIT), and only when a worker waits: the same
# advisory-lock look as the INSERT's (store.wakeups._wakeup_wanted, written out here in
# dbqueue_wakeup_wanted; a test compares the two). Within one transaction the calls on one queue
# notify at the 1st, 2nd, 4th, 8th... job that wants a wake-up, with the count so far: a trigger
# on a 10,000-row INSERT sends 14 notifications, not 10,000 (PostgreSQL would merge identical
# payloads into one, which would tell a --processes group of one job only). The count lives in a
# transaction-local setting, dbqueue.wakeups_<md5 of the queue>. The channel is the setting
# dbqueue.notify_channel when set (ALTER DATABASE ... SET), else 'dbqueue', NOTIFY_CHANNEL's
# default.

from django.db import migrations

FUNCTIONS = r"""
CREATE FUNCTION dbqueue_wakeup_wanted(p_queue text) RETURNS boolean
LANGUAGE sql VOLATILE STRICT AS $fn$
    SELECT CASE WHEN NOT pg_try_advisory_lock(1684173105, hashtext(p_queue)) THEN true WHEN NOT pg_advisory_unlock(1684173105, hashtext(p_queue)) THEN true WHEN NOT pg_try_advisory_xact_lock_shared(1684173106, hashtext(p_queue)) THEN true WHEN pg_try_advisory_lock(1684173105, hashtext(p_queue)) THEN NOT pg_advisory_unlock(1684173105, hashtext(p_queue)) ELSE true END
$fn$;

CREATE FUNCTION dbqueue_wake_at_commit(p_queue text, p_count bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT AS $fn$
DECLARE
    counter text := 'dbqueue.wakeups_' || md5(p_queue);
    before bigint;
    after bigint;
    step bigint := 1;
BEGIN
    IF p_count < 1 OR NOT dbqueue_wakeup_wanted(p_queue) THEN
        RETURN false;
    END IF;
    before := coalesce(nullif(current_setting(counter, true), ''), '0')::bigint;
    after := before + p_count;
    PERFORM set_config(counter, after::text, true);
    WHILE step * 2 <= after LOOP
        step := step * 2;
    END LOOP;
    IF before > 0 AND step <= before THEN
        RETURN false;  -- no power of two crossed since this transaction's last notification
    END IF;
    PERFORM pg_notify(
        coalesce(nullif(current_setting('dbqueue.notify_channel', true), ''), 'dbqueue'),
        after::text || ':' || p_queue
    );
    RETURN true;
END
$fn$;

CREATE FUNCTION dbqueue_enqueue_fail(p_where text, p_message text, p_hint text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'invalid_parameter_value',
        MESSAGE = p_where || p_message,
        HINT = coalesce(p_hint, 'See docs/sql.md for the arguments of dbqueue_enqueue().');
END
$fn$;

CREATE FUNCTION dbqueue_enqueue_shown(p_value text) RETURNS text
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT CASE WHEN p_value IS NULL THEN 'NULL'
                WHEN length(p_value) > 60 THEN quote_literal(left(p_value, 57)) || '...'
                ELSE quote_literal(p_value) END
$fn$;

-- The rules of validation.py, jobspec.prepare() and enqueue() that SQL can check, worded as
-- they are; p_where starts each message ('dbqueue_enqueue: ', 'dbqueue_enqueue_many: jobs[3]: ').
CREATE FUNCTION dbqueue_enqueue_check(
    p_where text, p_type_label text, p_type text, p_payload jsonb, p_queue text,
    p_priority int, p_run_after timestamptz, p_delay interval, p_max_attempts int,
    p_lease double precision, p_idempotency_key text, p_unique_key text,
    p_unique_while text, p_debounce boolean, p_serial_key text
) RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    delay_seconds numeric;
BEGIN
    IF p_type IS NULL OR p_type = '' OR length(p_type) > 200 THEN
        PERFORM dbqueue_enqueue_fail(p_where, format(
            '%s must be a non-empty string of at most 200 characters, got %s',
            p_type_label, dbqueue_enqueue_shown(p_type)),
            'the name of a registered @job type');
    END IF;
    IF jsonb_typeof(p_payload) IS DISTINCT FROM 'object' THEN
        PERFORM dbqueue_enqueue_fail(p_where, format(
            'payload must be a JSON object, got %s %s', jsonb_typeof(p_payload),
            dbqueue_enqueue_shown(p_payload::text)),
            'wrap the value: jsonb_build_object(''value'', ...)');
    END IF;
    IF p_queue = '' OR length(p_queue) > 100 THEN
        PERFORM dbqueue_enqueue_fail(p_where, format(
            'queue must be a non-empty string of at most 100 characters, got %s',
            dbqueue_enqueue_shown(p_queue)), 'a queue of DBQUEUE[''QUEUES'']');
    END IF;
    IF p_priority NOT BETWEEN -100 AND 100 THEN
        PERFORM dbqueue_enqueue_fail(p_where, format(
            'priority must be an integer from -100 to 100 (higher runs first), got %s',
            p_priority));
    END IF;
    IF p_run_after IS NOT NULL AND p_delay IS NOT NULL THEN
        PERFORM dbqueue_enqueue_fail(p_where, 'pass run_after or delay, not both');
    END IF;
    IF NOT isfinite(p_run_after) THEN
        PERFORM dbqueue_enqueue_fail(p_where, format(
            'run_after must be a finite timestamptz, got %s', p_run_after));
    END IF;
    delay_seconds := extract(epoch FROM p_delay);
    IF delay_seconds NOT BETWEEN 0 AND 315360000 THEN
        PERFORM dbqueue_enqueue_fail(p_where, format(
            'delay must be an interval from 0 to 315360000 seconds (ten years), got %s',
            dbqueue_enqueue_shown(p_delay::text)));
    END IF;
    IF p_max_attempts < 1 THEN
        PERFORM dbqueue_enqueue_fail(p_where, format(
            'max_attempts must be an integer from 1 to 2147483647, got %s', p_max_attempts));
    END IF;
    IF NOT (p_lease > 0 AND p_lease <= 86400) THEN
        PERFORM dbqueue_enqueue_fail(p_where, format(
            'lease_seconds must be a number of seconds greater than 0 and at most 86400, got %s',
            p_lease));
    END IF;
    IF p_idempotency_key = '' OR length(p_idempotency_key) > 300 THEN
        PERFORM dbqueue_enqueue_fail(p_where, format(
            'idempotency_key must be a non-empty string of at most 300 characters, got %s',
            dbqueue_enqueue_shown(p_idempotency_key)));
    END IF;
    IF p_unique_key = '' OR length(p_unique_key) > 300 THEN
        PERFORM dbqueue_enqueue_fail(p_where, format(
            'unique_key must be a non-empty string of at most 300 characters, got %s',
            dbqueue_enqueue_shown(p_unique_key)));
    END IF;
    IF p_serial_key = '' OR length(p_serial_key) > 300 THEN
        PERFORM dbqueue_enqueue_fail(p_where, format(
            'serial_key must be a non-empty string of at most 300 characters, got %s',
            dbqueue_enqueue_shown(p_serial_key)));
    END IF;
    IF p_unique_while IS NOT NULL THEN
        IF p_unique_while NOT IN ('pending', 'active') THEN
            PERFORM dbqueue_enqueue_fail(p_where, format(
                'unique_while must be ''pending'' or ''active'', got %s',
                dbqueue_enqueue_shown(p_unique_while)));
        END IF;
        IF p_unique_key IS NULL THEN
            PERFORM dbqueue_enqueue_fail(p_where, format(
                'unique_while=%s needs a unique_key', dbqueue_enqueue_shown(p_unique_while)));
        END IF;
    END IF;
    IF p_debounce AND p_unique_while IS DISTINCT FROM 'pending' THEN
        PERFORM dbqueue_enqueue_fail(p_where, format(
            'debounce needs unique_while=''pending'' (and a unique_key), got unique_while=%s',
            dbqueue_enqueue_shown(coalesce(p_unique_while, CASE WHEN p_unique_key IS NOT NULL
                                                                THEN 'active' END))),
            'only a job that has not started can be pushed back');
    END IF;
    IF p_idempotency_key IS NOT NULL AND p_unique_key IS NOT NULL THEN
        PERFORM dbqueue_enqueue_fail(p_where, format(
            'pass idempotency_key or unique_key, not both (got idempotency_key=%s, unique_key=%s)',
            dbqueue_enqueue_shown(p_idempotency_key), dbqueue_enqueue_shown(p_unique_key)),
            'an idempotency key already allows one job per key in any state');
    END IF;
END
$fn$;

-- One job's row, checked already: store/jobs.py's INSERT with its conflict clause. o_id is the
-- job's id (the existing holder's when nothing was inserted), o_created whether this call
-- inserted it, o_due whether the row inserted (or debounced) is due by the database's clock
-- (NULL when nothing was written: no wake-up).
CREATE FUNCTION dbqueue_enqueue_row(
    p_type text, p_payload jsonb, p_queue text, p_priority int, p_run_after timestamptz,
    p_max_attempts int, p_lease double precision, p_idempotency_key text, p_unique_key text,
    p_unique_while text, p_debounce boolean, p_serial_key text,
    OUT o_id bigint, OUT o_created boolean, OUT o_due boolean
) LANGUAGE plpgsql AS $fn$
BEGIN
    FOR n_try IN 1 .. 100 LOOP
        IF p_unique_key IS NULL THEN
            INSERT INTO dbqueue_job (
                type, queue, payload, state, priority, run_after, attempts, max_attempts,
                lease_seconds, idempotency_key, errors, created_at, serial_key
            )
            VALUES (
                p_type, p_queue, p_payload, 'pending', p_priority, p_run_after, 0,
                p_max_attempts, p_lease, p_idempotency_key, '[]'::jsonb, now(), p_serial_key
            )
            ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
            RETURNING id, true, run_after <= now() INTO o_id, o_created, o_due;
            IF FOUND THEN
                RETURN;
            END IF;
            SELECT id INTO o_id FROM dbqueue_job WHERE idempotency_key = p_idempotency_key;
        ELSIF p_debounce THEN
            INSERT INTO dbqueue_job (
                type, queue, payload, state, priority, run_after, attempts, max_attempts,
                lease_seconds, idempotency_key, errors, created_at, unique_key, unique_while,
                serial_key
            )
            VALUES (
                p_type, p_queue, p_payload, 'pending', p_priority, p_run_after, 0,
                p_max_attempts, p_lease, NULL, '[]'::jsonb, now(), p_unique_key,
                p_unique_while, p_serial_key
            )
            ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
                AND state IN ('pending', 'waiting', 'running')
                AND (unique_while = 'active' OR started_at IS NULL)
            DO UPDATE SET run_after = EXCLUDED.run_after, payload = EXCLUDED.payload
                WHERE dbqueue_job.state = 'pending' AND dbqueue_job.started_at IS NULL
                  AND dbqueue_job.type = EXCLUDED.type
            RETURNING id, xmax = 0, run_after <= now() INTO o_id, o_created, o_due;
            IF FOUND THEN
                RETURN;
            END IF;
            SELECT id INTO o_id FROM dbqueue_job
            WHERE unique_key = p_unique_key AND unique_key IS NOT NULL
              AND state IN ('pending', 'waiting', 'running')
              AND (unique_while = 'active' OR started_at IS NULL);
        ELSE
            INSERT INTO dbqueue_job (
                type, queue, payload, state, priority, run_after, attempts, max_attempts,
                lease_seconds, idempotency_key, errors, created_at, unique_key, unique_while,
                serial_key
            )
            VALUES (
                p_type, p_queue, p_payload, 'pending', p_priority, p_run_after, 0,
                p_max_attempts, p_lease, NULL, '[]'::jsonb, now(), p_unique_key,
                p_unique_while, p_serial_key
            )
            ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
                AND state IN ('pending', 'waiting', 'running')
                AND (unique_while = 'active' OR started_at IS NULL)
            DO NOTHING
            RETURNING id, true, run_after <= now() INTO o_id, o_created, o_due;
            IF FOUND THEN
                RETURN;
            END IF;
            SELECT id INTO o_id FROM dbqueue_job
            WHERE unique_key = p_unique_key AND unique_key IS NOT NULL
              AND state IN ('pending', 'waiting', 'running')
              AND (unique_while = 'active' OR started_at IS NULL);
        END IF;
        IF o_id IS NOT NULL THEN
            o_created := false;
            o_due := NULL;
            RETURN;
        END IF;
        -- The key's holder finished (or was deleted) between the two statements: again.
    END LOOP;
    PERFORM dbqueue_enqueue_fail('dbqueue_enqueue: ', format(
        '%s %s: its holder kept finishing between the insert and the read 100 times in a row; '
        'nothing was enqueued',
        CASE WHEN p_unique_key IS NULL THEN 'idempotency_key' ELSE 'unique_key' END,
        dbqueue_enqueue_shown(coalesce(p_unique_key, p_idempotency_key))));
END
$fn$;

CREATE FUNCTION dbqueue_enqueue(
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
) RETURNS bigint LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $fn$
DECLARE
    v_payload jsonb := coalesce(payload, '{}'::jsonb);
    v_queue text := coalesce(queue, 'default');
    v_priority int := coalesce(priority, 0);
    v_max_attempts int := coalesce(max_attempts, 10);
    v_lease double precision := coalesce(lease_seconds, 60);
    v_debounce boolean := coalesce(debounce, false);
    v_unique_while text := unique_while;
    job record;
BEGIN
    PERFORM dbqueue_enqueue_check(
        'dbqueue_enqueue: ', 'job_type', job_type, v_payload, v_queue, v_priority, run_after,
        delay, v_max_attempts, v_lease, idempotency_key, unique_key, v_unique_while,
        v_debounce, serial_key
    );
    IF unique_key IS NOT NULL AND v_unique_while IS NULL THEN
        v_unique_while := 'active';
    END IF;
    job := dbqueue_enqueue_row(
        job_type, v_payload, v_queue, v_priority,
        coalesce(run_after, now() + coalesce(delay, interval '0')), v_max_attempts, v_lease,
        idempotency_key, unique_key, v_unique_while, v_debounce, serial_key
    );
    IF job.o_due THEN
        PERFORM dbqueue_wake_at_commit(v_queue, 1);
    END IF;
    RETURN job.o_id;
END
$fn$;

-- A bigint or a number of seconds from a JSON number that is whole; NULL for JSON null or absent.
CREATE FUNCTION dbqueue_enqueue_number(p_where text, p_key text, p_value jsonb, p_whole boolean)
RETURNS numeric LANGUAGE plpgsql AS $fn$
BEGIN
    IF p_value IS NULL OR p_value = 'null'::jsonb THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_value) <> 'number' OR (p_whole AND p_value::numeric <> trunc(p_value::numeric))
    THEN
        PERFORM dbqueue_enqueue_fail(p_where, format(
            '%s must be %s, got %s', p_key,
            CASE WHEN p_whole THEN 'an integer' ELSE 'a number of seconds' END,
            dbqueue_enqueue_shown(p_value::text)));
    END IF;
    RETURN p_value::numeric;
END
$fn$;

CREATE FUNCTION dbqueue_enqueue_string(p_where text, p_key text, p_value jsonb)
RETURNS text LANGUAGE plpgsql AS $fn$
BEGIN
    IF p_value IS NULL OR p_value = 'null'::jsonb THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_value) <> 'string' THEN
        PERFORM dbqueue_enqueue_fail(p_where, format(
            '%s must be a string, got %s', p_key, dbqueue_enqueue_shown(p_value::text)));
    END IF;
    RETURN p_value #>> '{}';
END
$fn$;

CREATE FUNCTION dbqueue_enqueue_many(jobs jsonb) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER AS $fn$
DECLARE
    allowed CONSTANT text[] := ARRAY[
        'type', 'payload', 'queue', 'priority', 'run_after', 'delay', 'max_attempts',
        'lease_seconds', 'idempotency_key', 'serial_key'
    ];
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
        PERFORM dbqueue_enqueue_fail('dbqueue_enqueue_many: ', format(
            'jobs must be a JSON array of objects, got %s',
            dbqueue_enqueue_shown(jobs::text)),
            'jsonb_build_array(jsonb_build_object(''type'', ''send-email'', ''payload'', ...))');
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
            PERFORM dbqueue_enqueue_fail(w, format(
                'must be an object of dbqueue_enqueue() arguments or a [type, payload] pair, '
                'got %s', dbqueue_enqueue_shown(item::text)));
        END IF;
        SELECT array_agg(k ORDER BY k) INTO unknown
        FROM jsonb_object_keys(item) AS k WHERE k <> ALL (allowed);
        IF unknown IS NOT NULL THEN
            PERFORM dbqueue_enqueue_fail(w, format(
                'has unknown keys %s; allowed: %s', unknown, allowed),
                CASE WHEN 'unique_key' = ANY (unknown)
                     THEN 'dbqueue_enqueue_many() takes no unique jobs: call dbqueue_enqueue() for each' END);
        END IF;
        IF NOT item ? 'type' THEN
            PERFORM dbqueue_enqueue_fail(w, 'has no ''type''');
        END IF;
        v_text := dbqueue_enqueue_string(w, 'type', item -> 'type');
        types := types || v_text;
        payloads := payloads || coalesce(nullif(item -> 'payload', 'null'::jsonb), '{}'::jsonb);
        queues := queues || coalesce(dbqueue_enqueue_string(w, 'queue', item -> 'queue'), 'default');
        num := dbqueue_enqueue_number(w, 'priority', item -> 'priority', true);
        IF num NOT BETWEEN -100 AND 100 THEN
            PERFORM dbqueue_enqueue_fail(w, format(
                'priority must be an integer from -100 to 100 (higher runs first), got %s', num));
        END IF;
        priorities := priorities || coalesce(num::int, 0);
        num := dbqueue_enqueue_number(w, 'max_attempts', item -> 'max_attempts', true);
        IF num NOT BETWEEN 1 AND 2147483647 THEN
            PERFORM dbqueue_enqueue_fail(w, format(
                'max_attempts must be an integer from 1 to 2147483647, got %s', num));
        END IF;
        max_attempts := max_attempts || coalesce(num::int, 10);
        num := dbqueue_enqueue_number(w, 'lease_seconds', item -> 'lease_seconds', false);
        leases := leases || coalesce(num::double precision, 60);
        num := dbqueue_enqueue_number(w, 'delay', item -> 'delay', false);
        IF num NOT BETWEEN 0 AND 315360000 THEN
            PERFORM dbqueue_enqueue_fail(w, format(
                'delay must be a number of seconds from 0 to 315360000 (ten years), got %s', num));
        END IF;
        v_delay := make_interval(secs => num::double precision);
        v_text := dbqueue_enqueue_string(w, 'run_after', item -> 'run_after');
        v_run_after := NULL;
        IF v_text IS NOT NULL THEN
            BEGIN
                v_run_after := v_text::timestamptz;
            EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow
                           OR invalid_parameter_value THEN
                PERFORM dbqueue_enqueue_fail(w, format(
                    'run_after must be a timestamp with a UTC offset, got %s',
                    dbqueue_enqueue_shown(v_text)), 'ISO 8601: 2030-01-31T12:00:00+00:00');
            END;
        END IF;
        keys := keys || dbqueue_enqueue_string(w, 'idempotency_key', item -> 'idempotency_key');
        serial_keys := serial_keys || dbqueue_enqueue_string(w, 'serial_key', item -> 'serial_key');
        PERFORM dbqueue_enqueue_check(
            w, 'type', types[i + 1], payloads[i + 1], queues[i + 1], priorities[i + 1],
            v_run_after, v_delay, max_attempts[i + 1], leases[i + 1], keys[i + 1], NULL, NULL,
            false, serial_keys[i + 1]
        );
        run_afters := run_afters || coalesce(v_run_after, now() + coalesce(v_delay, interval '0'));
    END LOOP;
    FOR i IN 1 .. n LOOP
        job := dbqueue_enqueue_row(
            types[i], payloads[i], queues[i], priorities[i], run_afters[i], max_attempts[i],
            leases[i], keys[i], NULL, NULL, false, serial_keys[i]
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
        PERFORM dbqueue_wake_at_commit(v_queue, num::bigint);
    END LOOP;
    RETURN ids;
END
$fn$;

-- Fixed search_path (the schema the tables are in: this migration's), pg_temp last; only the
-- two entry points are callable by others, and only once granted.
DO $do$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY[
        'dbqueue_wakeup_wanted(text)',
        'dbqueue_wake_at_commit(text, bigint)',
        'dbqueue_enqueue_fail(text, text, text)',
        'dbqueue_enqueue_shown(text)',
        'dbqueue_enqueue_check(text, text, text, jsonb, text, int, timestamptz, interval, int,'
            ' double precision, text, text, text, boolean, text)',
        'dbqueue_enqueue_row(text, jsonb, text, int, timestamptz, int, double precision, text,'
            ' text, text, boolean, text)',
        'dbqueue_enqueue(text, jsonb, text, int, timestamptz, interval, int, double precision,'
            ' text, text, text, boolean, text)',
        'dbqueue_enqueue_number(text, text, jsonb, boolean)',
        'dbqueue_enqueue_string(text, text, jsonb)',
        'dbqueue_enqueue_many(jsonb)'
    ] LOOP
        EXECUTE format(
            'ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, current_schema()
        );
        EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$do$;
"""

DROP_FUNCTIONS = """
DROP FUNCTION IF EXISTS dbqueue_enqueue_many(jsonb);
DROP FUNCTION IF EXISTS dbqueue_enqueue_string(text, text, jsonb);
DROP FUNCTION IF EXISTS dbqueue_enqueue_number(text, text, jsonb, boolean);
DROP FUNCTION IF EXISTS dbqueue_enqueue(
    text, jsonb, text, int, timestamptz, interval, int, double precision, text, text, text,
    boolean, text
);
DROP FUNCTION IF EXISTS dbqueue_enqueue_row(
    text, jsonb, text, int, timestamptz, int, double precision, text, text, text, boolean, text
);
DROP FUNCTION IF EXISTS dbqueue_enqueue_check(
    text, text, text, jsonb, text, int, timestamptz, interval, int, double precision, text, text,
    text, boolean, text
);
DROP FUNCTION IF EXISTS dbqueue_enqueue_shown(text);
DROP FUNCTION IF EXISTS dbqueue_enqueue_fail(text, text, text);
DROP FUNCTION IF EXISTS dbqueue_wake_at_commit(text, bigint);
DROP FUNCTION IF EXISTS dbqueue_wakeup_wanted(text);
"""


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0021_snoozes_waits_signals"),
    ]

    operations = [
        migrations.RunSQL(sql=FUNCTIONS, reverse_sql=DROP_FUNCTIONS),
    ]
