"""A hostile review of django_dbqueue.testing (issue 36): what its docs promise and it does not
do. Each finding is an xfail(strict=True) test.
"""

import subprocess
import sys
import textwrap

import pytest
from django.db import connection

from django_dbqueue.testing import inline
from tests.utils import scalar

pytestmark = pytest.mark.django_db(transaction=True)


# -- finding 7: inline() does not see two of the three SQL enqueue functions ----------------------


@pytest.mark.parametrize(
    "statement",
    [
        """SELECT dbqueue_enqueue_many('[["echo", {"n": 1}]]'::jsonb)""",
        """SELECT dbqueue_debounce('echo', '{"n": 1}'::jsonb, 'review-inline')""",
    ],
    ids=["dbqueue_enqueue_many", "dbqueue_debounce"],
)
def test_inline_runs_what_every_sql_enqueue_function_enqueues(statement):
    """Finding 7: inline() runs the jobs of 'an enqueue of any kind' (docs/testing.md), but
    WRITES_JOBS matched 'dbqueue_enqueue(' only: a job enqueued by dbqueue_enqueue_many() or
    dbqueue_debounce() on the same connection was left pending."""
    # Autocommit: the statement commits at once, and its hook runs then.
    with inline() as mode, connection.cursor() as cursor:
        cursor.execute(statement)
    assert [run.type for run in mode.runs] == ["echo"]
    assert scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'pending'") == 0


def test_inline_runs_what_dbqueue_enqueue_enqueues():
    """What held: the function the pattern names."""
    with inline() as mode, connection.cursor() as cursor:
        cursor.execute("""SELECT dbqueue_enqueue('echo', '{"n": 1}'::jsonb)""")
    assert [run.type for run in mode.runs] == ["echo"]


# -- finding 8: the pytest plugin imports the whole package when pytest starts --------------------

LOADED_BY_PYTEST = """
import sys
import django_dbqueue.testing.pytest_plugin  # what the pytest11 entry point does at start
print(sorted(m for m in sys.modules if m.startswith(("django.db", "django_dbqueue.store"))))
"""


def test_the_pytest_plugin_imports_nothing_of_django_when_pytest_starts(tmp_path):
    """Finding 8: testing/pytest_plugin.py says 'Nothing is imported from Django or the package
    until a test asks for a fixture', but importing it imported django_dbqueue/__init__.py,
    hence the whole public API, django.db and the store, in every pytest run of every project
    that has the package installed. The package's names are now imported on first use."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LOADED_BY_PYTEST)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == "[]"
