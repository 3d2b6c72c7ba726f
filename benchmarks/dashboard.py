"""The admin's queue dashboard on a table of 1,000,000 jobs (issue 11).

Fills ``dbqueue_dashboard_bench`` on DATABASE_URL's server (``--database`` picks another) with
generate_series: done, dead, pending and running jobs over the last 24 hours, over three queues
and a dozen types. Then renders the dashboard view (RequestFactory, the template included) for
1, 6 and 24 hours, first with no rollup (every count read from the job table, as on a fresh
install) and then after one rollup pass has counted the day (as with workers running), cold (a
new database connection) and warm.

    python benchmarks/dashboard.py                  # 1,000,000 rows
    python benchmarks/dashboard.py --rows 100000 --repeat 3
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

# 70% done, 27% pending (a tenth of it scheduled), 2% dead with 3 errors each, 0.5% running on
# eight workers; finished times spread over the last 24 hours, waits from 0 to 36 seconds.
FILL = """
INSERT INTO dbqueue_job (
    type, queue, payload, state, priority, run_after, attempts, max_attempts, lease_seconds,
    errors, created_at, started_at, finished_at, leased_until, worker_id
)
SELECT 'type-' || (g %% 12), (ARRAY['default', 'emails', 'reports'])[1 + g %% 3],
       '{}'::jsonb, s.state, 0,
       CASE WHEN s.state = 'pending' AND g %% 10 = 0 THEN now() + interval '1 hour'
            ELSE now() - (g %% 86400) * interval '1 second' - (g %% 37) * interval '1 second'
       END,
       CASE WHEN s.state = 'pending' THEN 0 WHEN s.state = 'dead' THEN 4 ELSE 1 END, 10, 60,
       CASE WHEN s.state = 'dead' THEN '[{"class": "E"}, {"class": "E"}, {"class": "E"}]'::jsonb
            ELSE '[]'::jsonb END,
       now() - (g %% 86400) * interval '1 second' - interval '40 seconds',
       CASE WHEN s.state <> 'pending' THEN now() - (g %% 86400) * interval '1 second' END,
       CASE WHEN s.state IN ('done', 'dead') THEN now() - (g %% 86400) * interval '1 second'
                                                 + interval '1 second' END,
       CASE WHEN s.state = 'running' THEN now() + interval '50 seconds' END,
       CASE WHEN s.state <> 'pending' THEN 'bench-host:' || (1000 + g %% 8) || ':beef00' END
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
        INSTALLED_APPS=[
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django_dbqueue",
        ],
        TEMPLATES=[
            {
                "BACKEND": "django.template.backends.django.DjangoTemplates",
                "APP_DIRS": True,
                "OPTIONS": {"context_processors": ["django.template.context_processors.request"]},
            }
        ],
        ROOT_URLCONF="benchmarks.dashboard",
        USE_TZ=True,
        SECRET_KEY="bench",
        DBQUEUE={"QUEUES": {"default": {}, "emails": {}, "reports": {}}},
    )
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def urls():
    from django.contrib import admin
    from django.urls import path

    return [path("admin/", admin.site.urls)]


def __getattr__(name):  # ROOT_URLCONF: urlpatterns, built once Django is set up
    if name == "urlpatterns":
        return urls()
    raise AttributeError(name)


def fill(params, n):
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute("TRUNCATE dbqueue_job, dbqueue_depth, dbqueue_finished RESTART IDENTITY")
        started = time.perf_counter()
        conn.execute(FILL, {"n": n})
        conn.execute("VACUUM ANALYZE dbqueue_job")
        counts = dict(conn.execute("SELECT state, count(*) FROM dbqueue_job GROUP BY 1").fetchall())
        print(f"filled {n:,} rows in {time.perf_counter() - started:.1f}s: {counts}")


class Operator:
    """A staff user with every permission, without a users table row."""

    is_active = is_staff = is_authenticated = is_superuser = True
    pk = id = 1
    username = "bench"

    def has_perm(self, perm, obj=None):
        return True

    def has_module_perms(self, app_label):
        return True

    def get_username(self):
        return self.username


def render(hours):
    from django.contrib import admin
    from django.test import RequestFactory

    from django_dbqueue.models import BackgroundJob

    request = RequestFactory().get(
        "/admin/django_dbqueue/backgroundjob/dashboard/", {"hours": hours}
    )
    request.user = Operator()
    started = time.perf_counter()
    response = admin.site._registry[BackgroundJob].dashboard_view(request)
    response.render()
    elapsed = (time.perf_counter() - started) * 1000
    assert response.status_code == 200 and b'class="dbq-chart"' in response.content
    return elapsed


def measure(label, repeat):
    from django.db import connection

    for hours in (1, 6, 24):
        cold, warm = [], []
        for _ in range(repeat):
            connection.close()
            cold.append(render(hours))
            warm.extend(render(hours) for _ in range(3))
        print(
            f"{label}, {hours:>2} h: cold median {statistics.median(cold):.0f} ms "
            f"(max {max(cold):.0f}); warm median {statistics.median(warm):.0f} ms "
            f"(max {max(warm):.0f})"
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--database", default="dbqueue_dashboard_bench")
    parser.add_argument("--no-fill", action="store_true", help="reuse the rows already there")
    args = parser.parse_args(argv)
    db = environ.Env.db_url_config(os.environ.get("DATABASE_URL", DEFAULT_URL))
    db["NAME"] = args.database
    ensure_database(db, args.database)
    setup(db)
    if not args.no_fill:
        fill(libpq_params(db), args.rows)

    measure("no rollup (job table only)", args.repeat)

    from django_dbqueue.rollup import Rollup

    started = time.perf_counter()
    counts = Rollup().run_once()
    print(
        f"first rollup pass (catches up 24 h): {(time.perf_counter() - started) * 1000:.0f} ms, "
        f"{counts}"
    )
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE dbqueue_finished")
    started = time.perf_counter()
    counts = Rollup().run_once()
    print(f"next pass in the same minute: {(time.perf_counter() - started) * 1000:.1f} ms")
    measure("with the rollup", args.repeat)


if __name__ == "__main__":
    main()
