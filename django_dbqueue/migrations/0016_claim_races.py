import importlib

from django.db import migrations

# The claim's races of issue 25 (docs/concepts/keys.md#serial-keys and docs/concepts/flow-control.md).
#
# Serial keys. 0011's turn test (no other job of the key running, none older pending) read the
# claim statement's snapshot. A job of the key that became pending after that snapshot (an older
# one requeued, or released by its workflow) while a claim of a newer one was still uncommitted
# was claimed by the next claimer too: in its snapshot the newer one was pending, not running.
# dbqueue_serial_turn() is now VOLATILE plpgsql, so each of its statements reads a snapshot of
# its own, and a claim that says yes holds the key until it commits:
# - a first look (no other job of the key running, none older pending) says no at once for the
#   jobs of a busy key, the common case of a backlog, without taking anything;
# - then a transaction-level advisory lock on the key, tried, never waited for: held by another
#   claim, the key is being claimed right now, and it is not this job's turn (like a row that
#   SKIP LOCKED passes over; that claim's worker, or the poll, looks again);
# - then the same look again, in a snapshot taken after the lock: whoever held it before has
#   committed (its claim is visible, the job it took running) or rolled back. Of two claims of
#   one key, the second sees the first's job running, whichever jobs they picked;
# - a claim says yes to one job per key: the job is remembered in a transaction-local setting
#   (dbqueue.serial_turns), so that a later statement of the same claim (the limited claim
#   scans each queue with a new snapshot) cannot approve a second job of the key that became
#   pending meanwhile; the same job may be approved again (a row re-checked after an update).
# - dbqueue_serial_free(): 0011's test as it was, with no side effect, in the caller's
#   snapshot: the limited claim's job-by-job scan filters with it (a job it says no to does not
#   count against the scan's bound), and asks dbqueue_serial_turn() only for a job it is about
#   to lock, after the type and partition checks. The scan is a plpgsql FOR loop, which fetches
#   its rows ten at a time: a side effect in its WHERE would hold the keys of up to nine jobs the
#   loop never reaches, passing them over for other claims until this one commits.
# What it cannot see: a job that is not 'running' while its handler still runs (a lease lost
# to a paused process, a timeout that gave the job back): those are the lease's and the
# timeout's promises, not the claim's.
# The unkeyed claim never calls it (serial_key IS NULL settles the OR first): its cost is what
# it was. A partial unique index on (serial_key) WHERE state = 'running' was weighed and left
# out: it cannot see the runs that overlap without two 'running' rows (above), and a violation
# would abort the claim's whole batch, turning one key's fault into a stalled queue.
SERIAL_TURN = """
CREATE OR REPLACE FUNCTION dbqueue_serial_turn(key text, job_id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE STRICT COST 1 AS $fn$
DECLARE
    lock_key bigint;
    memo text;
BEGIN
    IF EXISTS (
        SELECT 1 FROM dbqueue_job AS o
        WHERE o.serial_key = key AND o.state IN ('pending', 'running') AND o.id <> job_id
          AND (o.state = 'running' OR o.id < job_id)
    ) THEN
        RETURN false;
    END IF;
    lock_key := hashtextextended('dbqueue serial key' || chr(31) || key, 0);
    memo := coalesce(current_setting('dbqueue.serial_turns', true), '');
    IF strpos(memo, ',' || lock_key || ':') > 0 THEN  -- this claim approved a job of the key
        RETURN strpos(memo, ',' || lock_key || ':' || job_id || ',') > 0;
    END IF;
    IF NOT pg_try_advisory_xact_lock(lock_key) THEN
        RETURN false;  -- another claim is deciding this key's turn now
    END IF;
    IF EXISTS (
        SELECT 1 FROM dbqueue_job AS o
        WHERE o.serial_key = key AND o.state IN ('pending', 'running') AND o.id <> job_id
          AND (o.state = 'running' OR o.id < job_id)
    ) THEN
        RETURN false;
    END IF;
    PERFORM set_config('dbqueue.serial_turns', memo || ',' || lock_key || ':' || job_id || ',',
                       true);
    RETURN true;
END
$fn$;

CREATE FUNCTION dbqueue_serial_free(key text, job_id bigint) RETURNS boolean
LANGUAGE sql STABLE STRICT COST 1 AS $fn$
    SELECT NOT EXISTS (
        SELECT 1 FROM dbqueue_job AS o
        WHERE o.serial_key = key AND o.state IN ('pending', 'running') AND o.id <> job_id
          AND (o.state = 'running' OR o.id < job_id)
    )
$fn$;
"""

# Limited claims. Creating a rate partition's row (INSERT ... ON CONFLICT DO NOTHING) waited
# for another claim that had created the same row and not committed yet; two claims meeting two
# new partitions in opposite orders (queues listed in another order, a type's keyed rate limit
# met in two queues) waited for each other: ``deadlock detected``, the claim lost. Now a claim
# never waits in (c):
# - dbqueue_limiter_lock(): the advisory lock key of a limiter row (scope, name, part). Whoever
#   creates a limiter row holds it first.
# - dbqueue_partition_room() locks an existing row with SKIP LOCKED as before; a row that is
#   there but locked is busy; a row that is not there yet is created only under its advisory
#   lock, tried: held by another claim (which is creating it) it is busy too. The INSERT then
#   meets no uncommitted insert of the row (every creator holds the lock); at worst it waits for
#   a claim that updated a row committed an instant before, and such a claim is past its last
#   scan (rate windows are written after every scan) and waits for nothing.
# - The rows of (a) (a queue's or a type's own row) take their advisory locks too, waiting, in
#   the same (scope, name) order as their row locks: a partition with an empty key has the same
#   (scope, name, '') as such a row when the queue or type has a concurrency limit as well.
LIMITER_LOCKS = """
CREATE FUNCTION dbqueue_limiter_lock(p_scope text, p_name text, p_part text) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT AS $fn$
    SELECT hashtextextended('dbqueue limiter' || chr(31) || p_scope || chr(31) || p_name
                            || chr(31) || p_part, 0)
$fn$;

CREATE OR REPLACE FUNCTION dbqueue_partition_room(p_scope text, p_name text, p_part text,
                                                  lim int, period float8,
                                                  OUT room int, OUT reopen timestamptz)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    st timestamptz[];
BEGIN
    SELECT l.starts INTO st FROM dbqueue_limiter AS l
    WHERE l.scope = p_scope AND l.name = p_name AND l.part = p_part
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        PERFORM 1 FROM dbqueue_limiter AS l
        WHERE l.scope = p_scope AND l.name = p_name AND l.part = p_part;
        IF FOUND OR NOT pg_try_advisory_xact_lock(dbqueue_limiter_lock(p_scope, p_name, p_part))
        THEN
            room := NULL;  -- another claimer holds it, or is creating it
            RETURN;
        END IF;
        INSERT INTO dbqueue_limiter (scope, name, part) VALUES (p_scope, p_name, p_part)
        ON CONFLICT (scope, name, part) DO NOTHING;
        SELECT l.starts INTO st FROM dbqueue_limiter AS l
        WHERE l.scope = p_scope AND l.name = p_name AND l.part = p_part
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            room := NULL;
            RETURN;
        END IF;
    END IF;
    SELECT x.room, x.reopen INTO room, reopen FROM dbqueue_rate_room(st, lim, period) AS x;
END
$fn$;
"""

# The limited claim, as 0011 left it, with (a) taking the advisory locks above, its job-by-job
# scan filtering with dbqueue_serial_free() and asking dbqueue_serial_turn() right before it
# locks a job (above), and with a ``keyed`` column: whether the job has a serial key, read by the claim's own UPDATE. sql.
# CLAIM_LIMITED read it with a subquery in its statement's snapshot, taken before the function
# waited for the limiter lock: a job enqueued meanwhile came back not keyed, and the worker did
# not look again for its key's next job when it ended. A new name, because a new column changes
# the result's type, and the workers of the previous release, still running during a rolling
# deploy, call dbqueue_claim_limited(): that becomes a wrapper that leaves the column out.
CLAIM_WITHIN_LIMITS = """
CREATE FUNCTION dbqueue_claim_within_limits(
    p_queues text[], p_lims int[], p_limit int, p_worker text, p_token bigint,
    q_conc int[], q_rate_n int[], q_rate_period float8[], q_rate_key text[],
    t_names text[], t_conc int[], t_rate_n int[], t_rate_period float8[], t_rate_key text[]
) RETURNS TABLE (
    id bigint, type text, queue text, payload text, attempts int, max_attempts int,
    lease_seconds float8, idempotency_key text, priority smallint, created_at timestamptz,
    wait float8, traceparent text, keyed boolean
) LANGUAGE plpgsql VOLATILE AS $fn$
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
            PERFORM pg_advisory_xact_lock(dbqueue_limiter_lock(lock_scope[k], lock_name[k], ''));
        END LOOP;
        INSERT INTO dbqueue_limiter (scope, name, part)
        SELECT s, n, '' FROM unnest(lock_scope, lock_name) AS u(s, n) ORDER BY 1, 2
        ON CONFLICT (scope, name, part) DO NOTHING;
        PERFORM 1 FROM dbqueue_limiter AS l
        WHERE (l.scope, l.name) IN (SELECT * FROM unnest(lock_scope, lock_name)) AND l.part = ''
        ORDER BY l.scope, l.name
        FOR UPDATE;
    END IF;
    SELECT coalesce(array_agg(s.name::text), '{}') INTO paused
    FROM dbqueue_queue AS s WHERE s.name = ANY(p_queues) AND s.paused;

    -- (b) the room of each limited type, counted after the locks
    FOR k IN 1..n_t LOOP
        r := NULL;
        conc_room := NULL;
        IF t_conc[k] IS NOT NULL THEN
            SELECT count(*) INTO c FROM dbqueue_job AS j
            WHERE j.state = 'running' AND j.type = t_names[k];
            conc_room := greatest(t_conc[k] - c, 0);
            r := conc_room;
        END IF;
        IF t_rate_n[k] IS NOT NULL AND t_rate_key[k] IS NULL THEN
            SELECT l.starts INTO st FROM dbqueue_limiter AS l
            WHERE l.scope = 'type' AND l.name = t_names[k] AND l.part = '';
            SELECT x.room, x.reopen INTO c, ro
            FROM dbqueue_rate_room(st, t_rate_n[k], t_rate_period[k]) AS x;
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
            SELECT count(*) INTO c FROM dbqueue_job AS j
            WHERE j.state = 'running' AND j.queue = p_queues[i];
            conc_room := greatest(q_conc[i] - c, 0);
            want := least(want, conc_room);
        END IF;
        IF q_rate_n[i] IS NOT NULL AND q_rate_key[i] IS NULL THEN
            SELECT l.starts INTO st FROM dbqueue_limiter AS l
            WHERE l.scope = 'queue' AND l.name = p_queues[i] AND l.part = '';
            SELECT x.room, x.reopen INTO c, ro
            FROM dbqueue_rate_room(st, q_rate_n[i], q_rate_period[i]) AS x;
            IF c <= 0 THEN reopen := least(reopen, ro); END IF;
            want := least(want, greatest(c, 0));
        END IF;
        IF conc_room = 0 THEN held := true; END IF;
        CONTINUE WHEN want <= 0;
        IF n_t = 0 AND q_rate_key[i] IS NULL THEN
            -- no per-job rule: the plain claim of this queue
            got := ARRAY(
                SELECT j.id FROM dbqueue_job AS j
                WHERE j.state = 'pending' AND j.queue = p_queues[i] AND j.run_after <= now()
                  AND (j.serial_key IS NULL OR dbqueue_serial_turn(j.serial_key, j.id))
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
                FROM dbqueue_job AS j
                WHERE j.state = 'pending' AND j.queue = p_queues[i] AND j.run_after <= now()
                  AND (j.serial_key IS NULL OR dbqueue_serial_free(j.serial_key, j.id))
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
                        FROM dbqueue_partition_room('type', t_names[k],
                                                    coalesce(cand.jpayload ->> t_rate_key[k], ''),
                                                    t_rate_n[k], t_rate_period[k]) AS x;
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
                        FROM dbqueue_partition_room('queue', p_queues[i],
                                                    coalesce(cand.jpayload ->> q_rate_key[i], ''),
                                                    q_rate_n[i], q_rate_period[i]) AS x;
                        IF c IS NULL THEN busy := true; c := 0;
                        ELSIF c <= 0 THEN reopen := least(reopen, ro); END IF;
                        part_key := part_key || pk;
                        part_room := part_room || greatest(c, 0);
                        qp := cardinality(part_key);
                        IF c <= 0 THEN full_parts := full_parts || pk; grew := true; END IF;
                    END IF;
                    CONTINUE WHEN part_room[qp] <= 0;
                END IF;
                CONTINUE WHEN cand.jkey IS NOT NULL AND NOT dbqueue_serial_turn(cand.jkey, cand.jid);
                PERFORM 1 FROM dbqueue_job AS j
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
            UPDATE dbqueue_limiter AS l
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
        FROM updated AS u CROSS JOIN LATERAL dbqueue_rate_room(u.starts, u.n, u.period) AS x
        WHERE x.room <= 0;
        reopen := least(reopen, ro);
    END IF;

    RETURN QUERY
    UPDATE dbqueue_job AS j
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
"""

CLAIM_LIMITED_WRAPPER = """
CREATE OR REPLACE FUNCTION dbqueue_claim_limited(
    p_queues text[], p_lims int[], p_limit int, p_worker text, p_token bigint,
    q_conc int[], q_rate_n int[], q_rate_period float8[], q_rate_key text[],
    t_names text[], t_conc int[], t_rate_n int[], t_rate_period float8[], t_rate_key text[]
) RETURNS TABLE (
    id bigint, type text, queue text, payload text, attempts int, max_attempts int,
    lease_seconds float8, idempotency_key text, priority smallint, created_at timestamptz,
    wait float8, traceparent text
) LANGUAGE sql VOLATILE AS $fn$
    SELECT f.id, f.type, f.queue, f.payload, f.attempts, f.max_attempts, f.lease_seconds,
           f.idempotency_key, f.priority, f.created_at, f.wait, f.traceparent
    FROM dbqueue_claim_within_limits(p_queues, p_lims, p_limit, p_worker, p_token, q_conc,
                                     q_rate_n, q_rate_period, q_rate_key, t_names, t_conc,
                                     t_rate_n, t_rate_period, t_rate_key) AS f
$fn$;
"""

# Back to 0011: its functions as it installed them (0010's for the rate room, which 0011 left).
_FLOW = importlib.import_module("django_dbqueue.migrations.0010_flow_control")
_SERIAL = importlib.import_module("django_dbqueue.migrations.0011_unique_and_serial")
REVERSE = (
    "DROP FUNCTION dbqueue_claim_within_limits(text[], int[], int, text, bigint, int[], int[],"
    " float8[], text[], text[], int[], int[], float8[], text[]);\n"
    + _SERIAL.CLAIM_LIMITED_SERIAL
    + "DROP FUNCTION dbqueue_partition_room(text, text, text, int, float8);\n"
    + "DROP FUNCTION dbqueue_rate_room(timestamptz[], int, float8);\n"
    + _FLOW.RATE_ROOM
    + "DROP FUNCTION dbqueue_limiter_lock(text, text, text);\n"
    + "DROP FUNCTION dbqueue_serial_free(text, bigint);\n"
    + "DROP FUNCTION dbqueue_serial_turn(text, bigint);\n"
    + _SERIAL.SERIAL_TURN
)


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0015_workflow_races"),
    ]

    operations = [
        migrations.RunSQL(
            sql=SERIAL_TURN + LIMITER_LOCKS + CLAIM_WITHIN_LIMITS + CLAIM_LIMITED_WRAPPER,
            reverse_sql=REVERSE,
        ),
    ]
