# The limited claim (dbqueue_claim_limited, migrations 0010 and 0011) returns one more column,
# ``keyed``: whether the job has a serial key, as sql.CLAIM_JOBS's batch says too. The end of a
# keyed job may make the next job of its key claimable, and no notification says so: the worker
# that ran it claims again (worker.Worker.finished). A function's result type cannot change in
# place, so this drops it and creates it again from 0011's text with the column added; the
# reverse puts 0011's function back.

import importlib

from django.db import migrations

_SERIAL = importlib.import_module("django_dbqueue.migrations.0011_unique_and_serial")

DROP = """
DROP FUNCTION IF EXISTS dbqueue_claim_limited(text[], int[], int, text, bigint, int[], int[],
    float8[], text[], text[], int[], int[], float8[], text[]);
"""

_EDITS = [
    # the claimed jobs
    (
        "j.created_at, EXTRACT(EPOCH FROM now() - j.run_after)::float8, j.traceparent::text;",
        "j.created_at, EXTRACT(EPOCH FROM now() - j.run_after)::float8, j.traceparent::text,\n"
        "              j.serial_key IS NOT NULL;",
    ),
    # the closing row that says what held the claim back
    (
        "            NULL::text;\n    END IF;\nEND",
        "            NULL::text, NULL::boolean;\n    END IF;\nEND",
    ),
]


def _keyed(text):
    head, tail = text.split(") RETURNS TABLE (", 1)
    columns, rest = tail.split(") LANGUAGE plpgsql", 1)
    assert columns.rstrip().endswith("traceparent text"), "0010's result columns moved"
    text = (
        head + ") RETURNS TABLE (" + columns.rstrip() + ", keyed boolean\n) LANGUAGE plpgsql" + rest
    )
    for old, new in _EDITS:
        assert text.count(old) == 1, f"0010's text moved: {old!r}"
        text = text.replace(old, new)
    return text


CLAIM_LIMITED_KEYED = DROP + _keyed(_SERIAL.CLAIM_LIMITED_SERIAL)
CLAIM_LIMITED_0011 = DROP + _SERIAL.CLAIM_LIMITED_SERIAL


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0012_cancel_running"),
    ]

    operations = [
        migrations.RunSQL(sql=CLAIM_LIMITED_KEYED, reverse_sql=CLAIM_LIMITED_0011),
    ]
