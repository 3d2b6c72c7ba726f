# Wake-ups that name their workers (docs/concepts.md, "Waking up"; django_dbqueue/waiters.py).
# A worker that waits for wake-ups on a queue also holds a slot of it: the lowest free one of
# WAKEUP_SLOTS session-level advisory locks, class SLOT_LOCK + slot, keyed by the hashtext() of
# "<channel>:<queue>" (the channel too, so that projects sharing a database and a queue name
# never hold each other's slots). The wake-up's payload is made on the server, in the statement
# that sends it: it names the lowest occupied slots, one more than the jobs it announces, and
# only the workers holding those claim; the others (and every worker that holds no slot of the
# queue) go on as before.
# - dbqueue_take_slots(): the worker's side, one slot per queue (NULL where all are taken: such a
#   worker acts on every wake-up of the queue, as before).
# - dbqueue_wakeup_payload(): the sender's side. A free slot is found by taking it and letting
#   go of it at once, so a worker taking a slot at that instant takes the next one instead.
#   Slots are taken from the lowest, so the held ones sit at the bottom: it stops at the first
#   run of GAP free slots, and its cost follows the waiters, not WAKEUP_SLOTS. A payload that is
#   not "<count>:<queue>", or a queue where it found no slot held, comes back as it was: every
#   waiting worker acts on it, as before.

from django.db import migrations

SLOT_LOCK = 0x64627300  # 'dbs\0' in ASCII; sql.SLOT_LOCK (a test checks they agree)
GAP = 4  # free slots in a row after which the sender stops looking

FUNCTIONS = f"""
CREATE FUNCTION dbqueue_take_slots(p_channel text, p_queues text[], p_slots int)
RETURNS int[] LANGUAGE plpgsql VOLATILE STRICT AS $fn$
DECLARE
    taken int[] := '{{}}';
    slot int;
    q text;
BEGIN
    FOREACH q IN ARRAY p_queues LOOP
        slot := NULL;
        FOR s IN 0 .. p_slots - 1 LOOP
            IF pg_try_advisory_lock({SLOT_LOCK} + s, hashtext(p_channel || ':' || q)) THEN
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
    key int;
    wanted int;
    free int := 0;
    named text[] := '{{}}';
BEGIN
    IF head !~ '^[0-9]{{1,9}}$' OR position(':' IN p_payload) = 0 THEN
        RETURN p_payload;
    END IF;
    wanted := least(head::int + 1, p_slots);
    key := hashtext(p_channel || ':' || substr(p_payload, length(head) + 2));
    FOR s IN 0 .. p_slots - 1 LOOP
        IF pg_try_advisory_lock({SLOT_LOCK} + s, key) THEN
            PERFORM pg_advisory_unlock({SLOT_LOCK} + s, key);
            free := free + 1;
            EXIT WHEN free >= {GAP};
        ELSE
            named := named || s::text;
            free := 0;
            EXIT WHEN cardinality(named) >= wanted;
        END IF;
    END LOOP;
    IF cardinality(named) = 0 THEN
        RETURN p_payload;
    END IF;
    RETURN head || '/' || array_to_string(named, '.') || substr(p_payload, length(head) + 1);
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
