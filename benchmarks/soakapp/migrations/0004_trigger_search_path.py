"""The transition trigger names its own schema: it fires inside the package's SQL functions too.

Since django_dbqueue's migration 0026 every SQL function of the package runs with
``SET search_path = pg_catalog, pg_temp`` (a hostile caller must not shadow an operator), and a
trigger fired by a statement of such a function runs with that path. ``soak_log_transition()``
named ``soak_transition`` unqualified, so a job inserted by ``dbqueue_enqueue()`` (the soak's SQL
producer), or a state change made by any other hardened function, failed with
``relation "soak_transition" does not exist`` and was rolled back. The function now pins its own
path to pg_catalog and the schema its tables were made in (the migration's current_schema()), as
a trigger function of anybody's that a hardened function may fire must.
"""

from django.db import migrations

PIN = """
DO $do$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION %I.soak_log_transition() SET search_path = pg_catalog, %I, pg_temp',
        pg_catalog.current_schema(), pg_catalog.current_schema()
    );
END
$do$;
"""

UNPIN = """
DO $do$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION %I.soak_log_transition() RESET search_path', pg_catalog.current_schema()
    );
END
$do$;
"""


class Migration(migrations.Migration):
    dependencies = [("soakapp", "0003_waits")]

    operations = [migrations.RunSQL(PIN, UNPIN)]
