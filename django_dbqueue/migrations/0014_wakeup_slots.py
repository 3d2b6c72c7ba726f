# Wake-ups that name their workers (docs/concepts/claiming.md, "Waking up"; django_dbqueue/waiters.py).
# A worker that waits for wake-ups on a queue and has a free thread also holds a slot of it: the
# lowest free one of WAKEUP_SLOTS session-level advisory locks, slot s of a queue keyed by
# hashtextextended('<channel>:<queue>', s) (64 bits: two queues, or two projects sharing a
# database, practically never share a key). It lets go of its slots while every thread is busy.
# Each slot has a channel of its own, dbqueue_slot_channel(), which the worker's session LISTENs
# on besides the main one. A wake-up picks held slots at random, one more than it has jobs, and
# is sent on those slots' channels only: the other workers' processes are not even woken. A
# wake-up that names nobody goes on the main channel, as before.
# - dbqueue_take_slots(): the worker's side, one slot per queue (NULL where all are taken: such a
#   worker acts on every wake-up of the queue, as before), and the LISTEN on its channel (the
#   UNLISTEN of the channel of the slot it held before, when that is another one). It also
#   shortens its session's TCP keepalives and its tcp_user_timeout, where they are longer, so
#   that the server drops the slots of a host that died within about a minute or two rather than
#   hours.
# - dbqueue_pick_slots(): the sender's side. A slot is free where the sender can take it
#   shared; it lets go of it at once (should the statement fail in between, the handler does).
#   Senders do not conflict with each other, so concurrent ones never see each other's probes
#   as held slots (with an exclusive probe, 6 concurrent senders named slots nobody held in 2%
#   of their calls). Held until the end of the transaction instead, the probes would push every
#   worker taking a slot meanwhile past all of them, out of the senders' sight (a sender's
#   transaction lasts until its NOTIFY's commit is through), and fill the lock table: one at a
#   time, a worker taking a slot at that instant takes the next one instead. Slots are taken
#   from the lowest, so the held ones sit near the bottom (workers whose threads are all busy
#   leave gaps): it stops at the first run of GAP free slots, and its cost follows the waiters.
#   NULL where it found fewer held slots than the jobs plus one.
# - dbqueue_wakeup_payload(): the payload, "<count>/<slot>.<slot>:<queue>" naming the picked
#   slots, or the payload as it was when nobody is picked or it is not "<count>:<queue>".
# - dbqueue_wake(): sends it: on each picked slot's channel, or on the main channel.

from django.db import migrations

GAP = 16  # free slots in a row after which the sender stops looking
SPARES = 64  # held slots beyond the ones it names that it collects, to pick from

FUNCTIONS = f"""
CREATE FUNCTION dbqueue_slot_channel(p_channel text, p_queue text, p_slot int)
RETURNS text LANGUAGE sql IMMUTABLE STRICT AS $fn$
    SELECT 'dbq.' || p_slot || '.' || left(md5(p_channel || ':' || p_queue), 24)
$fn$;

CREATE FUNCTION dbqueue_take_slots(
    p_channel text, p_queues text[], p_slots int, p_listened int[]
)
RETURNS int[] LANGUAGE plpgsql VOLATILE STRICT AS $fn$
DECLARE
    taken int[] := '{{}}';
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
                EXECUTE format('UNLISTEN %I', dbqueue_slot_channel(p_channel, q, old));
            END IF;
            IF slot IS NOT NULL THEN
                EXECUTE format('LISTEN %I', dbqueue_slot_channel(p_channel, q, slot));
            END IF;
        END IF;
        taken := taken || slot;
    END LOOP;
    RETURN taken;
END
$fn$;

CREATE FUNCTION dbqueue_pick_slots(p_name text, p_count int, p_slots int)
RETURNS int[] LANGUAGE plpgsql VOLATILE STRICT AS $fn$
DECLARE
    wanted int := p_count + 1;
    free int := 0;
    held int[] := '{{}}';
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
                EXIT WHEN free >= {GAP};
            ELSE
                held := held || s;
                free := 0;
                EXIT WHEN cardinality(held) >= wanted + {SPARES};
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

CREATE FUNCTION dbqueue_wakeup_payload(p_channel text, p_payload text, p_slots int)
RETURNS text LANGUAGE plpgsql VOLATILE STRICT AS $fn$
DECLARE
    head text := split_part(p_payload, ':', 1);
    picked int[];
BEGIN
    IF head !~ '^[0-9]{{1,9}}$' OR position(':' IN p_payload) = 0 THEN
        RETURN p_payload;
    END IF;
    picked := dbqueue_pick_slots(
        p_channel || ':' || substr(p_payload, length(head) + 2), head::int, p_slots
    );
    IF picked IS NULL THEN
        RETURN p_payload;
    END IF;
    RETURN head || '/' || array_to_string(picked, '.') || substr(p_payload, length(head) + 1);
END
$fn$;

CREATE FUNCTION dbqueue_wake(p_channel text, p_payload text, p_slots int)
RETURNS text LANGUAGE plpgsql VOLATILE STRICT AS $fn$
DECLARE
    payload text := dbqueue_wakeup_payload(p_channel, p_payload, p_slots);
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
        PERFORM pg_notify(dbqueue_slot_channel(p_channel, queue, slot::int), payload);
    END LOOP;
    RETURN payload;
END
$fn$;
"""

DROP_FUNCTIONS = """
DROP FUNCTION IF EXISTS dbqueue_wake(text, text, int);
DROP FUNCTION IF EXISTS dbqueue_wakeup_payload(text, text, int);
DROP FUNCTION IF EXISTS dbqueue_pick_slots(text, int, int);
DROP FUNCTION IF EXISTS dbqueue_take_slots(text, text[], int, int[]);
DROP FUNCTION IF EXISTS dbqueue_slot_channel(text, text, int);
"""


class Migration(migrations.Migration):

    dependencies = [
        ("django_dbqueue", "0013_workflow_plans_by_key"),
    ]

    operations = [
        migrations.RunSQL(sql=FUNCTIONS, reverse_sql=DROP_FUNCTIONS),
    ]
