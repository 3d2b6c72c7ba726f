# Wake-ups that name their workers (docs/concepts.md, "Waking up"; django_dbqueue/waiters.py).
# A worker that waits for wake-ups on a queue and has a free thread also holds a slot of it: the
# lowest free one of WAKEUP_SLOTS session-level advisory locks, slot s of a queue keyed by
# hashtextextended('<channel>:<queue>', s) (64 bits: two queues, or two projects sharing a
# database, practically never share a key). It lets go of its slots while every thread is busy.
# The wake-up's payload is made on the server, in the statement that sends it: it names held
# slots picked at random, one more than it has jobs, and only the workers holding those claim.
# - dbqueue_take_slots(): the worker's side, one slot per queue (NULL where all are taken: such a
#   worker acts on every wake-up of the queue, as before). It also shortens its session's TCP
#   keepalives and its tcp_user_timeout, where they are longer, so that the server drops the
#   slots of a host that died within about a minute or two rather than hours.
# - dbqueue_wakeup_payload(): the sender's side. A free slot is found by taking it and letting
#   go of it at once (a worker taking a slot at that instant takes the next one instead; should
#   the statement fail in between, the handler lets go of it). Slots are taken from the lowest,
#   so the held ones sit near the bottom (workers whose threads are all busy leave gaps): it
#   stops at the first run of GAP free slots, and its cost follows the waiters (about half a
#   microsecond of server time per slot tried). A payload that is not "<count>:<queue>", or a queue where it found fewer
#   held slots than its jobs plus one, comes back as it was: every worker with a free thread acts
#   on it, as before.

from django.db import migrations

GAP = 16  # free slots in a row after which the sender stops looking
SPARES = 64  # held slots beyond the ones it names that it collects, to pick from

FUNCTIONS = f"""
CREATE FUNCTION dbqueue_take_slots(p_channel text, p_queues text[], p_slots int)
RETURNS int[] LANGUAGE plpgsql VOLATILE STRICT AS $fn$
DECLARE
    taken int[] := '{{}}';
    slot int;
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
    FOREACH q IN ARRAY p_queues LOOP
        slot := NULL;
        FOR s IN 0 .. p_slots - 1 LOOP
            IF pg_try_advisory_lock(hashtextextended(p_channel || ':' || q, s)) THEN
                slot := s;
                EXIT;
            END IF;
        END LOOP;
        taken := taken || slot;
    END LOOP;
    RETURN taken;
END
$fn$;

CREATE FUNCTION dbqueue_wakeup_payload(p_channel text, p_payload text, p_slots int)
RETURNS text LANGUAGE plpgsql VOLATILE STRICT AS $fn$
DECLARE
    head text := split_part(p_payload, ':', 1);
    name text;
    wanted int;
    free int := 0;
    held int[] := '{{}}';
    k bigint;
    got boolean := false;
BEGIN
    IF head !~ '^[0-9]{{1,9}}$' OR position(':' IN p_payload) = 0 THEN
        RETURN p_payload;
    END IF;
    wanted := head::int + 1;
    IF wanted > p_slots THEN
        RETURN p_payload;
    END IF;
    name := p_channel || ':' || substr(p_payload, length(head) + 2);
    BEGIN
        FOR s IN 0 .. p_slots - 1 LOOP
            k := hashtextextended(name, s);
            got := pg_try_advisory_lock(k);
            IF got THEN
                PERFORM pg_advisory_unlock(k);
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
            PERFORM pg_advisory_unlock(k);
        END IF;
        RAISE;
    END;
    IF cardinality(held) < wanted THEN
        RETURN p_payload;
    END IF;
    RETURN head || '/' || (
        SELECT string_agg(s::text, '.' ORDER BY s)
        FROM (SELECT s FROM unnest(held) AS s ORDER BY random() LIMIT wanted) AS picked
    ) || substr(p_payload, length(head) + 1);
END
$fn$;
"""

DROP_FUNCTIONS = """
DROP FUNCTION IF EXISTS dbqueue_wakeup_payload(text, text, int);
DROP FUNCTION IF EXISTS dbqueue_take_slots(text, text[], int);
"""


class Migration(migrations.Migration):

    dependencies = [
        ("django_dbqueue", "0013_workflow_plans_by_key"),
    ]

    operations = [
        migrations.RunSQL(sql=FUNCTIONS, reverse_sql=DROP_FUNCTIONS),
    ]
