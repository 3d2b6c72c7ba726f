"""The cost of a metrics scrape on a table of 1,000,000 jobs (issue 11).

Builds the rows with generate_series in a database of its own (``dbqueue_scrape_bench`` on
DATABASE_URL's server; ``--database`` picks another), then times the table gauges' statement
(``METRICS_SNAPSHOT``, store/metrics.py) cold (a fresh connection, first execution) and warm, and a scrape
served from the collector's cache (``METRICS_CACHE``), as 50 scrapes a minute would be.

    python benchmarks/scrape.py                 # 1,000,000 rows
    python benchmarks/scrape.py --rows 100000 --repeat 20
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import environ
import psycopg

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bench import DEFAULT_URL, ensure_database, libpq_params  # noqa: E402

# A table as a busy queue has it: most rows finished within the retention window, a backlog of
# due and scheduled jobs over three queues and a dozen types, some dead letters, a few running
# rows held by eight workers.
FILL = """
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts, lease_seconds,
    errors, created_at, started_at, finished_at, leased_until, worker_id
)
SELECT 'type-' || (g %% 12), (ARRAY['default', 'emails', 'reports'])[1 + g %% 3],
       '{}'::jsonb, s.state, 0,
       CASE WHEN s.state = 'pending' AND g %% 10 = 0 THEN now() + interval '1 hour'
            ELSE now() - (g %% 86400) * interval '1 second' END,
       CASE WHEN s.state = 'pending' THEN 0 ELSE 1 END, 10, 60, '[]'::jsonb,
       now() - (g %% 86400) * interval '1 second' - interval '2 seconds',
       CASE WHEN s.state <> 'pending' THEN now() - (g %% 86400) * interval '1 second' END,
       CASE WHEN s.state IN ('done', 'dead') THEN now() - (g %% 86400) * interval '1 second'
                                                 + interval '1 second' END,
       CASE WHEN s.state = 'running' THEN now() + interval '50 seconds' END,
       CASE WHEN s.state <> 'pending' THEN 'host:' || (g %% 8) || ':bench' END
FROM generate_series(1, %(n)s) AS g
CROSS JOIN LATERAL (SELECT CASE
    WHEN g %% 100 < 70 THEN 'done'
    WHEN g %% 100 < 97 THEN 'pending'
    WHEN g %% 100 < 99 THEN 'dead'
    WHEN g %% 1000 < 995 THEN 'done'
    ELSE 'running' END AS state) AS s
"""


def setup(db):
    from django.conf import settings

    settings.configure(
        DATABASES={"default": db},
        INSTALLED_APPS=["django_dbqueue"],
        USE_TZ=True,
        DBQUEUE={"QUEUES": {"default": {}, "emails": {}, "reports": {}}, "METRICS_CACHE": 10.0},
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", "django_dbqueue", verbosity=0)


def fill(params, n):
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute("TRUNCATE dbqueue_job RESTART IDENTITY")
        started = time.perf_counter()
        conn.execute(FILL, {"n": n})
        conn.execute("VACUUM ANALYZE dbqueue_job")
        counts = dict(conn.execute("SELECT state, count(*) FROM dbqueue_job GROUP BY 1").fetchall())
        print(f"filled {n:,} rows in {time.perf_counter() - started:.1f}s: {counts}")


def ms(values):
    return f"median {statistics.median(values):.2f} ms, max {max(values):.2f} ms"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--database", default="dbqueue_scrape_bench")
    parser.add_argument("--no-fill", action="store_true", help="reuse the rows already there")
    args = parser.parse_args(argv)
    db = environ.Env.db_url_config(os.environ.get("DATABASE_URL", DEFAULT_URL))
    db["NAME"] = args.database
    ensure_database(db, args.database)
    setup(db)
    params = libpq_params(db)
    if not args.no_fill:
        fill(params, args.rows)

    from django_dbqueue import metrics

    try:  # the store/ package (issue 26); against.py runs this script on older commits too
        from django_dbqueue.store import metrics as sql
    except ImportError:
        from django_dbqueue import sql

    cold, warm = [], []
    for _ in range(args.repeat):
        with psycopg.connect(**params, autocommit=True) as conn:
            started = time.perf_counter()
            rows = conn.execute(sql.METRICS_SNAPSHOT).fetchall()
            cold.append((time.perf_counter() - started) * 1000)
            for _ in range(3):
                started = time.perf_counter()
                conn.execute(sql.METRICS_SNAPSHOT).fetchall()
                warm.append((time.perf_counter() - started) * 1000)
    print(f"gauge statement, {len(rows)} rows out: new connection {ms(cold)}; reused {ms(warm)}")

    from prometheus_client import generate_latest

    metrics.install()
    metrics._table_collector = metrics.TableCollector(cache=10.0)
    registry = metrics.exposition_registry()
    started = time.perf_counter()
    generate_latest(registry)
    first = (time.perf_counter() - started) * 1000
    cached = []
    for _ in range(50):
        started = time.perf_counter()
        body = generate_latest(registry)
        cached.append((time.perf_counter() - started) * 1000)
    print(
        f"scrape: first {first:.2f} ms (runs the statement); next 50 within METRICS_CACHE "
        f"{ms(cached)}; statements run: {metrics._table_collector.queries}; "
        f"{len(body):,} bytes"
    )
    metrics._table_collector.close()


if __name__ == "__main__":
    main()
