# A caller's transaction holding a limiter row no longer stops a worker's claims (issue 35;
# docs/concepts/worker.md#callers-transactions, docs/concepts/flow-control.md).
#
# dbqueue_claim_within_limits() locked the limiter rows of every limited queue and type a worker
# serves, first, with a plain FOR UPDATE: a transaction holding one of them (an operator's
# select_for_update() of dbqueue_limiter, a script left open) made the claim wait, and the
# worker's lock_timeout then failed the whole claim, at every poll: the worker claimed nothing,
# from its unlimited queues neither, for as long as that transaction lasted.
#
# A limiter's advisory lock is waited for at most 200 ms (a claim holds it for an instant; any
# role that can connect may take an advisory lock of any key, and one held longer is not a
# claim's): past that the claim goes on without it, and the row lock decides.
#
# Now the rows are locked with SKIP LOCKED, after the advisory locks as before. Every claim
# takes a limiter's advisory lock (waited for: claims queue behind each other there, for an
# instant, as before) before its row and holds both until it commits, so a row still locked once
# the advisory lock is ours is held by some other transaction, not a claim. The queues and types
# whose row is held so are left out of this claim: a queue's jobs are not claimed, a type's jobs
# in no queue (its room counts as 0). A limit can only be counted under its row's lock, so
# nothing is started past it: the promise that a limit of N never has more than N handlers
# running holds. The other queues and types are claimed as usual, and the claim says to look
# again within a second (its closing row's wait), when the row may be free.
#
# And a worker that gives up and restarts in place (restart.py) no longer leaves the worker
# registry as it stops: it shows ``restarting``, its row's deadlines pushed out past the time
# its new image takes to come up, so that no sweeper takes back, in between, a job whose run or
# outcome the old image hands to the new one (the new image writes it, fenced by its token; a
# sweep would have counted the attempt again and fenced that write out). The registry's state
# CHECK admits the new value.
#
# The function is 0026's text with those changes (the pinned path, the tables and our functions
# named with their schema); migrating back installs 0026's text again.

import importlib
import re

from django.db import migrations, models

_FUNCTION = re.compile(r"CREATE OR REPLACE FUNCTION \{schema\}\.(dbqueue_\w+)\(.*?\$fn\$;", re.S)

# The changes to 0026's dbqueue_claim_within_limits(), each (old text, new text); each old text
# occurs exactly once.
_CHANGES = (
    (
        """    held boolean := false;
""",
        """    held boolean := false;
    taken text[];  -- the limiter rows this claim locked, as scope || chr(31) || name
    held_queues text[] := '{}';  -- limited queues whose row another transaction holds
    held_types text[] := '{}';  -- limited types whose row another transaction holds
    lk bigint;  -- a limiter's advisory lock key
    saved_timeout text;  -- the session's lock_timeout, while a limiter's lock is waited for
""",
    ),
    (
        """        FOR k IN 1..cardinality(lock_scope) LOOP
            PERFORM pg_advisory_xact_lock(
                {schema}.dbqueue_limiter_lock(lock_scope[k]::text, lock_name[k]::text, ''::text));
        END LOOP;
""",
        """        FOR k IN 1..cardinality(lock_scope) LOOP
            lk := {schema}.dbqueue_limiter_lock(lock_scope[k]::text, lock_name[k]::text, ''::text);
            CONTINUE WHEN pg_catalog.pg_try_advisory_xact_lock(lk);
            -- Another claim holds it for an instant: wait, but boundedly. Any role that can
            -- connect may take an advisory lock of any key; one held past 200 ms is not a
            -- claim's, and the row lock below (SKIP LOCKED) decides without it.
            saved_timeout := pg_catalog.current_setting('lock_timeout');
            BEGIN
                PERFORM pg_catalog.set_config('lock_timeout', '200ms', true);
                PERFORM pg_catalog.pg_advisory_xact_lock(lk);
            EXCEPTION WHEN lock_not_available THEN
                NULL;
            END;
            PERFORM pg_catalog.set_config('lock_timeout', saved_timeout, true);
        END LOOP;
""",
    ),
    (
        """        PERFORM 1 FROM {schema}.dbqueue_limiter AS l
        WHERE (l.scope, l.name) IN (SELECT * FROM unnest(lock_scope, lock_name)) AND l.part = ''
        ORDER BY l.scope, l.name
        FOR UPDATE;
    END IF;
""",
        """        -- SKIP LOCKED: every claim holds a limiter's advisory lock (taken above) while it
        -- holds its row, so a row still locked now is held by a transaction that is not a
        -- claim (a caller's select_for_update()). Its queue or type is left out of this claim.
        SELECT coalesce(array_agg(x.scope::text || chr(31) || x.name::text), '{}')
        INTO taken
        FROM (
            SELECT l.scope, l.name FROM {schema}.dbqueue_limiter AS l
            WHERE (l.scope, l.name) IN (SELECT * FROM unnest(lock_scope, lock_name))
              AND l.part = ''
            ORDER BY l.scope, l.name
            FOR UPDATE SKIP LOCKED
        ) AS x;
        SELECT coalesce(array_agg(u.n) FILTER (WHERE u.s = 'queue'), '{}'),
               coalesce(array_agg(u.n) FILTER (WHERE u.s = 'type'), '{}')
        INTO held_queues, held_types
        FROM unnest(lock_scope, lock_name) AS u(s, n)
        WHERE NOT (u.s || chr(31) || u.n = ANY(taken));
        IF cardinality(held_queues) > 0 OR cardinality(held_types) > 0 THEN
            reopen := now() + interval '1 second';  -- look again soon: it may be free then
        END IF;
    END IF;
""",
    ),
    (
        """    FOR k IN 1..n_t LOOP
        r := NULL;
""",
        """    FOR k IN 1..n_t LOOP
        IF t_names[k] = ANY(held_types) THEN
            -- its limiter row is held: none of its jobs is started by this claim
            t_room := t_room || 0;
            t_held := t_held || false;
            full_types := full_types || t_names[k];
            CONTINUE;
        END IF;
        r := NULL;
""",
    ),
    (
        """        CONTINUE WHEN p_queues[i] = ANY(paused);
""",
        """        CONTINUE WHEN p_queues[i] = ANY(paused);
        CONTINUE WHEN p_queues[i] = ANY(held_queues);  -- its limiter row is held
""",
    ),
)


def _previous():
    """0026's text of dbqueue_claim_within_limits()."""
    hardened = importlib.import_module("django_dbqueue.migrations.0026_hardened_functions")
    texts = {m.group(1): m.group(0) for m in _FUNCTION.finditer(hardened.CLAIM_LIMITED)}
    return texts["dbqueue_claim_within_limits"]


def _claim_within_limits():
    text = _previous()
    for old, new in _CHANGES:
        if text.count(old) != 1:
            raise RuntimeError(f"migration 0028: 0026's claim text changed near {old!r}")
        text = text.replace(old, new)
    return text


CLAIM_WITHIN_LIMITS = _claim_within_limits()

# The schema of dbqueue_job, as this connection finds the table (0026's TABLES_SCHEMA).
TABLES_SCHEMA = """
SELECT pg_catalog.quote_ident(n.nspname)
FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
WHERE c.oid = pg_catalog.to_regclass('dbqueue_job')
"""


def _install(schema_editor, text):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(TABLES_SCHEMA)
        (quoted,) = cursor.fetchone()
        cursor.execute(text.replace("{schema}", quoted))


def skip_held_limiters(apps, schema_editor):
    """Install CLAIM_WITHIN_LIMITS, in the migration's transaction."""
    _install(schema_editor, CLAIM_WITHIN_LIMITS)


def wait_for_limiters(apps, schema_editor):
    """Install dbqueue_claim_within_limits() as migration 0026 wrote it."""
    _install(schema_editor, _previous())


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0027_bounded_rows"),
    ]

    operations = [
        migrations.RunPython(skip_held_limiters, wait_for_limiters),
        # The worker registry's new state (presence.py): a worker restarting in place.
        migrations.RemoveConstraint(model_name="workerrecord", name="dbqueue_worker_state_valid"),
        migrations.AlterField(
            model_name="workerrecord",
            name="state",
            field=models.CharField(
                choices=[
                    ("running", "running"),
                    ("stopping", "stopping"),
                    ("restarting", "restarting"),
                ],
                max_length=10,
            ),
        ),
        migrations.AddConstraint(
            model_name="workerrecord",
            constraint=models.CheckConstraint(
                condition=models.Q(("state__in", ["running", "stopping", "restarting"])),
                name="dbqueue_worker_state_valid",
            ),
        ),
    ]
