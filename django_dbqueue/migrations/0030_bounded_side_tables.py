# The timestamps that migration 0027 left unbounded are bounded too (issue 35, the second hostile
# review: tests/integration/test_review2_doors.py, findings D, E, F). Every timestamp column of
# every dbqueue_* table (and every element of the one array of them) is now NULL or within
# validation.TIMESTAMP_MIN..MAX (0001-01-02 to 9999-12-30 UTC, inclusive), as 0027 holds
# dbqueue_job and the tables the scheduler, the metrics and the admin read
# (tests/integration/test_bounded_columns.py lists every such column of the database and checks
# that each has its constraint). Until now a plain UPDATE or INSERT could write 'infinity' or year
# 200000 into:
# - dbqueue_limiter.starts (a rate window's start times): store.flow's reopen time of the window
#   was then one psycopg cannot load, so the queues' admin page and jobqueue_status (text and
#   --json) failed for everyone; and such a start counted in its window for ever (with limit 1
#   the queue never ran again). And dbqueue_limiter.updated_at;
# - dbqueue_depth.minute and dbqueue_finished.minute (the dashboard's rollup): the dashboard
#   failed;
# - dbqueue_delivery.created_at and updated_at: the deliveries' list and page failed;
# - dbqueue_signal.created_at and dbqueue_step.finished_at (a job's page and jobqueue_status
#   --job read a step's time around such a value; now no reader has to).
#
# As in 0027 the constraints are added VALID, in one ALTER TABLE per table, after the rows that
# break them are repaired (NOT VALID would have failed the next UPDATE of an old bad row: the
# claim's UPDATE of a limiter row, for one). The repair loses no job, no delivery, no signal and no
# step:
# - a limiter's start out of bounds is removed from its window (the others kept, in their
#   order): it is no start that happened, and it only ever held the window shut;
# - a depth sample or a finished-jobs minute whose minute is out of bounds is deleted: a count
#   of no minute that the dashboard shows (it shows the last day), and two of them could not
#   both take the bound (one sample per queue and minute);
# - every other value out of bounds (limiter.updated_at, delivery.created_at and updated_at,
#   signal.created_at, step.finished_at) is replaced by the nearest bound (a time before the
#   minimum by the minimum, after the maximum or infinite by the maximum), the row kept.
# Migrating back drops the constraints; the repaired values stay as repaired.

import datetime

from django.db import migrations, models

TIMESTAMP_MIN = "0001-01-02 00:00:00+00"  # validation.TIMESTAMP_MIN
TIMESTAMP_MAX = "9999-12-30 00:00:00+00"  # validation.TIMESTAMP_MAX

# {table: (model, columns)} whose out-of-bounds values are replaced by the nearest bound.
CLAMPED = {
    "dbqueue_limiter": ("limiter", ("updated_at",)),
    "dbqueue_delivery": ("jobdelivery", ("created_at", "updated_at")),
    "dbqueue_signal": ("jobsignal", ("created_at",)),
    "dbqueue_step": ("jobstep", ("finished_at",)),
}
# {table: (model, column)} whose rows with a minute out of bounds are deleted.
SAMPLES = {
    "dbqueue_depth": ("depthsample", "minute"),
    "dbqueue_finished": ("finishedminute", "minute"),
}
# The array: each element within the bounds (an empty window passes; the column is NOT NULL).
STARTS_CHECK = (
    f"'{TIMESTAMP_MIN}'::timestamptz <= ALL (starts)"
    f" AND '{TIMESTAMP_MAX}'::timestamptz >= ALL (starts)"
)


def _in_bounds(column):
    return (
        f"{column} >= '{TIMESTAMP_MIN}'::timestamptz AND {column} <= '{TIMESTAMP_MAX}'::timestamptz"
    )


def _clamped(column):
    return (
        f"CASE WHEN {column} < '{TIMESTAMP_MIN}'::timestamptz"
        f" THEN '{TIMESTAMP_MIN}'::timestamptz ELSE '{TIMESTAMP_MAX}'::timestamptz END"
    )


# The statements run once, as the role that migrates; each operator and call is pg_catalog's by
# its exact types (migration 0026 says why).
REPAIR_STARTS = f"""
UPDATE dbqueue_limiter
SET starts = ARRAY(
    SELECT s FROM pg_catalog.unnest(starts) WITH ORDINALITY AS u(s, n)
    WHERE s >= '{TIMESTAMP_MIN}'::timestamptz AND s <= '{TIMESTAMP_MAX}'::timestamptz
    ORDER BY n
)::timestamptz[]
WHERE NOT ({STARTS_CHECK})
"""
DELETE_SAMPLES = "DELETE FROM {table} WHERE NOT ({bad})"
CLAMP_COLUMN = "UPDATE {table} SET {column} = {fixed} WHERE NOT ({bad})"


def repair_rows(cursor):
    """Remove the starts, delete the samples and clamp the values that the constraints refuse."""
    cursor.execute(REPAIR_STARTS)
    for table, (_model, column) in SAMPLES.items():
        cursor.execute(DELETE_SAMPLES.format(table=table, bad=_in_bounds(column)))
    for table, (_model, columns) in CLAMPED.items():
        for column in columns:
            cursor.execute(
                CLAMP_COLUMN.format(
                    table=table, column=column, fixed=_clamped(column), bad=_in_bounds(column)
                )
            )


def repair(apps, schema_editor):
    """:func:`repair_rows`, in the migration's transaction, before the constraints."""
    with schema_editor.connection.cursor() as cursor:
        repair_rows(cursor)


MODELS = {
    **{table: model for table, (model, _c) in CLAMPED.items()},
    **{table: model for table, (model, _c) in SAMPLES.items()},
}


def _columns():
    """(table, columns) of every scalar column bounded here."""
    tables = {table: list(columns) for table, (_m, columns) in CLAMPED.items()}
    for table, (_m, column) in SAMPLES.items():
        tables.setdefault(table, []).append(column)
    return tables


ADD_CONSTRAINTS = (
    "ALTER TABLE dbqueue_limiter\n"
    f"    ADD CONSTRAINT dbqueue_limiter_starts_range CHECK ({STARTS_CHECK}),\n"
    "    ADD CONSTRAINT dbqueue_limiter_updated_at_range CHECK ("
    + _in_bounds("updated_at")
    + ");\n"
    + "".join(
        f"ALTER TABLE {table}\n    "
        + ",\n    ".join(
            f"ADD CONSTRAINT {table}_{c}_range CHECK ({_in_bounds(c)})" for c in columns
        )
        + ";\n"
        for table, columns in _columns().items()
        if table != "dbqueue_limiter"
    )
)
DROP_CONSTRAINTS = (
    "ALTER TABLE dbqueue_limiter\n"
    "    DROP CONSTRAINT dbqueue_limiter_starts_range,\n"
    "    DROP CONSTRAINT dbqueue_limiter_updated_at_range;\n"
    + "".join(
        f"ALTER TABLE {table}\n    "
        + ",\n    ".join(f"DROP CONSTRAINT {table}_{c}_range" for c in columns)
        + ";\n"
        for table, columns in _columns().items()
        if table != "dbqueue_limiter"
    )
)


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
        ("django_dbqueue", "0029_door_keys"),
    ]

    operations = [
        migrations.RunPython(repair, migrations.RunPython.noop),
        # The models hold the scalar columns' constraints (models/bounds.py). The array's,
        # dbqueue_limiter_starts_range, is the database's alone: a CheckConstraint's Q cannot
        # say "every element" (only the limited claim's SQL writes the column, never a form).
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(ADD_CONSTRAINTS, DROP_CONSTRAINTS)],
            state_operations=[
                migrations.AddConstraint(model_name=MODELS[table], constraint=_range(table, c))
                for table, columns in _columns().items()
                for c in columns
            ],
        ),
    ]
