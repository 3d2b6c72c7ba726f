# Every SQL function of the package, written as if its caller were hostile (issue 35, docs/sql.md
# "Privileges", docs/code-map.md "Rules"). Until now dbqueue_enqueue() and dbqueue_enqueue_many(),
# SECURITY DEFINER, ran with search_path = pg_catalog, <the tables' schema>, pg_temp, and their
# bodies used operators and functions with no exact match in pg_catalog (float8 > 0, numeric
# BETWEEN int AND int, format(text, text), our own dbqueue_wake_at_commit(text, bigint) called
# with an int): a role with EXECUTE on them and CREATE on that schema (public: the default before
# PostgreSQL 15, and kept by pg_upgrade) created public.>(double precision, integer), and its
# function ran as the owner of dbqueue_enqueue(). The other functions, not SECURITY DEFINER, run
# with their caller's search_path: public.hashtextextended(text, integer) ran as the worker, from
# the serial-key turn of its claim.
#
# This migration installs every function again (the whole text, below), on one rule:
# - Either the function has `SET search_path = pg_catalog, pg_temp`: every name in it that is not
#   schema-qualified is then looked up in pg_catalog alone (PostgreSQL never looks for functions
#   or operators in pg_temp, and looks there last for tables and types), whatever the caller's
#   search_path and whatever anybody created anywhere else. That is every function of the
#   package but five.
# - Or, for five hot helpers, no SET clause, and every name qualified by hand:
#   OPERATOR(pg_catalog.=), pg_catalog.hashtextextended(), pg_catalog.text. They are
#   dbqueue_serial_turn() (called for each keyed candidate of a claim: a SET clause costs a
#   GUC save and restore per call and a new search-path lookup after it), dbqueue_serial_free()
#   (the same, for each keyed job of the limited and fair walks), dbqueue_limiter_lock() (an
#   IMMUTABLE SQL function that PostgreSQL inlines into its callers' statements; a SET clause
#   stops the inlining), dbqueue_slot_channel() (called for each slot a wake-up names, on the
#   wake-up's path) and dbqueue_rate_room() (called per limiter of every limited claim, and by
#   store/flow.py's statement). Written so, each resolves exactly what it resolved before in
#   a database where nobody shadowed anything: the same operators, so the same plans
#   (tests/integration/test_plans.py reads them).
# - In both kinds, the tables and our own functions are named with their schema, the schema of
#   dbqueue_job, found when this migration runs (Django creates its tables in the connection's
#   current_schema(); "{schema}" below is replaced by it, quoted). That schema may be one a
#   caller can create objects in, so a call of one of our functions passes every argument,
#   each of its declared type (a cast where a literal, a varchar column or an int would
#   otherwise be coerced): the exact match is then ours, and no overload with other argument
#   types, in any schema, is a better one.
# - The operators the issue named are exactly typed too (0::double precision, numeric
#   literals), although under the pinned path only pg_catalog's could be chosen.
#
# What the SQL doors accept, and the new function (docs/sql.md):
# - Payloads: what Python's json reads back unchanged, as enqueue() requires (payloads.py):
#   nesting at most 100 levels; an integer of at most 4300 digits; a number with a fraction
#   (which Python reads as a float) below 1e16 in magnitude and equal to the float Python reads
#   from it (1.50 and 0.1 are; 0.1000000000000000055 is not: it would come back as 0.1).
#   dbqueue_enqueue_payload_problem() says which value, by its path, as enqueue() does. A
#   payload with no such number costs two jsonpath walks that find nothing.
# - run_after: from 0001-01-02 to 9999-12-30 (UTC), validation.TIMESTAMP_MIN/MAX; in
#   dbqueue_enqueue_many(), an ISO 8601 text with a UTC offset, not 'tomorrow', 'epoch' or a
#   time without an offset.
# - dbqueue_debounce(): debounce replaces the payload and run_after of the pending job that
#   holds a unique key, which another producer may have enqueued; it is a function of its own,
#   granted on its own. dbqueue_enqueue(debounce => true) is refused, pointing at it.
#
# Migrating back to 0025 installs the functions as the earlier migrations wrote them
# (_previous_functions()) and drops the new ones.

import importlib
import re

from django.db import migrations

# -- claims: serial keys and limits ---------------------------------------------------------------

# 0016's serial-key turn and free test, 0016's limiter lock and 0010's rate room: no SET clause
# (above), every name qualified. OPERATOR(...) has one precedence whatever the operator, so
# every operand is in parentheses where precedence would otherwise decide.
SERIAL_AND_LIMITS = """
CREATE OR REPLACE FUNCTION {schema}.dbqueue_serial_turn(key text, job_id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT COST 1 AS $fn$
DECLARE
    lock_key bigint;
    memo pg_catalog.text;
BEGIN
    IF EXISTS (
        SELECT 1 FROM {schema}.dbqueue_job AS o
        WHERE o.serial_key OPERATOR(pg_catalog.=) key
          AND o.state OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'running'])
          AND o.id OPERATOR(pg_catalog.<>) job_id
          AND (o.state OPERATOR(pg_catalog.=) 'running' OR o.id OPERATOR(pg_catalog.<) job_id)
    ) THEN
        RETURN false;
    END IF;
    lock_key := pg_catalog.hashtextextended(
        'dbqueue serial key' OPERATOR(pg_catalog.||) pg_catalog.chr(31)
            OPERATOR(pg_catalog.||) key,
        0);
    memo := COALESCE(pg_catalog.current_setting('dbqueue.serial_turns', true), '');
    IF pg_catalog.strpos(memo, ',' OPERATOR(pg_catalog.||) lock_key OPERATOR(pg_catalog.||) ':')
       OPERATOR(pg_catalog.>) 0 THEN  -- this claim approved a job of the key
        RETURN pg_catalog.strpos(memo, ',' OPERATOR(pg_catalog.||) lock_key
                                       OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) job_id
                                       OPERATOR(pg_catalog.||) ',')
               OPERATOR(pg_catalog.>) 0;
    END IF;
    IF NOT pg_catalog.pg_try_advisory_xact_lock(lock_key) THEN
        RETURN false;  -- another claim is deciding this key's turn now
    END IF;
    IF EXISTS (
        SELECT 1 FROM {schema}.dbqueue_job AS o
        WHERE o.serial_key OPERATOR(pg_catalog.=) key
          AND o.state OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'running'])
          AND o.id OPERATOR(pg_catalog.<>) job_id
          AND (o.state OPERATOR(pg_catalog.=) 'running' OR o.id OPERATOR(pg_catalog.<) job_id)
    ) THEN
        RETURN false;
    END IF;
    PERFORM pg_catalog.set_config(
        'dbqueue.serial_turns',
        memo OPERATOR(pg_catalog.||) ',' OPERATOR(pg_catalog.||) lock_key OPERATOR(pg_catalog.||)
            ':' OPERATOR(pg_catalog.||) job_id OPERATOR(pg_catalog.||) ',',
        true);
    RETURN true;
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.dbqueue_serial_free(key text, job_id bigint) RETURNS boolean
LANGUAGE sql STABLE STRICT COST 1 AS $fn$
    SELECT NOT EXISTS (
        SELECT 1 FROM {schema}.dbqueue_job AS o
        WHERE o.serial_key OPERATOR(pg_catalog.=) key
          AND o.state OPERATOR(pg_catalog.=) ANY (ARRAY['pending', 'running'])
          AND o.id OPERATOR(pg_catalog.<>) job_id
          AND (o.state OPERATOR(pg_catalog.=) 'running' OR o.id OPERATOR(pg_catalog.<) job_id)
    )
$fn$;

CREATE OR REPLACE FUNCTION {schema}.dbqueue_limiter_lock(p_scope text, p_name text, p_part text)
RETURNS bigint LANGUAGE sql IMMUTABLE STRICT AS $fn$
    SELECT pg_catalog.hashtextextended(
        'dbqueue limiter' OPERATOR(pg_catalog.||) pg_catalog.chr(31) OPERATOR(pg_catalog.||) p_scope
            OPERATOR(pg_catalog.||) pg_catalog.chr(31) OPERATOR(pg_catalog.||) p_name
            OPERATOR(pg_catalog.||) pg_catalog.chr(31) OPERATOR(pg_catalog.||) p_part,
        0)
$fn$;

CREATE OR REPLACE FUNCTION {schema}.dbqueue_rate_room(
    starts timestamptz[], lim int, period float8, OUT room int, OUT reopen timestamptz
) LANGUAGE sql STABLE AS $fn$
    SELECT lim OPERATOR(pg_catalog.-) pg_catalog.count(*)::int,
           (pg_catalog.array_agg(s ORDER BY s))[
               (pg_catalog.count(*)::int OPERATOR(pg_catalog.-) lim) OPERATOR(pg_catalog.+) 1]
               OPERATOR(pg_catalog.+) (period OPERATOR(pg_catalog.*) interval '1 second')
    FROM pg_catalog.unnest(starts) AS s
    WHERE s OPERATOR(pg_catalog.>)
          (pg_catalog.now() OPERATOR(pg_catalog.-) (period OPERATOR(pg_catalog.*) interval '1 second'))
$fn$;
"""

# 0016's partition room, limited claim and its 0010 wrapper: the pinned path; tables and our
# functions named with their schema, every argument of its declared type.
CLAIM_LIMITED = """
CREATE OR REPLACE FUNCTION {schema}.dbqueue_partition_room(
    p_scope text, p_name text, p_part text, lim int, period float8,
    OUT room int, OUT reopen timestamptz
) LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    st timestamptz[];
BEGIN
    SELECT l.starts INTO st FROM {schema}.dbqueue_limiter AS l
    WHERE l.scope = p_scope AND l.name = p_name AND l.part = p_part
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        PERFORM 1 FROM {schema}.dbqueue_limiter AS l
        WHERE l.scope = p_scope AND l.name = p_name AND l.part = p_part;
        IF FOUND OR NOT pg_try_advisory_xact_lock(
            {schema}.dbqueue_limiter_lock(p_scope::text, p_name::text, p_part::text))
        THEN
            room := NULL;  -- another claimer holds it, or is creating it
            RETURN;
        END IF;
        INSERT INTO {schema}.dbqueue_limiter (scope, name, part) VALUES (p_scope, p_name, p_part)
        ON CONFLICT (scope, name, part) DO NOTHING;
        SELECT l.starts INTO st FROM {schema}.dbqueue_limiter AS l
        WHERE l.scope = p_scope AND l.name = p_name AND l.part = p_part
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            room := NULL;
            RETURN;
        END IF;
    END IF;
    SELECT x.room, x.reopen INTO room, reopen
    FROM {schema}.dbqueue_rate_room(st::timestamptz[], lim::int, period::float8) AS x;
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.dbqueue_claim_within_limits(
    p_queues text[], p_lims int[], p_limit int, p_worker text, p_token bigint,
    q_conc int[], q_rate_n int[], q_rate_period float8[], q_rate_key text[],
    t_names text[], t_conc int[], t_rate_n int[], t_rate_period float8[], t_rate_key text[]
) RETURNS TABLE (
    id bigint, type text, queue text, payload text, attempts int, max_attempts int,
    lease_seconds float8, idempotency_key text, priority smallint, created_at timestamptz,
    wait float8, traceparent text, keyed boolean
) LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
    n_q int := coalesce(cardinality(p_queues), 0);
    n_t int := coalesce(cardinality(t_names), 0);
    remaining int := p_limit;
    picked bigint[] := '{}';
    paused text[];
    full_types text[] := '{}';
    t_room int[] := '{}';   -- per type: jobs it may still start (NULL: no such limit)
    t_held boolean[] := '{}';  -- per type: its concurrency limit is what bounds t_room
    lock_scope text[]; lock_name text[];
    rec_scope text[] := '{}'; rec_name text[] := '{}'; rec_part text[] := '{}';
    rec_n int[] := '{}'; rec_period float8[] := '{}';
    part_key text[] := '{}'; part_room int[] := '{}';
    full_parts text[] := '{}';  -- partitions (part_key entries) with no room left
    scanned int; grew boolean; pk text;
    reopen timestamptz;
    held boolean := false;
    busy boolean := false;
    c int; r int; ro timestamptz; want int; k int; i int; conc_room int;
    tp int; qp int; st timestamptz[];
    cand record;
    got bigint[];
BEGIN
    -- (a) create and lock the limiter rows, in key order (their advisory locks first)
    SELECT coalesce(array_agg(w.scope ORDER BY w.scope, w.name), '{}'),
           coalesce(array_agg(w.name ORDER BY w.scope, w.name), '{}')
    INTO lock_scope, lock_name
    FROM (
        SELECT 'queue' AS scope, x.q AS name
        FROM unnest(p_queues, q_conc, q_rate_n, q_rate_key) AS x(q, cc, rn, rk)
        WHERE x.cc IS NOT NULL OR (x.rn IS NOT NULL AND x.rk IS NULL)
        UNION
        SELECT 'type', x.t
        FROM unnest(t_names, t_conc, t_rate_n, t_rate_key) AS x(t, cc, rn, rk)
        WHERE x.cc IS NOT NULL OR (x.rn IS NOT NULL AND x.rk IS NULL)
    ) AS w;
    IF cardinality(lock_scope) > 0 THEN
        FOR k IN 1..cardinality(lock_scope) LOOP
            PERFORM pg_advisory_xact_lock(
                {schema}.dbqueue_limiter_lock(lock_scope[k]::text, lock_name[k]::text, ''::text));
        END LOOP;
        INSERT INTO {schema}.dbqueue_limiter (scope, name, part)
        SELECT s, n, '' FROM unnest(lock_scope, lock_name) AS u(s, n) ORDER BY 1, 2
        ON CONFLICT (scope, name, part) DO NOTHING;
        PERFORM 1 FROM {schema}.dbqueue_limiter AS l
        WHERE (l.scope, l.name) IN (SELECT * FROM unnest(lock_scope, lock_name)) AND l.part = ''
        ORDER BY l.scope, l.name
        FOR UPDATE;
    END IF;
    SELECT coalesce(array_agg(s.name::text), '{}') INTO paused
    FROM {schema}.dbqueue_queue AS s WHERE s.name = ANY(p_queues) AND s.paused;

    -- (b) the room of each limited type, counted after the locks
    FOR k IN 1..n_t LOOP
        r := NULL;
        conc_room := NULL;
        IF t_conc[k] IS NOT NULL THEN
            SELECT count(*) INTO c FROM {schema}.dbqueue_job AS j
            WHERE j.state = 'running' AND j.type = t_names[k];
            conc_room := greatest(t_conc[k] - c, 0);
            r := conc_room;
        END IF;
        IF t_rate_n[k] IS NOT NULL AND t_rate_key[k] IS NULL THEN
            SELECT l.starts INTO st FROM {schema}.dbqueue_limiter AS l
            WHERE l.scope = 'type' AND l.name = t_names[k] AND l.part = '';
            SELECT x.room, x.reopen INTO c, ro
            FROM {schema}.dbqueue_rate_room(st::timestamptz[], t_rate_n[k]::int,
                                            t_rate_period[k]::float8) AS x;
            IF c <= 0 THEN reopen := least(reopen, ro); END IF;
            r := least(coalesce(r, c), greatest(c, 0));
        END IF;
        t_room := t_room || r;
        t_held := t_held || (conc_room IS NOT NULL AND conc_room <= coalesce(r, conc_room));
        IF r = 0 THEN
            full_types := full_types || t_names[k];
            IF conc_room = 0 THEN held := true; END IF;
        END IF;
    END LOOP;

    -- (c) each queue in turn, within its room
    FOR i IN 1..n_q LOOP
        EXIT WHEN remaining <= 0;
        CONTINUE WHEN p_queues[i] = ANY(paused);
        want := least(p_lims[i], remaining);
        conc_room := NULL;
        IF q_conc[i] IS NOT NULL THEN
            SELECT count(*) INTO c FROM {schema}.dbqueue_job AS j
            WHERE j.state = 'running' AND j.queue = p_queues[i];
            conc_room := greatest(q_conc[i] - c, 0);
            want := least(want, conc_room);
        END IF;
        IF q_rate_n[i] IS NOT NULL AND q_rate_key[i] IS NULL THEN
            SELECT l.starts INTO st FROM {schema}.dbqueue_limiter AS l
            WHERE l.scope = 'queue' AND l.name = p_queues[i] AND l.part = '';
            SELECT x.room, x.reopen INTO c, ro
            FROM {schema}.dbqueue_rate_room(st::timestamptz[], q_rate_n[i]::int,
                                            q_rate_period[i]::float8) AS x;
            IF c <= 0 THEN reopen := least(reopen, ro); END IF;
            want := least(want, greatest(c, 0));
        END IF;
        IF conc_room = 0 THEN held := true; END IF;
        CONTINUE WHEN want <= 0;
        IF n_t = 0 AND q_rate_key[i] IS NULL THEN
            -- no per-job rule: the plain claim of this queue
            got := ARRAY(
                SELECT j.id FROM {schema}.dbqueue_job AS j
                WHERE j.state = 'pending' AND j.queue = p_queues[i] AND j.run_after <= now()
                  AND (j.serial_key IS NULL
                       OR {schema}.dbqueue_serial_turn(j.serial_key::text, j.id::bigint))
                ORDER BY j.priority DESC, j.run_after, j.id
                LIMIT want
                FOR UPDATE SKIP LOCKED
            );
            picked := picked || got;
            remaining := remaining - cardinality(got);
            IF q_rate_n[i] IS NOT NULL THEN
                rec_scope := rec_scope || array_fill('queue'::text, ARRAY[cardinality(got)]);
                rec_name := rec_name || array_fill(p_queues[i], ARRAY[cardinality(got)]);
                rec_part := rec_part || array_fill(''::text, ARRAY[cardinality(got)]);
                rec_n := rec_n || array_fill(q_rate_n[i], ARRAY[cardinality(got)]);
                rec_period := rec_period || array_fill(q_rate_period[i], ARRAY[cardinality(got)]);
            END IF;
            IF conc_room IS NOT NULL AND cardinality(got) >= conc_room THEN held := true; END IF;
            CONTINUE;
        END IF;
        -- job by job. Types and partitions known to be full are left out of the scan, which
        -- is bounded; when a pass met its bound and found more full ones, the next pass skips
        -- them too (a partition with a long backlog does not hide the others behind it).
        FOR pass_no IN 1..5 LOOP
            scanned := 0;
            grew := false;
            FOR cand IN
                SELECT j.id AS jid, j.type::text AS jtype, j.payload AS jpayload,
                       j.serial_key::text AS jkey
                FROM {schema}.dbqueue_job AS j
                WHERE j.state = 'pending' AND j.queue = p_queues[i] AND j.run_after <= now()
                  AND (j.serial_key IS NULL
                       OR {schema}.dbqueue_serial_free(j.serial_key::text, j.id::bigint))
                  AND NOT (j.id = ANY(picked))
                  AND NOT (j.type = ANY(full_types))
                  AND NOT (cardinality(full_parts) > 0 AND (
                      'queue' || chr(31) || p_queues[i] || chr(31)
                          || coalesce(j.payload ->> q_rate_key[i], '') = ANY(full_parts)
                      OR 'type' || chr(31) || j.type || chr(31) || coalesce(j.payload
                          ->> t_rate_key[array_position(t_names, j.type::text)], '')
                          = ANY(full_parts)))
                ORDER BY j.priority DESC, j.run_after, j.id
                LIMIT 1000
            LOOP
                scanned := scanned + 1;
                k := array_position(t_names, cand.jtype);
                CONTINUE WHEN k IS NOT NULL AND t_room[k] <= 0;
                tp := NULL;
                qp := NULL;
                IF k IS NOT NULL AND t_rate_key[k] IS NOT NULL THEN
                    pk := 'type' || chr(31) || t_names[k] || chr(31)
                          || coalesce(cand.jpayload ->> t_rate_key[k], '');
                    tp := array_position(part_key, pk);
                    IF tp IS NULL THEN
                        SELECT x.room, x.reopen INTO c, ro
                        FROM {schema}.dbqueue_partition_room(
                            'type'::text, t_names[k]::text,
                            coalesce(cand.jpayload ->> t_rate_key[k], '')::text,
                            t_rate_n[k]::int, t_rate_period[k]::float8) AS x;
                        IF c IS NULL THEN busy := true; c := 0;
                        ELSIF c <= 0 THEN reopen := least(reopen, ro); END IF;
                        part_key := part_key || pk;
                        part_room := part_room || greatest(c, 0);
                        tp := cardinality(part_key);
                        IF c <= 0 THEN full_parts := full_parts || pk; grew := true; END IF;
                    END IF;
                    CONTINUE WHEN part_room[tp] <= 0;
                END IF;
                IF q_rate_key[i] IS NOT NULL THEN
                    pk := 'queue' || chr(31) || p_queues[i] || chr(31)
                          || coalesce(cand.jpayload ->> q_rate_key[i], '');
                    qp := array_position(part_key, pk);
                    IF qp IS NULL THEN
                        SELECT x.room, x.reopen INTO c, ro
                        FROM {schema}.dbqueue_partition_room(
                            'queue'::text, p_queues[i]::text,
                            coalesce(cand.jpayload ->> q_rate_key[i], '')::text,
                            q_rate_n[i]::int, q_rate_period[i]::float8) AS x;
                        IF c IS NULL THEN busy := true; c := 0;
                        ELSIF c <= 0 THEN reopen := least(reopen, ro); END IF;
                        part_key := part_key || pk;
                        part_room := part_room || greatest(c, 0);
                        qp := cardinality(part_key);
                        IF c <= 0 THEN full_parts := full_parts || pk; grew := true; END IF;
                    END IF;
                    CONTINUE WHEN part_room[qp] <= 0;
                END IF;
                CONTINUE WHEN cand.jkey IS NOT NULL
                    AND NOT {schema}.dbqueue_serial_turn(cand.jkey::text, cand.jid::bigint);
                PERFORM 1 FROM {schema}.dbqueue_job AS j
                WHERE j.id = cand.jid AND j.state = 'pending'
                FOR UPDATE SKIP LOCKED;
                CONTINUE WHEN NOT FOUND;
                picked := picked || cand.jid;
                remaining := remaining - 1;
                want := want - 1;
                IF k IS NOT NULL THEN
                    t_room[k] := t_room[k] - 1;
                    IF t_room[k] = 0 THEN
                        full_types := full_types || t_names[k];
                        IF t_held[k] THEN held := true; END IF;
                    END IF;
                    IF t_rate_n[k] IS NOT NULL THEN
                        rec_scope := rec_scope || 'type'::text;
                        rec_name := rec_name || t_names[k];
                        rec_part := rec_part || CASE WHEN tp IS NULL THEN '' ELSE
                            coalesce(cand.jpayload ->> t_rate_key[k], '') END;
                        rec_n := rec_n || t_rate_n[k];
                        rec_period := rec_period || t_rate_period[k];
                    END IF;
                    IF tp IS NOT NULL THEN
                        part_room[tp] := part_room[tp] - 1;
                        IF part_room[tp] = 0 THEN
                            full_parts := full_parts || part_key[tp];
                            grew := true;
                        END IF;
                    END IF;
                END IF;
                IF q_rate_n[i] IS NOT NULL THEN
                    rec_scope := rec_scope || 'queue'::text;
                    rec_name := rec_name || p_queues[i];
                    rec_part := rec_part || CASE WHEN qp IS NULL THEN '' ELSE
                        coalesce(cand.jpayload ->> q_rate_key[i], '') END;
                    rec_n := rec_n || q_rate_n[i];
                    rec_period := rec_period || q_rate_period[i];
                END IF;
                IF qp IS NOT NULL THEN
                    part_room[qp] := part_room[qp] - 1;
                    IF part_room[qp] = 0 THEN
                        full_parts := full_parts || part_key[qp];
                        grew := true;
                    END IF;
                END IF;
                EXIT WHEN want <= 0 OR remaining <= 0;
            END LOOP;
            EXIT WHEN want <= 0 OR remaining <= 0 OR scanned < 1000 OR NOT grew;
        END LOOP;
        IF conc_room IS NOT NULL AND want <= 0 THEN held := true; END IF;
    END LOOP;

    -- the rate windows: drop what left the period, add one start per job claimed
    IF cardinality(rec_scope) > 0 THEN
        WITH added AS (
            SELECT x.scope, x.name, x.part, max(x.n) AS n, max(x.period) AS period,
                   count(*)::int AS cnt
            FROM unnest(rec_scope, rec_name, rec_part, rec_n, rec_period)
                AS x(scope, name, part, n, period)
            GROUP BY 1, 2, 3
        ),
        updated AS (
            UPDATE {schema}.dbqueue_limiter AS l
            SET starts = ARRAY(SELECT s FROM unnest(l.starts) AS s
                               WHERE s > now() - a.period * interval '1 second'
                               ORDER BY s DESC LIMIT a.n)
                         || array_fill(now(), ARRAY[a.cnt]),
                updated_at = now()
            FROM added AS a
            WHERE l.scope = a.scope AND l.name = a.name AND l.part = a.part
            RETURNING l.starts, a.n, a.period
        )
        SELECT min(x.reopen) INTO ro
        FROM updated AS u
        CROSS JOIN LATERAL {schema}.dbqueue_rate_room(u.starts::timestamptz[], u.n::int,
                                                      u.period::float8) AS x
        WHERE x.room <= 0;
        reopen := least(reopen, ro);
    END IF;

    RETURN QUERY
    UPDATE {schema}.dbqueue_job AS j
    SET state = 'running',
        attempts = j.attempts + 1,
        worker_id = p_worker,
        lease_token = p_token,
        started_at = now(),
        leased_until = now() + j.lease_seconds * interval '1 second'
    FROM unnest(picked) AS c(cid)
    WHERE j.id = c.cid
    RETURNING j.id, j.type::text, j.queue::text, j.payload::text, j.attempts::int,
              j.max_attempts::int, j.lease_seconds, j.idempotency_key::text, j.priority,
              j.created_at, EXTRACT(EPOCH FROM now() - j.run_after)::float8, j.traceparent::text,
              j.serial_key IS NOT NULL;
    IF held OR busy OR reopen IS NOT NULL THEN
        IF busy THEN reopen := least(reopen, now() + interval '50 milliseconds'); END IF;
        RETURN QUERY SELECT NULL::bigint, CASE WHEN held THEN 'held' END, NULL::text,
            NULL::text, NULL::int, NULL::int, NULL::float8, NULL::text, NULL::smallint,
            NULL::timestamptz,
            -- (greatest() ignores a NULL: no reopening must stay NULL, not become 1 ms)
            CASE WHEN reopen IS NOT NULL
                 THEN greatest(EXTRACT(EPOCH FROM reopen - now())::float8, 0.001) END,
            NULL::text, NULL::boolean;
    END IF;
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.dbqueue_claim_limited(
    p_queues text[], p_lims int[], p_limit int, p_worker text, p_token bigint,
    q_conc int[], q_rate_n int[], q_rate_period float8[], q_rate_key text[],
    t_names text[], t_conc int[], t_rate_n int[], t_rate_period float8[], t_rate_key text[]
) RETURNS TABLE (
    id bigint, type text, queue text, payload text, attempts int, max_attempts int,
    lease_seconds float8, idempotency_key text, priority smallint, created_at timestamptz,
    wait float8, traceparent text
) LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT f.id, f.type, f.queue, f.payload, f.attempts, f.max_attempts, f.lease_seconds,
           f.idempotency_key, f.priority, f.created_at, f.wait, f.traceparent
    FROM {schema}.dbqueue_claim_within_limits(
        p_queues::text[], p_lims::int[], p_limit::int, p_worker::text, p_token::bigint,
        q_conc::int[], q_rate_n::int[], q_rate_period::float8[], q_rate_key::text[],
        t_names::text[], t_conc::int[], t_rate_n::int[], t_rate_period::float8[],
        t_rate_key::text[]) AS f
$fn$;
"""

# -- workflows, cancels, signals: the triggers and the completion's late release ------------------

# 0015's trigger functions and late release, 0023's signal: the pinned path, tables named with
# their schema. A trigger function runs as whoever fired it (a worker, an operator, the owner
# inside dbqueue_enqueue()): the pinned path is what it resolves names with, whoever that is.
WORKFLOWS = """
CREATE OR REPLACE FUNCTION {schema}.dbqueue_settle_dependents() RETURNS trigger
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    woken text[];
    s_waiting CONSTANT text := 'waiting';
    s_dead CONSTANT text := 'dead';
    s_cancelled CONSTANT text := 'cancelled';
BEGIN
    -- The dependents this change concerns, locked in id order before anything reads them: the
    -- statements below take their snapshots after every transaction that held one committed.
    PERFORM 1 FROM {schema}.dbqueue_job
    WHERE id IN (SELECT job_id FROM {schema}.dbqueue_dependency WHERE depends_on_id = NEW.id)
      AND state IN (s_waiting, s_cancelled)
    ORDER BY id
    FOR NO KEY UPDATE;
    IF NEW.state IN ('dead', 'cancelled') THEN
        UPDATE {schema}.dbqueue_job AS d
        SET state = 'cancelled', waiting_on = 0, finished_at = now(),
            errors = d.errors || jsonb_build_array(jsonb_build_object(
                'attempt', d.attempts,
                'class', 'DependencyFailed',
                'message', 'dependency #' || NEW.id || ' (' || NEW.type || ') is '
                           || NEW.state || '; cancelled without running',
                'traceback', '',
                'worker', NULL,
                'dependency', NEW.id,
                'at', now()))
        FROM {schema}.dbqueue_dependency AS e
        WHERE e.depends_on_id = NEW.id AND d.id = e.job_id AND d.state = s_waiting
          AND NOT e.run_on_failure;
    ELSIF OLD.state IN ('dead', 'cancelled') AND NEW.state IN ('pending', 'waiting') THEN
        UPDATE {schema}.dbqueue_job AS d
        SET state = 'waiting', finished_at = NULL,
            waiting_on = (
            SELECT count(*) FROM {schema}.dbqueue_dependency AS e2
            JOIN {schema}.dbqueue_job AS p ON p.id = e2.depends_on_id
            WHERE e2.job_id = d.id AND p.state <> 'done'
              AND NOT (e2.run_on_failure AND p.state IN ('dead', 'cancelled'))),
            errors = d.errors || jsonb_build_array(jsonb_build_object(
                'attempt', d.attempts,
                'class', 'DependencyRequeued',
                'message', 'dependency #' || NEW.id || ' (' || NEW.type || ') was requeued; '
                           || 'waiting for it again',
                'traceback', '',
                'worker', NULL,
                'requeued', true,
                'dependency', NEW.id,
                'at', now()))
        FROM {schema}.dbqueue_dependency AS e
        WHERE e.depends_on_id = NEW.id AND d.id = e.job_id AND d.state = s_cancelled
          AND d.errors -> -1 ->> 'class' = 'DependencyFailed'
          AND NOT EXISTS (
              SELECT 1 FROM {schema}.dbqueue_dependency AS e3
              JOIN {schema}.dbqueue_job AS p3 ON p3.id = e3.depends_on_id
              WHERE e3.job_id = d.id AND NOT e3.run_on_failure
                AND p3.state IN (s_dead, s_cancelled));
    ELSE
        RETURN NULL;
    END IF;
    -- Those still waiting (an on_failure="run" edge: this dependency finished, or is back)
    -- count their unsatisfied dependencies again; none left makes them pending, due now.
    WITH recounted AS MATERIALIZED (
        SELECT d.id, (
            SELECT count(*) FROM {schema}.dbqueue_dependency AS e2
            JOIN {schema}.dbqueue_job AS p ON p.id = e2.depends_on_id
            WHERE e2.job_id = d.id AND p.state <> 'done'
              AND NOT (e2.run_on_failure AND p.state IN ('dead', 'cancelled'))) AS n
        FROM {schema}.dbqueue_job AS d
        WHERE d.id IN (SELECT job_id FROM {schema}.dbqueue_dependency
                       WHERE depends_on_id = NEW.id)
          AND d.state = s_waiting
    ),
    released AS (
        UPDATE {schema}.dbqueue_job AS d
        SET waiting_on = r.n,
            state = CASE WHEN r.n = 0 THEN 'pending' ELSE 'waiting' END,
            run_after = CASE WHEN r.n = 0 THEN GREATEST(d.run_after, now()) ELSE d.run_after END
        FROM recounted AS r
        WHERE d.id = r.id AND d.waiting_on <> r.n
        RETURNING d.queue, d.state
    )
    SELECT array_agg(DISTINCT queue) FILTER (WHERE state = 'pending') INTO woken
    FROM released;
    IF woken IS NOT NULL THEN
        PERFORM pg_notify(TG_ARGV[0], q) FROM unnest(woken) AS q;
    END IF;
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.dbqueue_release_late(unseen bigint[], completing bigint[])
RETURNS SETOF text LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    s_waiting CONSTANT text := 'waiting';
    s_cancelled CONSTANT text := 'cancelled';
BEGIN
    PERFORM 1 FROM {schema}.dbqueue_job
    WHERE id = ANY(unseen) AND state IN (s_waiting, s_cancelled)
    ORDER BY id FOR NO KEY UPDATE;
    RETURN QUERY
    WITH recounted AS (
        SELECT d.id, (
            SELECT count(*) FROM {schema}.dbqueue_dependency AS e
            JOIN {schema}.dbqueue_job AS p ON p.id = e.depends_on_id
            WHERE e.job_id = d.id AND p.state <> 'done' AND NOT (p.id = ANY(completing))
              AND NOT (e.run_on_failure AND p.state IN ('dead', 'cancelled'))
        ) AS n
        FROM {schema}.dbqueue_job AS d
        WHERE d.id = ANY(unseen) AND d.state = s_waiting
    ),
    released AS (
        UPDATE {schema}.dbqueue_job AS d
        SET waiting_on = r.n,
            state = CASE WHEN r.n = 0 THEN 'pending' ELSE 'waiting' END,
            run_after = CASE WHEN r.n = 0 THEN GREATEST(d.run_after, now()) ELSE d.run_after END
        FROM recounted AS r
        WHERE d.id = r.id
        RETURNING d.queue, d.state
    )
    SELECT DISTINCT queue::text FROM released WHERE state = 'pending';
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.dbqueue_apply_link() RETURNS trigger
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    dep_state text;
    dep_type text;
    woken text;
    s_waiting CONSTANT text := 'waiting';
BEGIN
    DELETE FROM {schema}.dbqueue_link_at_commit WHERE id = NEW.id;
    -- Waits for a transaction changing the dependency, then appends to its newest version.
    UPDATE {schema}.dbqueue_job SET dependents = COALESCE(dependents, '{}') || NEW.job_id
    WHERE id = NEW.depends_on_id
    RETURNING state, type INTO dep_state, dep_type;
    IF dep_state IN ('dead', 'cancelled') AND NOT NEW.run_on_failure THEN
        UPDATE {schema}.dbqueue_job AS d
        SET state = 'cancelled', waiting_on = 0, finished_at = now(),
            errors = d.errors || jsonb_build_array(jsonb_build_object(
                'attempt', d.attempts,
                'class', 'DependencyFailed',
                'message', 'dependency #' || NEW.depends_on_id || ' (' || dep_type || ') is '
                           || dep_state || '; cancelled without running',
                'traceback', '',
                'worker', NULL,
                'dependency', NEW.depends_on_id,
                'at', now()))
        WHERE d.id = NEW.job_id AND d.state = s_waiting;
        RETURN NULL;
    END IF;
    UPDATE {schema}.dbqueue_job AS d
    SET waiting_on = r.n,
        state = CASE WHEN r.n = 0 THEN 'pending' ELSE 'waiting' END,
        run_after = CASE WHEN r.n = 0 THEN GREATEST(d.run_after, now()) ELSE d.run_after END
    FROM (SELECT (
            SELECT count(*) FROM {schema}.dbqueue_dependency AS e2
            JOIN {schema}.dbqueue_job AS p ON p.id = e2.depends_on_id
            WHERE e2.job_id = NEW.job_id AND p.state <> 'done'
              AND NOT (e2.run_on_failure AND p.state IN ('dead', 'cancelled'))) AS n) AS r
    WHERE d.id = NEW.job_id AND d.state = s_waiting AND d.waiting_on <> r.n
    RETURNING CASE WHEN r.n = 0 THEN d.queue END INTO woken;
    IF woken IS NOT NULL THEN
        PERFORM pg_notify(TG_ARGV[0], woken);
    END IF;
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.dbqueue_apply_cancel() RETURNS trigger
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    DELETE FROM {schema}.dbqueue_cancel_at_commit WHERE id = NEW.id;
    UPDATE {schema}.dbqueue_job AS j
    SET state = CASE WHEN j.state = 'running' THEN 'running' ELSE 'cancelled' END,
        finished_at = CASE WHEN j.state = 'running' THEN NULL ELSE now() END,
        waiting_on = 0,
        cancel_requested_at = COALESCE(j.cancel_requested_at, now()),
        cancelled_by = COALESCE(j.cancelled_by, NEW.cancelled_by)
    WHERE j.id = NEW.job_id AND j.state IN ('pending', 'waiting', 'running');
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.dbqueue_apply_signal() RETURNS trigger
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    UPDATE {schema}.dbqueue_job
    SET signal_seq = signal_seq + 1,
        run_after = CASE WHEN state = 'pending' AND wait_reason = 'signal:' || NEW.name
                              AND wait_token = lease_token THEN LEAST(run_after, now())
                         ELSE run_after END
    WHERE id = NEW.job_id AND state NOT IN ('done', 'dead', 'cancelled');
    RETURN NULL;
END
$fn$;
"""

# -- wake-ups that name their workers (0014) ------------------------------------------------------

# dbqueue_slot_channel() has no SET clause (every name qualified: it is on the path of every
# named wake-up); the others have the pinned path and call it, and each other, with their
# schema and exact argument types.
WAKEUPS = """
CREATE OR REPLACE FUNCTION {schema}.dbqueue_slot_channel(p_channel text, p_queue text, p_slot int)
RETURNS text LANGUAGE sql IMMUTABLE STRICT AS $fn$
    SELECT 'dbq.' OPERATOR(pg_catalog.||) p_slot OPERATOR(pg_catalog.||) '.'
           OPERATOR(pg_catalog.||) pg_catalog.left(pg_catalog.md5(
               p_channel OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) p_queue), 24)
$fn$;

CREATE OR REPLACE FUNCTION {schema}.dbqueue_take_slots(
    p_channel text, p_queues text[], p_slots int, p_listened int[]
) RETURNS int[] LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    taken int[] := '{}';
    slot int;
    old int;
    q text;
BEGIN
    IF current_setting('tcp_keepalives_idle')::int > 30 THEN
        PERFORM set_config('tcp_keepalives_idle', '30', false);
    END IF;
    IF current_setting('tcp_keepalives_interval')::int > 10 THEN
        PERFORM set_config('tcp_keepalives_interval', '10', false);
    END IF;
    IF current_setting('tcp_keepalives_count')::int > 3 THEN
        PERFORM set_config('tcp_keepalives_count', '3', false);
    END IF;
    -- Keepalives only probe an idle connection; this session also LISTENs, and a notification
    -- sent to a dead host stays unacknowledged: close the connection once data has been
    -- unacknowledged for a minute (rather than after the kernel's retries, about 15 minutes).
    IF current_setting('tcp_user_timeout')::int NOT BETWEEN 1 AND 60000 THEN
        PERFORM set_config('tcp_user_timeout', '60000', false);
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_queues, 1), 0) LOOP
        q := p_queues[i];
        old := p_listened[i];
        slot := NULL;
        FOR s IN 0 .. p_slots - 1 LOOP
            IF pg_try_advisory_lock(hashtextextended(p_channel || ':' || q, s)) THEN
                slot := s;
                EXIT;
            END IF;
        END LOOP;
        IF old IS DISTINCT FROM slot THEN
            IF old IS NOT NULL THEN
                EXECUTE format('UNLISTEN %I',
                               {schema}.dbqueue_slot_channel(p_channel::text, q::text, old::int));
            END IF;
            IF slot IS NOT NULL THEN
                EXECUTE format('LISTEN %I',
                               {schema}.dbqueue_slot_channel(p_channel::text, q::text, slot::int));
            END IF;
        END IF;
        taken := taken || slot;
    END LOOP;
    RETURN taken;
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.dbqueue_pick_slots(p_name text, p_count int, p_slots int)
RETURNS int[] LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    wanted int := p_count + 1;
    free int := 0;
    held int[] := '{}';
    k bigint;
    got boolean := false;
BEGIN
    IF wanted > p_slots THEN
        RETURN NULL;
    END IF;
    BEGIN
        FOR s IN 0 .. p_slots - 1 LOOP
            k := hashtextextended(p_name, s);
            got := pg_try_advisory_lock_shared(k);
            IF got THEN
                PERFORM pg_advisory_unlock_shared(k);
                got := false;
                free := free + 1;
                EXIT WHEN free >= 16;
            ELSE
                held := held || s;
                free := 0;
                EXIT WHEN cardinality(held) >= wanted + 64;
            END IF;
        END LOOP;
    EXCEPTION WHEN OTHERS OR query_canceled THEN
        IF got THEN  -- stopped between taking a free slot and letting go of it
            PERFORM pg_advisory_unlock_shared(k);
        END IF;
        RAISE;
    END;
    IF cardinality(held) < wanted THEN
        RETURN NULL;
    END IF;
    RETURN (
        SELECT array_agg(s ORDER BY s)
        FROM (SELECT s FROM unnest(held) AS s ORDER BY random() LIMIT wanted) AS picked
    );
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.dbqueue_wakeup_payload(
    p_channel text, p_payload text, p_slots int
) RETURNS text LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    head text := split_part(p_payload, ':', 1);
    picked int[];
BEGIN
    IF head !~ '^[0-9]{1,9}$' OR position(':' IN p_payload) = 0 THEN
        RETURN p_payload;
    END IF;
    picked := {schema}.dbqueue_pick_slots(
        (p_channel || ':' || substr(p_payload, length(head) + 2))::text, head::int, p_slots::int
    );
    IF picked IS NULL THEN
        RETURN p_payload;
    END IF;
    RETURN head || '/' || array_to_string(picked, '.') || substr(p_payload, length(head) + 1);
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.dbqueue_wake(p_channel text, p_payload text, p_slots int)
RETURNS text LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    payload text := {schema}.dbqueue_wakeup_payload(p_channel::text, p_payload::text,
                                                    p_slots::int);
    queue text;
    slot text;
BEGIN
    IF payload = p_payload THEN
        PERFORM pg_notify(p_channel, payload);
        RETURN payload;
    END IF;
    queue := substr(payload, position(':' IN payload) + 1);
    FOREACH slot IN ARRAY string_to_array(split_part(split_part(payload, ':', 1), '/', 2), '.')
    LOOP
        PERFORM pg_notify({schema}.dbqueue_slot_channel(p_channel::text, queue::text, slot::int),
                          payload);
    END LOOP;
    RETURN payload;
END
$fn$;
"""

# -- enqueue from SQL (0022) ----------------------------------------------------------------------

# 0022's functions, with the pinned path (0022 had the tables' schema in it too), our functions
# named with their schema, every argument given and of its declared type; the payload and
# run_after checks; dbqueue_debounce(). dbqueue_wakeup_wanted() keeps 0022's text, the CASE of
# store.wakeups._wakeup_wanted() (a test compares them): its calls are exactly typed already.
ENQUEUE = r"""
CREATE OR REPLACE FUNCTION {schema}.dbqueue_wakeup_wanted(p_queue text) RETURNS boolean
LANGUAGE sql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT CASE WHEN NOT pg_try_advisory_lock(1684173105, hashtext(p_queue)) THEN true WHEN NOT pg_advisory_unlock(1684173105, hashtext(p_queue)) THEN true WHEN NOT pg_try_advisory_xact_lock_shared(1684173106, hashtext(p_queue)) THEN true WHEN pg_try_advisory_lock(1684173105, hashtext(p_queue)) THEN NOT pg_advisory_unlock(1684173105, hashtext(p_queue)) ELSE true END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.dbqueue_wake_at_commit(p_queue text, p_count bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    counter text := 'dbqueue.wakeups_' || md5(p_queue);
    before bigint;
    after bigint;
    step bigint := 1;
BEGIN
    IF p_count < 1 OR NOT {schema}.dbqueue_wakeup_wanted(p_queue::text) THEN
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

CREATE OR REPLACE FUNCTION {schema}.dbqueue_enqueue_fail(
    p_where text, p_message text, p_hint text DEFAULT NULL
) RETURNS void LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'invalid_parameter_value',
        MESSAGE = p_where || p_message,
        HINT = coalesce(p_hint, 'See docs/sql.md for the arguments of dbqueue_enqueue().');
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.dbqueue_enqueue_shown(p_value text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT CASE WHEN p_value IS NULL THEN 'NULL'
                WHEN length(p_value) > 60 THEN quote_literal(left(p_value, 57)) || '...'
                ELSE quote_literal(p_value) END
$fn$;

-- Every value of a payload with its path (payloads._where()'s spelling: payload["a"][0]), down
-- to 100 steps; read only to name the value a refusal is about.
CREATE OR REPLACE FUNCTION {schema}.dbqueue_enqueue_payload_walk(p_payload jsonb)
RETURNS TABLE (o_steps text[], o_value jsonb)
LANGUAGE sql STABLE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
    WITH RECURSIVE walk (steps, value) AS (
        SELECT '{}'::text[], p_payload
        UNION ALL
        SELECT w.steps || c.step, c.value
        FROM walk AS w
        CROSS JOIN LATERAL (
            SELECT '[' || to_json(e.key)::text || ']' AS step, e.value
            FROM jsonb_each(CASE WHEN jsonb_typeof(w.value) = 'object' THEN w.value END) AS e
            UNION ALL
            SELECT '[' || (a.i - 1) || ']', a.value
            FROM jsonb_array_elements(CASE WHEN jsonb_typeof(w.value) = 'array' THEN w.value END)
                WITH ORDINALITY AS a (value, i)
        ) AS c
        WHERE cardinality(w.steps) < 100
    )
    SELECT steps, value FROM walk
$fn$;

-- Whether Python's json reads this number of a payload back as the same number, as enqueue()
-- requires of what it writes (payloads.check()), else what is wrong with it. jsonb prints a
-- number as numeric does, never with an exponent: Python reads an int from a number with no
-- fraction digits (scale 0) and a float from one with some. An int has at most 4300 digits
-- (Python's int() refuses more). A float is finite, below 1e16 in magnitude (past it, Python
-- writes it back as 1e+16, which jsonb keeps as an integer), and the very number its text
-- says: the shortest text of the nearest double (float8 output with extra_float_digits = 1,
-- as Python's repr()), read as numeric, equals it. Below the smallest double, PostgreSQL
-- refuses the conversion, and Python would read 0.0 or 5e-324.
CREATE OR REPLACE FUNCTION {schema}.dbqueue_enqueue_number_problem(p_value numeric)
RETURNS text LANGUAGE plpgsql STABLE STRICT
SET search_path = pg_catalog, pg_temp SET extra_float_digits = 1 AS $fn$
DECLARE
    nearest double precision;
BEGIN
    IF scale(p_value) = 0 THEN
        IF abs(p_value) < 1e4300 THEN
            RETURN NULL;
        END IF;
        RETURN format(
            'is an integer of %s digits; at most 4300 digits can be read back by Python''s json '
            '(send it as a string)', length(abs(p_value)::text));
    END IF;
    IF p_value = 0::numeric THEN
        RETURN NULL;
    END IF;
    IF abs(p_value) >= 1e16 THEN
        RETURN format(
            'is %s, which Python reads as a float of magnitude 1e16 or more: PostgreSQL''s jsonb '
            'returns such a float as a different number (an integer), so it would come back '
            'changed; send an integer or a string',
            {schema}.dbqueue_enqueue_shown(p_value::text));
    END IF;
    IF abs(p_value) < 2.4703282292062328e-324 THEN
        RETURN format(
            'is %s, smaller than any float: Python reads it as a different number (0.0 or '
            '5e-324); send 0 or a string', {schema}.dbqueue_enqueue_shown(p_value::text));
    END IF;
    nearest := p_value::double precision;
    IF nearest::text::numeric = p_value THEN
        RETURN NULL;
    END IF;
    RETURN format(
        'is %s, which Python reads as the float %s, a different number, so it would come back '
        'changed; send the float''s digits, or a string',
        {schema}.dbqueue_enqueue_shown(p_value::text), nearest::text);
END
$fn$;

-- The payload rules of enqueue() (payloads.check()) that a jsonb can break, as
-- '<path> <what is wrong>', or NULL. jsonb refuses a NUL and a lone surrogate itself; a float
-- cannot be -0.0, NaN or infinite in it. What is left: nesting deeper than 100 levels (a
-- container 100 steps down), and the numbers of dbqueue_enqueue_number_problem(). The jsonpath
-- filter passes it only the numbers that may be wrong (with a fraction, or of 2**53 or more in
-- magnitude: every other number is an int Python reads exactly, or a float whose value is an
-- integer below 2**53, which a double holds exactly); a payload with none costs two walks.
CREATE OR REPLACE FUNCTION {schema}.dbqueue_enqueue_payload_problem(p_payload jsonb)
RETURNS text LANGUAGE plpgsql STABLE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    suspect CONSTANT jsonpath := 'strict $.** ? (@.type() == "number" && (@.floor() != @ '
        '|| @ >= 9007199254740992 || @ <= -9007199254740992))';
    v numeric;
    problem text;
BEGIN
    IF jsonb_path_exists(p_payload,
                         'strict $.**{100} ? (@.type() == "object" || @.type() == "array")') THEN
        RETURN (
            SELECT 'payload' || array_to_string(w.o_steps[1:2], '') || '...'
            FROM {schema}.dbqueue_enqueue_payload_walk(p_payload::jsonb) AS w
            WHERE cardinality(w.o_steps) = 100 AND jsonb_typeof(w.o_value) IN ('object', 'array')
            LIMIT 1
        ) || ' is nested more than 100 levels deep';
    END IF;
    IF NOT jsonb_path_exists(p_payload, suspect) THEN
        RETURN NULL;
    END IF;
    FOR v IN SELECT x::numeric FROM jsonb_path_query(p_payload, suspect) AS x LOOP
        problem := {schema}.dbqueue_enqueue_number_problem(v::numeric);
        IF problem IS NOT NULL THEN
            RETURN (
                SELECT 'payload' || array_to_string(w.o_steps, '')
                FROM {schema}.dbqueue_enqueue_payload_walk(p_payload::jsonb) AS w
                WHERE jsonb_typeof(w.o_value) = 'number' AND w.o_value::numeric = v
                LIMIT 1
            ) || ' ' || problem;
        END IF;
    END LOOP;
    RETURN NULL;
END
$fn$;

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
    IF jsonb_typeof(p_payload) IS DISTINCT FROM 'object' THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            'payload must be a JSON object, got %s %s', jsonb_typeof(p_payload),
            {schema}.dbqueue_enqueue_shown(p_payload::text)),
            'wrap the value: jsonb_build_object(''value'', ...)'::text);
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

-- One job's row, checked already: store/jobs.py's INSERT with its conflict clause. o_id is the
-- job's id (the existing holder's when nothing was inserted), o_created whether this call
-- inserted it, o_due whether the row inserted (or debounced) is due by the database's clock
-- (NULL when nothing was written: no wake-up).
CREATE OR REPLACE FUNCTION {schema}.dbqueue_enqueue_row(
    p_type text, p_payload jsonb, p_queue text, p_priority int, p_run_after timestamptz,
    p_max_attempts int, p_lease double precision, p_idempotency_key text, p_unique_key text,
    p_unique_while text, p_debounce boolean, p_serial_key text,
    OUT o_id bigint, OUT o_created boolean, OUT o_due boolean
) LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    FOR n_try IN 1 .. 100 LOOP
        IF p_unique_key IS NULL THEN
            INSERT INTO {schema}.dbqueue_job (
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
            SELECT id INTO o_id FROM {schema}.dbqueue_job
            WHERE idempotency_key = p_idempotency_key;
        ELSIF p_debounce THEN
            INSERT INTO {schema}.dbqueue_job (
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
            SELECT id INTO o_id FROM {schema}.dbqueue_job
            WHERE unique_key = p_unique_key AND unique_key IS NOT NULL
              AND state IN ('pending', 'waiting', 'running')
              AND (unique_while = 'active' OR started_at IS NULL);
        ELSE
            INSERT INTO {schema}.dbqueue_job (
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
            SELECT id INTO o_id FROM {schema}.dbqueue_job
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
    PERFORM {schema}.dbqueue_enqueue_fail('dbqueue_enqueue: '::text, format(
        '%s %s: its holder kept finishing between the insert and the read 100 times in a row; '
        'nothing was enqueued',
        CASE WHEN p_unique_key IS NULL THEN 'idempotency_key' ELSE 'unique_key' END,
        {schema}.dbqueue_enqueue_shown(coalesce(p_unique_key, p_idempotency_key)::text)),
        NULL::text);
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
    v_payload jsonb := coalesce(payload, '{}'::jsonb);
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
    v_payload jsonb := coalesce(payload, '{}'::jsonb);
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

-- A bigint or a number of seconds from a JSON number that is whole; NULL for JSON null or absent.
CREATE OR REPLACE FUNCTION {schema}.dbqueue_enqueue_number(
    p_where text, p_key text, p_value jsonb, p_whole boolean
) RETURNS numeric LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF p_value IS NULL OR p_value = 'null'::jsonb THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_value) <> 'number' OR (p_whole AND p_value::numeric <> trunc(p_value::numeric))
    THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            '%s must be %s, got %s', p_key,
            CASE WHEN p_whole THEN 'an integer' ELSE 'a number of seconds' END,
            {schema}.dbqueue_enqueue_shown(p_value::text)), NULL::text);
    END IF;
    RETURN p_value::numeric;
END
$fn$;

CREATE OR REPLACE FUNCTION {schema}.dbqueue_enqueue_string(p_where text, p_key text, p_value jsonb)
RETURNS text LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF p_value IS NULL OR p_value = 'null'::jsonb THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(p_value) <> 'string' THEN
        PERFORM {schema}.dbqueue_enqueue_fail(p_where, format(
            '%s must be a string, got %s', p_key, {schema}.dbqueue_enqueue_shown(p_value::text)),
            NULL::text);
    END IF;
    RETURN p_value #>> '{}';
END
$fn$;

-- run_after: the ISO 8601 shape (date, time, offset) before PostgreSQL reads it, which would
-- also take 'tomorrow', 'epoch', a time without an offset (in the session's TimeZone) or a
-- year of six digits.
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

-- Nobody but the owner may call the new functions, except dbqueue_debounce() once granted.
REVOKE ALL ON FUNCTION {schema}.dbqueue_enqueue_payload_walk(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.dbqueue_enqueue_number_problem(numeric) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.dbqueue_enqueue_payload_problem(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.dbqueue_debounce(text, jsonb, text, text, int, timestamptz,
                                                 interval, int, double precision, text)
    FROM PUBLIC;
"""

FUNCTIONS = SERIAL_AND_LIMITS + CLAIM_LIMITED + WORKFLOWS + WAKEUPS + ENQUEUE

# Every function the earlier migrations installed, which the text above replaces: each must be
# in the schema of dbqueue_job, or CREATE OR REPLACE would leave it as it was and add another.
REPLACED = (
    "dbqueue_serial_turn(text, bigint)",
    "dbqueue_serial_free(text, bigint)",
    "dbqueue_limiter_lock(text, text, text)",
    "dbqueue_rate_room(timestamptz[], int, float8)",
    "dbqueue_partition_room(text, text, text, int, float8)",
    "dbqueue_claim_within_limits(text[], int[], int, text, bigint, int[], int[], float8[],"
    " text[], text[], int[], int[], float8[], text[])",
    "dbqueue_claim_limited(text[], int[], int, text, bigint, int[], int[], float8[], text[],"
    " text[], int[], int[], float8[], text[])",
    "dbqueue_settle_dependents()",
    "dbqueue_release_late(bigint[], bigint[])",
    "dbqueue_apply_link()",
    "dbqueue_apply_cancel()",
    "dbqueue_apply_signal()",
    "dbqueue_slot_channel(text, text, int)",
    "dbqueue_take_slots(text, text[], int, int[])",
    "dbqueue_pick_slots(text, int, int)",
    "dbqueue_wakeup_payload(text, text, int)",
    "dbqueue_wake(text, text, int)",
    "dbqueue_wakeup_wanted(text)",
    "dbqueue_wake_at_commit(text, bigint)",
    "dbqueue_enqueue_fail(text, text, text)",
    "dbqueue_enqueue_shown(text)",
    "dbqueue_enqueue_check(text, text, text, jsonb, text, int, timestamptz, interval, int,"
    " double precision, text, text, text, boolean, text)",
    "dbqueue_enqueue_row(text, jsonb, text, int, timestamptz, int, double precision, text, text,"
    " text, boolean, text)",
    "dbqueue_enqueue(text, jsonb, text, int, timestamptz, interval, int, double precision, text,"
    " text, text, boolean, text)",
    "dbqueue_enqueue_number(text, text, jsonb, boolean)",
    "dbqueue_enqueue_string(text, text, jsonb)",
    "dbqueue_enqueue_many(jsonb)",
)
ADDED = (
    "dbqueue_debounce(text, jsonb, text, text, int, timestamptz, interval, int,"
    " double precision, text)",
    "dbqueue_enqueue_payload_problem(jsonb)",
    "dbqueue_enqueue_number_problem(numeric)",
    "dbqueue_enqueue_payload_walk(jsonb)",
)

# The schema of dbqueue_job, as this connection finds the table (where Django created it).
TABLES_SCHEMA = """
SELECT n.nspname, pg_catalog.quote_ident(n.nspname)
FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.oid = pg_catalog.to_regclass('dbqueue_job')
"""


def _schema(cursor):
    cursor.execute(TABLES_SCHEMA)
    row = cursor.fetchone()
    if row is None:
        raise RuntimeError(
            "migration 0026: no table dbqueue_job on this connection's search_path; the earlier "
            "migrations of django_dbqueue create it"
        )
    return row


def harden(apps, schema_editor):
    """Install every function again, hardened (the text above), in one transaction with the
    migration: all of them or none."""
    with schema_editor.connection.cursor() as cursor:
        name, quoted = _schema(cursor)
        cursor.execute(
            "SELECT s FROM pg_catalog.unnest(%s::text[]) AS s "
            "WHERE pg_catalog.to_regprocedure(%s || '.' || s) IS NULL",
            [list(REPLACED), quoted],
        )
        missing = [row[0] for row in cursor.fetchall()]
        if missing:
            raise RuntimeError(
                f"migration 0026: the functions {', '.join(missing)} are not in schema {name!r}, "
                "where dbqueue_job is; run the migrations with the search_path the earlier ones "
                "ran with"
            )
        cursor.execute(FUNCTIONS.replace("{schema}", quoted))


# Back to 0025: each function as the last migration that wrote it left it (in these texts, later
# ones win), made CREATE OR REPLACE; 0022's DO block, which pinned the enqueue functions' path
# as it was then and revoked them from PUBLIC; the new functions dropped.
_EARLIER = (
    ("0010_flow_control", "RATE_ROOM"),
    ("0014_wakeup_slots", "FUNCTIONS"),
    ("0015_workflow_races", "SETTLE_DEPENDENTS"),
    ("0015_workflow_races", "RELEASE_LATE"),
    ("0015_workflow_races", "AT_COMMIT"),
    ("0016_claim_races", "SERIAL_TURN"),
    ("0016_claim_races", "LIMITER_LOCKS"),
    ("0016_claim_races", "CLAIM_WITHIN_LIMITS"),
    ("0016_claim_races", "CLAIM_LIMITED_WRAPPER"),
    ("0022_sql_enqueue", "FUNCTIONS"),
    ("0023_signals_at_commit", "FORWARD"),
)
_FUNCTION = re.compile(r"CREATE (?:OR REPLACE )?FUNCTION (dbqueue_\w+)\(.*?\$fn\$.*?\$fn\$;", re.S)
_DO_BLOCK = re.compile(r"DO \$do\$.*?\$do\$;", re.S)


def _previous_functions():
    """``{name: CREATE OR REPLACE FUNCTION ...}`` of every function as of migration 0025."""
    found = {}
    for module, constant in _EARLIER:
        text = getattr(importlib.import_module(f"django_dbqueue.migrations.{module}"), constant)
        for match in _FUNCTION.finditer(text):
            found[match.group(1)] = match.group(0).replace(
                "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
            )
    expected = {signature.split("(")[0] for signature in REPLACED}
    if set(found) != expected:
        raise RuntimeError(
            f"migration 0026: cannot find the earlier text of {expected ^ set(found)}"
        )
    return found


def soften(apps, schema_editor):
    """Install the functions as migration 0025 had them, and drop the ones 0026 added."""
    with schema_editor.connection.cursor() as cursor:
        _name, quoted = _schema(cursor)
        drops = "".join(f"DROP FUNCTION {quoted}.{signature};\n" for signature in ADDED)
        enqueue = importlib.import_module("django_dbqueue.migrations.0022_sql_enqueue")
        cursor.execute(
            drops
            + "\n".join(_previous_functions().values())
            + "\n"
            + _DO_BLOCK.search(enqueue.FUNCTIONS).group(0)
        )


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0025_fair_keys"),
    ]

    operations = [
        migrations.RunPython(harden, soften),
    ]
