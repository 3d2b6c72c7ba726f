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
# No SQL function is installed here. Migrating back drops the constraints; the repaired values
# stay as repaired.

import datetime

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
LIVE = "state IN ('pending', 'waiting', 'running')"

# One column's values out of bounds, replaced, each job's history told. {column}, {bad}: the
# test of a bad value, {fixed}: the value put in its place, {wanted}: what the column holds.
REPAIR_COLUMN = f"""
UPDATE dbqueue_job
SET {{column}} = {{fixed}},
    errors = errors || jsonb_build_array(jsonb_build_object(
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

# The constraints, in one statement (one pass over the table to validate them).
ADD_CONSTRAINTS = (
    "ALTER TABLE dbqueue_job\n"
    f"    ADD CONSTRAINT dbqueue_job_lease_bounded"
    f" CHECK (lease_seconds <= {MAX_SECONDS}::double precision),\n"
    + ",\n".join(
        f"    ADD CONSTRAINT dbqueue_job_{column}_range CHECK ("
        f"{column} >= '{TIMESTAMP_MIN}'::timestamptz AND {column} <= '{TIMESTAMP_MAX}'::timestamptz)"
        for column in TIMESTAMPS
    )
)
DROP_CONSTRAINTS = "ALTER TABLE dbqueue_job\n" + ",\n".join(
    f"    DROP CONSTRAINT dbqueue_job_{name}"
    for name in ["lease_bounded", *(f"{column}_range" for column in TIMESTAMPS)]
)


def _repairs():
    """(column, bad, fixed, wanted) of every repair."""
    for column in TIMESTAMPS:
        yield (
            column,
            f"NOT ({column} >= '{TIMESTAMP_MIN}'::timestamptz"
            f" AND {column} <= '{TIMESTAMP_MAX}'::timestamptz)",
            f"CASE WHEN {column} < '{TIMESTAMP_MIN}'::timestamptz"
            f" THEN '{TIMESTAMP_MIN}'::timestamptz ELSE '{TIMESTAMP_MAX}'::timestamptz END",
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
    return repaired


def repair(apps, schema_editor):
    """:func:`repair_rows`, in the migration's transaction, before the constraints."""
    with schema_editor.connection.cursor() as cursor:
        repair_rows(cursor)


def _range(column):
    return models.CheckConstraint(
        condition=models.Q(
            (f"{column}__gte", datetime.datetime(1, 1, 2, 0, 0, tzinfo=datetime.UTC)),
            (f"{column}__lte", datetime.datetime(9999, 12, 30, 0, 0, tzinfo=datetime.UTC)),
        ),
        name=f"dbqueue_job_{column}_range",
    )


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0026_hardened_functions"),
    ]

    operations = [
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
                    migrations.AddConstraint(model_name="backgroundjob", constraint=_range(c))
                    for c in TIMESTAMPS
                ),
            ],
        ),
    ]
