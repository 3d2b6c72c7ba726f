"""A hostile review of the dashboard around a job row whose error history is not what the worker
writes (a direct row write, as docs/admin.md's "Rows Python cannot read" has job rows written):
valid JSON, but not an array of attempt objects. The job pages answer around it; the dashboard
and the worker's per-minute rollup do not. Each finding is an xfail(strict=True) test.
"""

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.urls import reverse

from django_dbqueue import enqueue
from django_dbqueue.rollup import Rollup
from tests.utils import scalar

pytestmark = pytest.mark.django_db(transaction=True)

# The history of attempts, as a row written by hand may hold it: an object instead of the array,
# a plain string, and an attempt whose time reads like ISO 8601 but is no date.
HISTORIES = {
    "an object": """'{"class": "Boom", "message": "it broke"}'""",
    "a string": """'"it broke"'""",
    "a time that is no date": """'[{"attempt": 1, "at": "2026-13-45T99:99:99+00:00"}]'""",
}


@pytest.fixture(params=sorted(HISTORIES))
def running_job(request):
    """A running job (the rollup and the dashboard read every running job's history), written
    by hand with that history."""
    job_id = enqueue("noop").id
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_job SET state = 'running', attempts = 1, worker_id = 'w1', "
            "lease_token = 7, started_at = now(), leased_until = now() + interval '1 hour', "
            f"errors = {HISTORIES[request.param]}::jsonb WHERE id = %s",
            [job_id],
        )
    return job_id


def test_the_rollup_goes_on_around_a_history_it_cannot_read(running_job):
    """Finding 12a: the worker's per-minute rollup (store/dashboard.py ROLLUP_MINUTE, through
    FAILED_ATTEMPTS_SQL's jsonb_array_elements(j.errors) and its cast of 'at') failed every
    minute in every worker while one job's history was not an array of attempts: the
    dashboard's history stopped for the whole fleet."""
    Rollup().run_once()
    assert scalar("SELECT count(*) FROM dbqueue_depth WHERE minute = date_trunc('minute', now())")


def test_the_dashboard_answers_around_a_history_it_cannot_read(client, running_job):
    """Finding 12b: the dashboard answered 500 (store/dashboard.py DASHBOARD_FINISHED, the same
    FAILED_ATTEMPTS_SQL) while such a job was running or finished within its window."""
    client.force_login(User.objects.create_superuser("boss", password="pw"))
    client.raise_request_exception = False
    assert client.get(reverse("admin:django_dbqueue_dashboard")).status_code == 200
